"""The lab's registrations: what the ``ganda.plugins`` entry point ``lab`` loads.

Everything is registered by name (``"module:Class"``), so loading the plugin imports nothing
heavy; a lab module is imported when its task, result kind or command is first used.
"""

from __future__ import annotations

from typing import Any

from ganda import registry

from . import shipped, shipped_path

TASKS = {
    "lab-knowledge": "ganda_lab.tasks:LabKnowledgeTask",
    "lab-mmlu": "ganda_lab.tasks:LabMMLUTask",
    "lab-letters": "ganda_lab.tasks:LabLettersTask",
    "lab-kv": "ganda_lab.tasks:LabKVTask",
}


def register() -> None:
    """Shipped checkpoints as model names, the four lab tasks, the ``lab_findings`` and ``lab_models`` result kinds."""
    registry.register_resolver("lab-", shipped_path, names=shipped, label="a shipped lab checkpoint")
    for name, target in TASKS.items():
        registry.register_task(name, target, number_option="pairs" if name == "lab-kv" else None)
    registry.register_result("lab_findings", "ganda_lab.programme:LabFindingsResult", writer="lab")
    registry.register_result("lab_models", "ganda_lab.programme:LabModelsResult", writer="lab")
    registry.register_run_file("prompt_sets.json", "lab")


def register_cli(app: Any) -> None:
    """``ganda train``, ``distill``, ``grow`` and ``lab``."""
    from .cli import register as register_commands  # typer and the commands load only with the CLI

    register_commands(app)
