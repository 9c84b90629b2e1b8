"""``ganda report RUN_DIR...``: one self-contained HTML page from experiment run directories."""

from __future__ import annotations

from pathlib import Path

import typer

from .. import runio
from .options import FORCE, QUIET


def register(app: typer.Typer) -> None:
    @app.command(short_help="Render run directories into one offline HTML page")
    def report(
        run_dirs: list[Path] = typer.Argument(..., help="run directories (each with result.json, *.png, *.csv)"),
        out: Path = typer.Option(Path("report.html"), "--out", "-o", help="HTML file to write"),
        title: str = typer.Option("ganda report", "--title", help="page title"),
        force: bool = FORCE,
        quiet: bool = QUIET,
    ) -> None:
        """Render run directories into ONE offline HTML page (PNGs inlined, no external files)."""
        from ..report.html import write_report  # registers the result kinds it rebuilds
        from ..results import runs_in

        run_dirs = [r for d in run_dirs for r in runs_in(d)]
        reads = [p for d in run_dirs for p in Path(d).rglob("*") if p.is_file() and p.suffix != ".html"]
        runio.check_output_file(out, "--out", inputs=reads, kind="report", force=force)
        path = write_report(list(run_dirs), out, title=title)
        print(path)
