"""``ganda attn``: the maps of chosen heads on one prompt (a task's example or a text): softmax
attention, or the exact implicit attention of an SSM head, drawn as one PNG with the maps beside
it as JSON (:func:`ganda.attention.draw_attention`). Registered as ``attn``, and as ``maps`` for
``ganda plan -e maps``, which costs the maps of every head of ``--map-layers``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import runio
from ..attention import draw_attention, sidecar
from ..errors import GandaError
from ..heads import require_heads
from ..models.base import ModelAdapter
from ..models.loading import model_inputs
from ..tasks import get_task, task_for_model
from .base import DirectExperiment, Options, PaperRun, option


@dataclass
class MapsOptions(Options):
    heads: str | None = option(None, "heads to draw, e.g. L16H22,L17H24 or L6.attnH3,L7.ssmH2", required=True)
    index: int = option(0, "which example of the task", short="-i", low=0)
    prompt: str | None = option(None, "draw this text instead of a task example")
    out: Path = option(Path("attention.png"), "PNG file", short="-o")
    rows: int | None = option(None, "draw only the last N query rows", low=1)
    # what ganda plan costs: every head of these layers (ganda attn draws the layers of --heads)
    map_layers: str | None = option(None, "layers whose every head is mapped (default: every layer)", hidden=True)

    def check(self) -> None:
        if self.heads is not None:  # ganda plan costs the maps without naming heads
            require_heads(self.flag("heads"), self.heads)
        if self.prompt is not None and not self.prompt.strip():
            raise GandaError(f"{self.flag('prompt')} is empty")
        if self.prompt is not None and self.changed("index"):
            raise GandaError(f"{self.flag('index')} picks a task example and {self.flag('prompt')} is a text of its "
                             "own: give one")


class Maps(DirectExperiment):
    """Draw attention maps (softmax, or exact SSM implicit attention) of heads on one prompt."""

    name = "attn"
    aliases = ("maps",)
    Options = MapsOptions
    phases = "ganda.plan:maps_phases"
    paper = (PaperRun("tiiuae/falcon-mamba-7b", {"tokens": 4096, "n": 1, "rows": 1},
                      "implicit maps at L=4,096: every channel of every layer, last row", "maps"),
             PaperRun("tiiuae/falcon-mamba-7b", {"tokens": 4096, "n": 1, "map_layers": "32"},
                      "implicit maps at L=4,096: every channel of one layer, full 4,096 x 4,096", "maps"))
    costed_options = ("rows", "map_layers")
    takes = frozenset({"force"})
    task_help = "the task whose example is drawn (kv, letters, mmlu, ...)"
    task_inputs = ("pairs", "shots", "seed")

    def check_run(self, options: MapsOptions, run: Any) -> None:  # type: ignore[override]
        if options.heads is None:
            raise GandaError(f"{options.flag('heads')} is required: head ids such as L16H22")
        if options.map_layers is not None:
            raise GandaError(f"{options.flag('map_layers')} is what ganda plan costs; ganda attn draws the layers of "
                             f"{options.flag('heads')}")
        task_options = {"pairs": run.pairs, "shots": run.shots}
        given = [f"--{k}" for k, v in task_options.items() if v is not None]
        if options.prompt is not None and given:
            raise GandaError(f"{given[0]} shapes a task example and {options.flag('prompt')} is a text of its own: "
                             "give one")
        self.task = get_task(run.task, **task_options) if options.prompt is None else None
        inputs = model_inputs(run.model)
        runio.check_output_file(options.out, "--out", inputs=inputs, kind="figure", force=run.force)
        self.side = sidecar(options.out)  # the maps as JSON, beside the figure (none beside a device)
        if self.side is not None:
            runio.check_output_file(self.side, "--out", inputs=inputs, kind="attention", force=run.force)

    def run_model(self, adapter: ModelAdapter, options: MapsOptions, run: Any) -> Any:  # type: ignore[override]
        prompt: Any = options.prompt
        if self.task is not None:
            task = task_for_model(run.task, self.task, adapter, pairs=run.pairs, shots=run.shots)
            exs = task.examples(limit=options.index + 1, seed=run.seed)
            if options.index >= len(exs):
                raise GandaError(f"--index {options.index}: task {run.task!r} has {len(exs)} examples "
                                 f"(0-{len(exs) - 1})")
            prompt = exs[options.index]  # a task example also saves its segments and gold segment beside the maps
        return draw_attention(adapter, prompt, options.heads, options.out, last_rows=options.rows)

    def job_summary(self, result: Any) -> dict[str, Any]:
        return {"figure": str(result), **({"maps": str(self.side)} if self.side is not None else {})}

    def show(self, result: Any, options: MapsOptions, run: Any, out_dir: Path | None) -> None:  # type: ignore[override]
        print(f"wrote {result}" + (f" and {self.side.name}" if self.side is not None else ""))


__all__ = ["Maps", "MapsOptions"]
