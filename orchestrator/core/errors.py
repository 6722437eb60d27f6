"""The one exception type for mistakes a user can fix.

The CLI turns a :class:`UserError` into one line on stderr and exit code 2; anything else is a
bug and keeps its traceback.
"""


class UserError(ValueError):
    """Bad input: a malformed file, an impossible request, a plan that does not fit."""
