"""Value formats shared by the engine (Polars, Rust regex) and the reference model (Python re).

The patterns use the common subset of both regex dialects, so one constant serves both.
"""

EMAIL_RE = r"^[^@\s]+@[^@\s]+\.[^@\s]+$"
EMAIL_MAX = 255
PHONE_SEPARATORS_RE = r"[\s.\-()]"
PHONE_RE = r"^\+?[1-9][0-9]{7,14}$"
DOB_RE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
CURRENCY_RE = r"^[A-Z]{3}$"
# ISO 8601 with a fraction and an offset, or the `yyyy-MM-dd'T'HH:mm:ss:SSSZ` form
TIME_RE = (
    r"^([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2})"
    r"(\.[0-9]+|:[0-9]{3})?"
    r"(Z|[+-][0-9]{2}:?[0-9]{2})$"
)
TIMESTAMP_OUT = "%Y-%m-%dT%H:%M:%S%.3fZ"
MAX_ARRAY = 500
MAX_DEPTH = 50
MAX_NAME = 255
MAX_STRING = 255
PROPS_MAX_NESTED = 100 * 1024
PROPS_MAX_FLAT = 50 * 1024
