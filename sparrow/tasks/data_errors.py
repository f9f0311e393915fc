"""The error every data problem raises: a `ValueError`, so the CLIs print its one line, exit 2."""


class DataError(ValueError):
    """Unusable prompt data; the message names the file, split, column or key at fault."""
