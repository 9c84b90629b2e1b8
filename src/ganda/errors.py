"""User-facing errors: the CLI prints these as one line, without a traceback."""

import math
import os


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


def env_number(name: str, default: float | None, unit: str, *, low: float = 0, whole: bool = False) -> float | None:
    """The environment variable ``name`` as a number of ``unit`` of at least ``low`` (``whole``: an
    integer), ``default`` where it is unset or blank; any other value is one line naming it, so a
    typo in a setting stops the command instead of running it under another number."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        val = float(raw)
    except ValueError:
        val = math.nan
    if not (math.isfinite(val) and val >= low and (not whole or val == int(val))):
        raise GandaError(f"{name}={raw!r} is not {'a whole' if whole else 'a'} number of {unit} ({low:g} or more)")
    return int(val) if whole else val


#: the words an on/off setting or option value may take (any case)
TRUE_WORDS = ("true", "yes", "on", "1")
FALSE_WORDS = ("false", "no", "off", "0")


def env_switch(name: str, default: bool) -> bool:
    """The environment variable ``name`` as an on/off switch (:data:`TRUE_WORDS`,
    :data:`FALSE_WORDS`, any case), ``default`` where it is unset or blank; any other value is one
    line naming it, as :func:`env_number`'s are, so ``=TRUE`` and ``=off`` mean what they say."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if raw.lower() not in TRUE_WORDS + FALSE_WORDS:
        raise GandaError(f"{name}={raw!r} is not a switch (one of {', '.join(TRUE_WORDS + FALSE_WORDS)})")
    return raw.lower() in TRUE_WORDS


#: counts bounded above, by flag: each prompt set repeats the whole measurement
AT_MOST = {"--prompt-sets": 100}


def at_least(flag: str, value: int | None, low: int = 1) -> None:
    """A count option (``--limit``, ``--n``, ...) below ``low`` is an error, not an empty run;
    a count in :data:`AT_MOST` is also bounded above."""
    if value is not None and value < low:
        raise GandaError(f"{flag} must be at least {low}, got {value}")
    if value is not None and flag in AT_MOST and value > AT_MOST[flag]:
        raise GandaError(f"{flag} must be at most {AT_MOST[flag]} (each one repeats the whole measurement), got {value}")
