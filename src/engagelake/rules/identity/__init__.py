"""Identity rules: merge, identify, external ID rename/remove, aliases, delete, and lineage."""
