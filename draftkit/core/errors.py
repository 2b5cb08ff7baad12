"""The error every stage raises for bad input: the message names the problem and the fix.

The CLI prints these as one `error: ...` line (exit 2) instead of a traceback.
"""


class DraftkitError(Exception):
    """Bad input or state that the user can fix; the message says how."""


class TargetLoadError(DraftkitError, RuntimeError):
    """A target that cannot be loaded; the message says what to download or install."""
