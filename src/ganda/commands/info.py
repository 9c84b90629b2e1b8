"""``ganda info``: what a model looks like to ganda (family, layers, mixers, heads)."""

from __future__ import annotations

import json

import typer

from ..models import DEFAULT_MODEL, load_model


def register(app: typer.Typer) -> None:
    @app.command()
    def info(
        model: str = typer.Argument(DEFAULT_MODEL, help="alias, .gguf file or local HF directory"),
        allow_pickle: bool = typer.Option(False, help="allow *.bin/*.pt weights (runs pickle)"),
    ) -> None:
        """Print the model's layout as ganda sees it (JSON)."""
        adapter = load_model(model, allow_pickle=allow_pickle)
        print(json.dumps(adapter.describe(), indent=2))
