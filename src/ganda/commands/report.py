"""``ganda report RUN_DIR...``: one self-contained HTML page from experiment run directories."""

from __future__ import annotations

from pathlib import Path

import typer

from .. import runio
from ..errors import GandaError
from .options import FORCE, QUIET


def _runs(d: Path) -> list[Path]:
    """``d`` when it is a run, else the runs under it that ``ganda.results.load`` reads (a grid's
    jobs, a lab programme's prompt sets and steps); ``d`` itself when it holds none."""
    from ..report.html import has_results
    from ..results import run_dirs

    if has_results(d):
        return [d]
    return [r for r in run_dirs(d) if has_results(r)] or [d]


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
        from ..report.html import has_results, write_report  # registers the result kinds it rebuilds

        files = [str(d) for d in run_dirs if Path(d).is_file()]
        if files:
            raise GandaError(f"{', '.join(files)}: a file, not a run directory")
        missing = [str(d) for d in run_dirs if not Path(d).is_dir()]
        if missing:
            raise GandaError(f"not a run directory: {', '.join(missing)}")
        run_dirs = [r for d in run_dirs for r in _runs(Path(d))]
        empty = [str(d) for d in run_dirs if not has_results(d)]
        if empty:
            raise GandaError("not a run directory (no result.json, results.jsonl, ranking.json or a sweep's "
                             f"progress.jsonl): {', '.join(empty)}")
        if out.is_dir():
            raise GandaError(f"--out {out} is a directory; give the HTML file to write")
        reads = [p for d in run_dirs for p in Path(d).rglob("*") if p.is_file() and p.suffix != ".html"]
        runio.check_output_file(out, "--out", inputs=reads, kind="report", force=force)
        path = write_report(list(run_dirs), out, title=title)
        print(path)
