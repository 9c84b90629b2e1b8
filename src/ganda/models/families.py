"""Imports every family module so that each registers its adapter (order: generic last)."""

from __future__ import annotations

from .registry import register
from .transformer import TransformerAdapter

register(TransformerAdapter, first=False)

# SSM and hybrid families register themselves in their own modules; import them here.
for _name in ("ssm",):
    try:
        __import__(f"{__package__}.{_name}")
    except ModuleNotFoundError as exc:  # family not built yet
        if exc.name != f"{__package__}.{_name}":
            raise
