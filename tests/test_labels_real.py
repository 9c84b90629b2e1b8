"""The standard head scores and labels of both real models: every head's induction and
previous-token score against plain transformers (eager attention, the same protocol), and
SmolLM2-135M's labels. A file of its own so that xdist can deal it to one worker while the
labeller's fast tests run on the other."""

from __future__ import annotations

import pytest
import torch

from ganda.labels import label_model
from ganda.patterns import AUTO, STANDARD, pattern_scores, repeated_tokens, standard_scores
from ganda.tasks import get_task


def _plain_scores(model, seqs: list[list[int]], prefix: int, length: int) -> dict[str, dict[str, float]]:
    """Induction and previous-token scores from transformers' own eager attentions: the protocol
    written out with nothing of ganda's code."""
    out: dict[str, dict[str, float]] = {}
    for ids in seqs:
        with torch.no_grad():
            att = model(torch.tensor([ids]), output_attentions=True).attentions  # per layer [1, H, T, T]
        for layer, a in enumerate(att):
            a = a[0].float()
            t = a.shape[-1]
            for h in range(a.shape[0]):
                ind = sum(float(a[h, i, i - length + 1]) for i in range(prefix + length, prefix + 2 * length)) / length
                prev = sum(float(a[h, i, i - 1]) for i in range(1, t)) / (t - 1)
                d = out.setdefault(f"L{layer}H{h}", {"induction": 0.0, "previous_token": 0.0})
                d["induction"] += ind / len(seqs)
                d["previous_token"] += prev / len(seqs)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("alias", ["smollm2-135m", "gemma3-270m"])
def test_standard_scores_agree_with_plain_transformers(alias, request):
    """Every head's induction and previous-token score within 1e-4 of the same protocol computed
    from ``model(..., output_attentions=True)`` with eager attention, the model loaded again by
    transformers from the safetensors directory the GGUF was dequantised into (the same weights:
    test_hardening_models checks that copy against the GGUF; dequantising it again takes 40 s)."""
    from transformers import AutoModelForCausalLM

    from ganda.models.loading import gguf_cache_entry, resolve_alias

    a = request.getfixturevalue("smollm2" if alias.startswith("smollm2") else "gemma")  # one load per process
    seqs, prefix, length = repeated_tokens(a, batch=STANDARD["batch"])
    assert length == STANDARD["length"] and prefix == 1
    ours = standard_scores(a)
    where = gguf_cache_entry(resolve_alias(alias))  # written by the fixture's load, warm cache or not
    assert (where / "model.safetensors").is_file(), where
    plain_model = AutoModelForCausalLM.from_pretrained(str(where), dtype=torch.float32,
                                                       attn_implementation="eager").eval()
    plain = _plain_scores(plain_model, seqs, prefix, length)
    assert len(ours) == len(plain) == len(a.heads())
    worst = max(abs(ours[h][k] - plain[h][k]) for h in plain for k in ("induction", "previous_token"))
    assert worst < 1e-4, worst


@pytest.mark.slow
def test_smollm2_labels(smollm2):
    """SmolLM2-135M on 16 KV prompts (5 pairs; ``ganda heads smollm2-135m --task kv --pairs 5 -n 16``):
    its previous-token heads L16H0 and L11H1 are not called Gather; fewer than a fifth of its 270
    heads are sink alone; no head whose previous-token score exceeds its gather evidence is Gather."""
    exs = get_task("kv", pairs=5).examples(limit=16, seed=0)
    labels = label_model(smollm2, pattern_scores(smollm2, exs, progress=False, summary=AUTO))
    assert labels["L16H0"].roles == ["previous-token"] and labels["L11H1"].roles == ["previous-token"]
    assert "induction" in labels["L17H4"].roles and "induction" in labels["L18H6"].roles
    assert sum(lab.label == "sink" for lab in labels.values()) < len(labels) / 5
    for lab in labels.values():
        if lab.label == "Gather":
            assert lab.scores["previous_token"] < lab.scores["gather_evidence"]
