"""User-facing errors: the CLI prints these as one line, without a traceback."""


class GandaError(Exception):
    """A problem with the user's input (path, model, head id, prompt length, ...)."""


def one_line(exc: BaseException, limit: int = 300) -> str:
    """What a library's exception says, in one line: its first line, or, when that line only
    introduces the reason (``Class validation error for validator 'x':``), the reason below it."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[0]
    if text.endswith(":") and len(lines) > 1:
        reason = lines[1]
        head, sep, rest = reason.partition(": ")
        text = rest if sep and head.endswith(("Error", "Exception")) and head.isidentifier() else reason
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: counts bounded above, by flag: each prompt set repeats the whole measurement
AT_MOST = {"--prompt-sets": 100}


def at_least(flag: str, value: int | None, low: int = 1) -> None:
    """A count option (``--limit``, ``--n``, ...) below ``low`` is an error, not an empty run;
    a count in :data:`AT_MOST` is also bounded above."""
    if value is not None and value < low:
        raise GandaError(f"{flag} must be at least {low}, got {value}")
    if value is not None and flag in AT_MOST and value > AT_MOST[flag]:
        raise GandaError(f"{flag} must be at most {AT_MOST[flag]} (each one repeats the whole measurement), got {value}")
