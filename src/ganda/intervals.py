"""The one way ganda writes an interval: two numbers, ``<name>_ci_low`` and ``<name>_ci_high``
(``ci_low`` and ``ci_high`` in a record of one value), in every result file and table.

:func:`split` turns a record's pairs into that form, so every result (:class:`ganda.experiments.common.ExperimentResult`,
every CSV written by :func:`ganda.runio.write_csv`) holds it, and a file written in another form
(``<name>_ci95: [low, high]``, ``<name>_lo`` / ``<name>_hi``) reads back in it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def key(name: str, end: str) -> str:
    """``key("drop", "low")`` -> ``"drop_ci_low"``; ``key("", "high")`` -> ``"ci_high"``."""
    return f"{name}_ci_{end}" if name else f"ci_{end}"


def ci(pair: Sequence[float] | None, name: str = "") -> dict[str, float | None]:
    """``(low, high)`` (or None: no interval) as ``{<name>_ci_low, <name>_ci_high}``."""
    low, high = pair if pair is not None and len(pair) == 2 else (None, None)
    return {key(name, "low"): low, key(name, "high"): high}


def bounds(record: dict[str, Any], name: str = "") -> tuple[Any, Any]:
    """A record's interval ``name`` as ``(low, high)`` (None where it has none)."""
    return record.get(key(name, "low")), record.get(key(name, "high"))


def _pair_name(k: str, record: dict[str, Any]) -> str | None:
    """The interval name a key writes in another form (``x_ci95``, ``x_lo`` with its ``x_hi``), or None."""
    if k == "ci95" or k.endswith("_ci95"):
        return k[: -len("ci95")].rstrip("_")
    if (k == "lo" or k.endswith("_lo")) and k[: -len("lo")] + "hi" in record:
        return k[: -len("lo")].rstrip("_")
    return None


def split(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with every interval as two numbers (see the module docstring), in its place."""
    out: dict[str, Any] = {}
    for k, v in record.items():
        name = _pair_name(k, record) if isinstance(k, str) else None
        if name is None:
            if not (isinstance(k, str) and (k == "hi" or k.endswith("_hi")) and k[: -len("hi")] + "lo" in record):
                out[k] = v
        elif k.endswith("ci95"):
            out.update(ci(v if isinstance(v, list | tuple) else None, name))
        else:
            out.update(ci((v, record[k[: -len("lo")] + "hi"]), name))
    return out


def split_all(obj: Any) -> Any:
    """:func:`split` through every dict in nested dicts and lists."""
    if isinstance(obj, dict):
        return {k: split_all(v) for k, v in split(obj).items()}
    if isinstance(obj, list | tuple):
        return [split_all(v) for v in obj]
    return obj


__all__ = ["bounds", "ci", "key", "split", "split_all"]
