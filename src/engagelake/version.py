"""The package's version, in a module of its own: the store writes it into its log entries, and
importing it from the package (`engagelake/__init__.py`, which leads to the workspace) would
make an import circle."""

__version__ = "0.1.0"
