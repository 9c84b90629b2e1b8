"""Figures (matplotlib, Agg) and the self-contained HTML report."""

from .figures import attention_panels, bars, curves, heatmap
from .html import write_report

__all__ = ["attention_panels", "bars", "curves", "heatmap", "write_report"]
