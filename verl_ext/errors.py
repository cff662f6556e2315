"""The exception for a user's mistake, shared by the CLIs and the libraries they call."""


class UserError(ValueError):
    """A mistake in what the user gave: a flag, an input file, a config value, a busy port.

    The message names the flag or file, the value and the fix. ``verl-ext`` prints it as one line
    and exits 2 instead of showing a traceback (``verl_ext.cli``). It is a ``ValueError``, so code
    that validates input can raise it where a ``ValueError`` is expected.
    """
