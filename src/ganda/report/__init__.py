"""The self-contained HTML report; its figures are drawn by :mod:`ganda.figures`."""

from .html import write_report

__all__ = ["write_report"]
