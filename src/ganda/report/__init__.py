"""The self-contained HTML report (and the figure primitives of :mod:`ganda.figures` it inlines)."""

from ..figures import attention_panels, bars, curves, heatmap
from .html import write_report

__all__ = ["attention_panels", "bars", "curves", "heatmap", "write_report"]
