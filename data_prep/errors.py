"""The one exception type the CLI turns into a clear message and exit status 2 (bad input or arguments)."""


class PrepError(Exception):
    """Bad input the user must fix: the message names the file, row, column or argument and what to do."""
