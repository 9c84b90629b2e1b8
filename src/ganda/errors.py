"""User-facing errors: the CLI prints these as one line, without a traceback."""


class GandaError(Exception):
    """A problem with the user's input (path, model, head id, prompt length, ...)."""
