"""``ganda info``: what a model looks like to ganda (family, layers, mixers, heads)."""

from __future__ import annotations

import json

import typer

from .options import MODEL, PICKLE, QUIET


def register(app: typer.Typer) -> None:
    @app.command(short_help="Print the model's layout as ganda sees it")
    def info(
        model: str = MODEL,
        allow_pickle: bool = PICKLE,
        meta: bool = typer.Option(False, "--meta", help="build from the config alone on the meta device (no weights): "
                                  "a config.json, a model directory, a hub id or a shipped config such as "
                                  "meta-llama/Llama-3.1-8B"),
        dtype: str = typer.Option("bfloat16", "--meta-dtype", help="--meta: precision the weight bytes are counted in"),
        as_json: bool = typer.Option(False, "--json", help="one JSON object (n_params, n_layers, heads, mixers, ...)"),
        quiet: bool = QUIET,
    ) -> None:
        """Print the model's layout as ganda sees it: parameters, heads, and one line per group of
        identical layers (with --meta, the full-size layout from the config alone)."""
        from ..device import parse_dtype
        from ..models import load_model
        from ..models import meta as meta_models

        if meta:
            adapter = meta_models.build(model, parse_dtype(dtype, "--meta-dtype"))
        else:
            adapter = load_model(model, allow_pickle=allow_pickle)
        summary = meta_models.summary(adapter)
        print(json.dumps(summary, indent=2) if as_json else meta_models.summary_text(summary))
