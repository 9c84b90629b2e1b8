"""The circuit: path ablation against brute-force forwards on every family, edge attribution against
finite differences of the exact path ablation, verification, the bound, the circuit view.

Path ablation is checked against references that run the model's own forward in the scorer's row
layout (one right-padded row per choice) with hooks, independently of the engine's layer replays:

* all paths, two forwards: the sender ablated everywhere gives the receiver's output; the intact
  forward with only the receiver's slice replaced by it gives the log-likelihoods;
* the direct path, three forwards: the intact one gives the sender's output and the receiver
  layer's input, a second the receiver's output on that input minus the sender's write, a third
  the log-likelihoods with it spliced in.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from checks import tiny_model
from test_attribution import EXAMPLES, CharTok, llama

import ganda
from ganda.attribution import attribute, margin_of
from ganda.attribution.engine import ACTIVE_EDGES
from ganda.circuit import INTACT, PathBatch, path_ablation
from ganda.circuit.ablation import EVERYWHERE, condition_name
from ganda.circuit.edges import edge_attribution, edge_positions, parse_edge, rank_edges
from ganda.engine import Trace
from ganda.errors import GandaError
from ganda.heads import HeadId
from ganda.interventions import AblateHeads, edit_for, head_mask, z_point
from ganda.models.components import residual_write_scale
from ganda.models.ssm.common import torch_path
from ganda.prepared import make_batch, plan_batches
from ganda.scoring import encode_pair, example_pairs, pad_rows, score_examples
from ganda.tasks.base import Example

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matmuls: see conftest.one_thread

SSM_EXAMPLES = [Example(prompt="abc defg hij kl x", choices=[" a", " bq", " c"], gold=1),
                Example(prompt="zzz yy q", choices=[" k", " l", " mm"], gold=2),
                Example(prompt="Q: pick b\nA. a\nB. b\nAnswer:", choices=["A", "B"], gold=1)]

# (family, sender, receiver): every mixer kind as sender and receiver, shared blocks, parallel hybrids
PAIRS = [
    ("llama", "L0H1", "L2H3"), ("llama", "L1H2", "L2H0"),
    ("mamba2", "L0H2", "L2H5"), ("mamba", "L0H3", "L2H7"), ("falcon_mamba", "L1H0", "L2H9"),
    ("llamba", "L0H1", "L2H2"),
    ("zamba2", "L0H2", "L3.attnH1"), ("zamba2", "L1.attnH0", "L4.ssmH3"),
    ("bamba", "L1H2", "L3H1"), ("bamba", "L0H1", "L2H6"),
    ("falcon_h1", "L0.attnH1", "L2.ssmH3"), ("falcon_h1", "L0.ssmH2", "L1.attnH0"),
    ("falcon_h1_nonorm", "L0.ssmH5", "L2.ssmH1"),
    ("jamba", "L0H5", "L3H1"), ("jamba", "L1H0", "L2H7"),
]

_MODELS: dict[str, ganda.ModelAdapter] = {}


def model(family: str) -> ganda.ModelAdapter:
    if family not in _MODELS:
        _MODELS[family] = llama(3) if family == "llama" else ganda.from_model(tiny_model(family), CharTok(), spec=family)
    return _MODELS[family]


def examples(family: str) -> list[Example]:
    return EXAMPLES if family == "llama" else SSM_EXAMPLES


def _forward_logliks(ad, ex, edit=None, capture=(), stop=None, resid=None) -> tuple[list[float], dict]:
    """The scorer's rows for ``ex`` through the model's own forward under hooks: (log-likelihoods, captured)."""
    pairs = [encode_pair(ad, c, t) for c, t in example_pairs(ex)]
    ids, mask = pad_rows(ad, [c + t for c, t in pairs])
    with torch.no_grad(), torch_path(ad.model), Trace(ad, capture, edit=edit or {}, stop=stop) as tr:
        logits = ad.forward(ids, attention_mask=mask)
    if stop is not None:
        return [], tr.values
    lls = []
    for r, (c, t) in enumerate(pairs):
        lp = torch.log_softmax(logits[r, len(c) - 1:len(c) + len(t) - 1].float(), -1)
        lls.append(float(lp[torch.arange(len(t)), torch.tensor(t)].sum()))
    return lls, tr.values


def _splice(mixer, head, z_new):
    sl = mixer.head_slice(head)

    def edit(x):
        x = x.clone()
        x[..., sl] = z_new[..., sl].to(x.dtype)
        return x
    return edit


def reference(ad, ex, s: HeadId, r: HeadId, paths: str) -> list[float]:
    rm = ad.mixer_of(r)
    rp = z_point(rm)
    if paths == "all":
        with AblateHeads([s]).apply(ad):
            _, got = _forward_logliks(ad, ex, capture=[rp])
        z_new = got[rp]
    else:
        sm = ad.mixer_of(s)
        _, got = _forward_logliks(ad, ex, capture=[z_point(sm), f"L{r.layer}.resid_in"])
        sl = sm.head_slice(s.head)
        write = residual_write_scale(ad, sm) * F.linear(got[z_point(sm)][..., sl], sm.out_proj.weight[:, sl])
        x_new = got[f"L{r.layer}.resid_in"] - write
        _, got = _forward_logliks(ad, ex, edit={f"L{r.layer}.resid_in": lambda h: x_new}, capture=[rp], stop=rp)
        z_new = got[rp]
    lls, _ = _forward_logliks(ad, ex, edit={rp: _splice(rm, r.head, z_new)})
    return lls


@pytest.mark.parametrize("paths", ["all", "direct"])
@pytest.mark.parametrize(("family", "sender", "receiver"), PAIRS)
def test_path_ablation_equals_brute_force_forwards(family, sender, receiver, paths):
    ad = model(family)
    s, r = ad.canonical(HeadId.parse(sender)), ad.canonical(HeadId.parse(receiver))
    if paths == "direct" and residual_write_scale(ad, ad.mixer_of(s)) is None:
        with pytest.raises(GandaError, match="does not write into the residual stream linearly"):
            path_ablation(ad, examples(family), s, r, paths=paths, progress=False)
        return
    exs = examples(family)
    res = path_ablation(ad, exs, s, r, paths=paths, progress=False)
    got = res.logliks[condition_name("together")]
    want = [reference(ad, ex, s, r, paths) for ex in exs]
    changed = max(abs(a - b) for g, i in zip(got, res.logliks[INTACT], strict=True) for a, b in zip(g, i, strict=True))
    err = max(abs(a - b) for g, w in zip(got, want, strict=True) for a, b in zip(g, w, strict=True))
    assert changed > 1e-5  # the ablation does something, so agreeing with the reference means something
    assert err < 1e-6 + 0.01 * changed, (family, sender, receiver, paths, err)


@pytest.mark.parametrize("family", ["llama", "mamba2", "bamba", "falcon_h1"])
def test_intact_and_everywhere_are_the_scorers(family):
    ad = model(family)
    exs = examples(family)
    s, r = ("L0H1", "L2H3") if family != "falcon_h1" else ("L0.ssmH1", "L2.attnH3")
    res = path_ablation(ad, exs, s, r, progress=False)
    with torch_path(ad.model):
        intact = [sc.loglik for sc in score_examples(ad, exs)]
        with AblateHeads([s]).apply(ad):
            every = [sc.loglik for sc in score_examples(ad, exs)]
    for cond, want in ((INTACT, intact), (EVERYWHERE, every)):
        err = max(abs(a - b) for g, w in zip(res.logliks[cond], want, strict=True) for a, b in zip(g, w, strict=True))
        assert err < 1e-4, (cond, err)


def _batch(ad, exs):
    plan, packed = plan_batches(ad, exs, 4096)
    return PathBatch(ad, make_batch(ad, plan[0], packed))


@pytest.mark.parametrize(("family", "sender", "receiver", "parts"), [
    ("llama", "L0H1", "L2H3", "q+k+v"), ("bamba", "L1H2", "L3H1", "q+k+v"),
    ("mamba2", "L0H2", "L2H5", "x+B+C+dt+gate"), ("llamba", "L0H1", "L2H2", "x+B+C+dt+gate"),
    ("falcon_h1", "L0.attnH1", "L2.ssmH3", "x+B+C+dt+gate"), ("zamba2", "L1.attnH0", "L4.ssmH3", "gate+x+B+C+dt"),
])
def test_every_part_at_once_is_together(family, sender, receiver, parts):
    ad = model(family)
    res = path_ablation(ad, examples(family), sender, receiver, parts=["together", parts, parts.split("+")[0]],
                        progress=False)
    both = zip(res.logliks[condition_name("together")], res.logliks[condition_name(parts)], strict=True)
    assert max(abs(a - b) for g, w in both for a, b in zip(g, w, strict=True)) < 1e-5
    one = zip(res.logliks[condition_name("together")], res.logliks[condition_name(parts.split("+")[0])], strict=True)
    assert max(abs(a - b) for g, w in one for a, b in zip(g, w, strict=True)) > 1e-5  # one part is not all of them


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


def test_query_key_value_parts_against_a_head_computed_by_hand():
    """Llama (GQA): the receiver's output with its query from the ablated stream and its key and
    value from the intact one (and each other combination) equals softmax(q kᵀ/√d) v by hand."""
    ad = model("llama")
    pb = _batch(ad, EXAMPLES)
    s, r = HeadId(0, 1), HeadId(2, 3)
    x_new = pb.ablated_inputs(s, "all", [2])[2]
    x_old = pb.input(2)
    block = ad.original_layers()[2]
    attn = block.self_attn
    hd, kv = attn.head_dim, r.head // 2
    cos, sin = ad.model.model.rotary_emb(x_old, pb.batch.position_ids)
    mixer = ad.mixer_of(r)
    for part, src in {"q": "noo", "k": "ono", "v": "oon", "q+v": "non"}.items():
        xs = {"n": block.input_layernorm(x_new), "o": block.input_layernorm(x_old)}
        q = F.linear(xs[src[0]], attn.q_proj.weight[r.head * hd:(r.head + 1) * hd])
        k = F.linear(xs[src[1]], attn.k_proj.weight[kv * hd:(kv + 1) * hd])
        v = F.linear(xs[src[2]], attn.v_proj.weight[kv * hd:(kv + 1) * hd])
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        scores = q @ k.transpose(-1, -2) * hd ** -0.5 + pb.batch.mask[:, 0]
        want = torch.softmax(scores, -1) @ v
        got = pb.receiver_z(2, x_new, mixer, part)[..., mixer.head_slice(r.head)]
        valid = pb.batch.valid
        assert (got - want)[valid].abs().max() < 1e-5, part
        assert (got - pb.z_of(r)[..., mixer.head_slice(r.head)])[valid].abs().max() > 1e-3


def test_llamba_x_part_against_its_implicit_attention():
    """Llamba: with only x from the ablated stream, the receiver's output is (M x' + D x') ⊙ silu(z)
    with M, D and the gate z of the intact input (materialised by ganda.models.ssm.materialize)."""
    from ganda.models.ssm.materialize import ssd_head_map

    ad = model("llamba")
    pb = _batch(ad, SSM_EXAMPLES)
    s, r = HeadId(0, 1), HeadId(2, 2)
    mixer = ad.mixer_of(r)
    x_new = pb.ablated_inputs(s, "all", [2])[2]
    got = pb.receiver_z(2, x_new, mixer, "x")[..., mixer.head_slice(r.head)]
    block = ad.original_layers()[2]
    for row in range(got.shape[0]):
        n = int(pb.batch.valid[row].sum())
        old = ad.ssm_params(mixer, block.mixer.in_proj(block.input_layernorm(pb.input(2)[row, :n])))
        new = ad.ssm_params(mixer, block.mixer.in_proj(block.input_layernorm(x_new[row, :n])))
        M = ssd_head_map(old, r.head)
        xh = new.x[:, r.head]
        y = M @ xh + old.D[r.head] * xh
        want = y * F.silu(old.z.reshape(n, -1, mixer.head_dim)[:, r.head])
        assert (got[row, :n] - want).abs().max() < 1e-4


def test_sender_write_is_what_the_residual_stream_gets():
    """The direct path's write c·W_O[:, S] z_S is the change of the residual stream after the
    sender's mixer when S is zeroed (the layer's MLP held at its intact output), on every family
    whose mixers write linearly, Falcon-H1's output multipliers included."""
    for family, head in [("llama", "L1H2"), ("mamba2", "L1H3"), ("llamba", "L0H1"), ("bamba", "L1H2"),
                         ("bamba", "L2H4"), ("falcon_h1", "L1.attnH2"), ("falcon_h1", "L1.ssmH6"), ("jamba", "L1H3"),
                         ("zamba2", "L2H3")]:
        ad = model(family)
        s = ad.canonical(HeadId.parse(head))
        pb = _batch(ad, examples(family))
        layer = ad.original_layers()[s.layer]
        mlp = next((getattr(layer, n) for n in ("mlp", "feed_forward") if hasattr(layer, n)), None)
        frozen: dict[str, object] = {}

        def keep(_m, _a, out, frozen=frozen):
            return frozen.setdefault("out", out)

        mixer = ad.mixer_of(s)
        edit = {z_point(mixer): edit_for(ad, mixer, head_mask(mixer, [s.head]))}
        handle = mlp.register_forward_hook(keep) if mlp is not None else None
        try:
            base, _ = pb.run_from(s.layer, pb.input(s.layer), stop=s.layer)  # the MLP's intact output is kept
            after, _ = pb.run_from(s.layer, pb.input(s.layer), edit, stop=s.layer)
        finally:
            if handle is not None:
                handle.remove()
        assert (base - after).abs().max() > 1e-4
        assert ((base - after) - pb.write(s))[pb.batch.valid].abs().max() < 1e-5, (family, head)


# ---------------------------------------------------------------------------------------------
# edge attribution


def reference_edge(ad, exs, s: HeadId, r: HeadId) -> float:
    """-d(mean margin)/dε where R alone reads x - ε·w_S, by autograd through two of the model's own
    forwards (the second with R's slice taken from the first): the exact first-order edge score."""
    sm, rm = ad.mixer_of(s), ad.mixer_of(r)
    rp = z_point(rm)
    total = 0.0
    for ex in exs:
        pairs = [encode_pair(ad, c, t) for c, t in example_pairs(ex)]
        ids, mask = pad_rows(ad, [c + t for c, t in pairs])
        _, got = _forward_logliks(ad, ex, capture=[z_point(sm)])
        sl = sm.head_slice(s.head)
        w = residual_write_scale(ad, sm) * F.linear(got[z_point(sm)][..., sl], sm.out_proj.weight[:, sl])
        eps = torch.zeros((), requires_grad=True)
        with torch.enable_grad(), torch_path(ad.model):
            with Trace(ad, [rp], edit={f"L{r.layer}.resid_in": lambda h, w=w, eps=eps: h - eps * w}, stop=rp,
                       detach=False) as tr:
                ad.forward(ids, attention_mask=mask)
            zr = tr[rp]
            with Trace(ad, edit={rp: _splice(rm, r.head, zr)}):
                logits = ad.forward(ids, attention_mask=mask)
            lls = []
            for i, (c, t) in enumerate(pairs):
                lp = torch.log_softmax(logits[i, len(c) - 1:len(c) + len(t) - 1].float(), -1)
                lls.append(lp[torch.arange(len(t)), torch.tensor(t)].sum())
            (g,) = torch.autograd.grad(margin_of(torch.stack(lls), ex.gold), [eps])
        total -= float(g)
    return total / len(exs)


@pytest.mark.parametrize("family", ["llama", "mamba2", "mamba", "llamba", "zamba2", "bamba", "falcon_h1", "jamba"])
def test_edge_scores_equal_autograd_through_the_model(family):
    """Every pair from one backward (receiver copies stacked along the batch) equals, for the
    largest edges and one small one, the derivative of the exact direct path ablation by autograd;
    the heads' AtP from the same backward is attribution's."""
    ad, exs = model(family), examples(family)
    es = edge_attribution(ad, exs, progress=False)
    by = es.by_edge()
    order = sorted(by, key=lambda e: -abs(by[e]))
    assert len(by) == sum(1 for s in es.senders for r in es.receivers if s.layer < r.layer)
    for name in [*order[:2], order[len(order) // 2]]:
        s, r = (ad.canonical(h) for h in parse_edge(name))
        want = reference_edge(ad, exs, s, r)
        assert abs(by[name] - want) < 1e-5 + 1e-4 * abs(want), (name, by[name], want)
    att = attribute(ad, exs, method="atp", progress=False)
    assert max(abs(es.atp[str(h)] - a) for h, a in zip(att.heads, att.atp, strict=True)) < 1e-5
    assert torch.isnan(es.scores[0, 0])  # a sender cannot feed a receiver of its own layer


@pytest.mark.parametrize("family", ["llama", "mamba2"])  # packed rows and one row per choice
def test_edge_activity_is_the_mean_of_each_prompts_absolute_score(family):
    """Activity is each prompt's own edge score, made positive, then averaged: the prompts' scores
    come from one batch, so a prompt's rows must be summed before the absolute value is taken."""
    ad, exs = model(family), examples(family)
    es = edge_attribution(ad, exs, progress=False)
    alone = [edge_attribution(ad, [ex], progress=False).scores for ex in exs]
    want = torch.stack(alone).abs().mean(0)
    valid = ~torch.isnan(es.scores)
    assert torch.allclose(es.activity[valid], want[valid], atol=1e-6, rtol=1e-4)
    assert torch.allclose(es.scores[valid], torch.stack(alone).mean(0)[valid], atol=1e-6, rtol=1e-4)
    assert bool((es.activity[valid] >= es.scores[valid].abs() - 1e-7).all())
    # some edge's prompts disagree in sign, so activity orders edges differently from |mean|
    assert bool((es.activity[valid] > es.scores[valid].abs() * 1.5 + 1e-6).any())


def test_zamba2_shared_attention_sends_nothing_directly():
    ad = model("zamba2")
    es = edge_attribution(ad, examples("zamba2"), receivers=[HeadId(4, 1, "ssm")], progress=False)
    assert all(ad.mixer_of(s).kind == "ssm" for s in es.senders) and len(es.senders) == 5 * 8
    with pytest.raises(GandaError, match="does not write into the residual stream linearly"):
        edge_attribution(ad, examples("zamba2"), senders=[HeadId(1, 0, "attn")], progress=False)


def test_verified_edges_are_the_path_ablation_and_resume(tmp_path, monkeypatch):
    ad, exs = model("llama"), EXAMPLES
    res = rank_edges(ad, exs, verify_top=3, active=0, audit=2, seed=1, out_dir=tmp_path, progress=False)
    assert len(res.verified) == 3 and len(res.audited) == 2 and res.bound is not None
    est = res.estimate
    assert [abs(est[e]) for e in res.verified] == sorted((abs(v) for v in est.values()), reverse=True)[:3]
    for e in res.verified[:2]:
        s, r = parse_edge(e)
        pa = path_ablation(ad, exs, s, r, paths="direct", progress=False)
        row = pa.rows()[2]
        assert res.exact[e] == pytest.approx(row["margin_drop"], abs=1e-6)
        assert res.exact_ci[e] == pytest.approx([row["margin_drop_ci_low"], row["margin_drop_ci_high"]], abs=1e-6)
    saved = json.loads((tmp_path / "edges.json").read_text())
    assert saved["verified"] == res.verified and saved["ranking"][0]["exact"] is not None
    assert sum(1 for _ in open(tmp_path / "edges.csv")) == len(est) + 1

    def boom(*_a, **_k):
        raise AssertionError("a finished edge was recomputed")

    monkeypatch.setattr(PathBatch, "ablate", boom)
    again = rank_edges(ad, exs, verify_top=3, active=0, audit=2, seed=1, out_dir=tmp_path, progress=False)
    assert again.exact == res.exact


def test_edges_verify_the_most_active_and_audit_only_the_rest(tmp_path):
    ad, exs = model("llama"), EXAMPLES
    res = rank_edges(ad, exs, verify_top=2, active=4, audit=3, seed=2, progress=False)
    est, act = res.estimate, res.scores.by_edge(res.scores.activity)
    top = sorted(est, key=lambda e: -abs(est[e]))[:2]
    busy = sorted(act, key=lambda e: -act[e])[:4]
    assert res.verified == top + [e for e in busy if e not in top]
    assert len(res.audited) == 3 and not set(res.audited) & set(res.verified)
    assert set(res.exact) == set(res.verified) | set(res.audited) and res.config["active"] == 4
    with pytest.raises(GandaError, match="active"):
        rank_edges(ad, exs, active=-1, progress=False)


def test_edges_widen_until_the_top_by_exact_holds(tmp_path):
    """``widen``: rounds of the next edges by |estimate|, each verified by the path ablation, until a
    round leaves the top ``top`` by |exact| unchanged; every earlier round had changed it."""
    ad, exs = model("llama"), EXAMPLES
    res = rank_edges(ad, exs, verify_top=1, active=0, audit=0, top=3, widen=1, out_dir=tmp_path, progress=False)
    order = sorted(res.estimate, key=lambda e: -abs(res.estimate[e]))
    n = len(res.verified)
    assert res.verified == order[:n] and res.config["widened"] == n - 1 >= 3

    def top3(names):
        return set(sorted(names, key=lambda e: -abs(res.exact[e]))[:3])

    if n < len(order):
        assert top3(order[: n - 1]) == top3(order[:n])
    for k in range(2, n):  # the rounds before the last moved the top
        assert top3(order[: k - 1]) != top3(order[:k])
    plain = rank_edges(ad, exs, verify_top=n, active=0, audit=0, top=3, progress=False)
    assert {e: plain.exact[e] for e in res.verified} == pytest.approx(res.exact, abs=1e-9)
    with pytest.raises(GandaError, match="widen"):
        rank_edges(ad, exs, widen=-1, progress=False)


def test_edge_positions_sum_to_the_edge_score():
    ad, exs = model("mamba2"), examples("mamba2")
    es = edge_attribution(ad, exs[:1], progress=False)
    by = es.by_edge()
    name = max(by, key=lambda e: abs(by[e]))
    per_pos = edge_positions(ad, exs[0], *(ad.canonical(h) for h in parse_edge(name)))
    assert sum(per_pos) == pytest.approx(by[name], rel=1e-4)
    assert max(abs(v) for v in per_pos) < 0.9 * sum(abs(v) for v in per_pos)  # spread over positions


# ---------------------------------------------------------------------------------------------
# commands, experiments, costs, report


def test_path_and_edges_from_the_command_line_run_plan_and_report(tmp_path, capsys):
    from ganda import plan as planner
    from ganda.cli import main
    from ganda.report.html import write_report

    assert main(["path", "lab-llama-h1", "--task", "lab-mmlu", "--limit", "12", "--from", "L2H0", "--to", "L3H0",
                 "--parts", "together,v", "--json", "--out", str(tmp_path / "p")]) == 0
    got = json.loads(capsys.readouterr().out)
    rows = {r["condition"]: r for r in got["rows"]}
    assert set(rows) == {"intact", "sender everywhere", "path (together)", "path (v)"}
    assert rows["path (together)"]["margin_drop"] > 1.0 and rows["intact"]["accuracy"] > 0.5
    assert {"result.json", "circuit_path.csv", "path.png"} <= {p.name for p in (tmp_path / "p").iterdir()}

    assert main(["run", "edges", "lab-llama-h1", "--task", "lab-mmlu", "--limit", "12", "--option", "verify_top=3", "--option", "active=0",
                 "--option", "audit=1", "--option", "show=1", "--out", str(tmp_path / "e")]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["edges"] == 6 and summary["verified"] == 3 and ">" in summary["top_edge"]
    files = {p.name for p in (tmp_path / "e").iterdir()}
    assert {"result.json", "edges.json", "edges.csv", "circuit.png", "attention.json", "edges_exact.jsonl"} <= files
    # the nodes' colours are the shared labeller's labels
    from ganda.experiments.roles import head_roles
    from ganda.labels import LABELS
    from ganda.tasks import get_task

    saved = json.loads((tmp_path / "e" / "result.json").read_text())
    labels = saved["roles"]
    assert labels and {r for v in labels.values() for r in v.split("+")} <= set(LABELS)
    # every head the table prints (the top 10 rows) is labelled, not only those circuit.png draws (show=1)
    printed = {h for r in saved["rows"][:10] for h in (r["sender"], r["receiver"])}
    assert len(printed) == 4 and printed <= set(labels)
    ad = ganda.load_model("lab-llama-h1")
    exs = get_task("lab-mmlu", adapter=ad).examples(limit=12, seed=0)  # the model's own world, as the CLI draws it
    rows = head_roles(ad, exs, ranked=sorted(labels), top=len(labels), until_chance=False, progress=False).rows
    assert labels == {r["head"]: r["label"] for r in rows}
    doc = json.loads((tmp_path / "e" / "attention.json").read_text())
    assert len(doc["prompts"][0]["marks"]) == 3 and "write moves" in doc["prompts"][0]["mark_label"]
    page = write_report([tmp_path / "p", tmp_path / "e"], tmp_path / "r.html").read_text()
    assert "The circuit: which head feeds which" in page and "One head&#39;s effect along its paths" in page
    top = summary["top_edge"].split(">")  # the view's data carries the marks of the top verified edge
    assert re.search(r'"marks":\[\d+,\d+,\d+\]', page) and f"where {top[0]}'s write moves {top[1]} most" in page

    prof = planner.profile(model("llama"))
    w = planner.Workload(n=16, tokens=60.0, choices=4, choice_tokens=2.0)
    edges = planner.plan(prof, "edges", w, "cpu", verify_top=10, audit=10)
    atp = planner.plan(prof, "attribution", w, "cpu", method="atp", verify_top=0, audit=0)
    assert edges.memory["kept"] > atp.memory["kept"] and edges.seconds > 0
    widened = planner.plan(prof, "edges", w, "cpu", verify_top=10, audit=10, widen=10)  # the first round of 10
    assert widened.flops == pytest.approx(edges.flops + (edges.flops - planner.plan(
        prof, "edges", w, "cpu", verify_top=0, audit=10).flops), rel=1e-9)
    n_edges = sum(q.heads * sum(o.heads for o in prof.layers[:k]) for k, q in enumerate(prof.layers))

    def checked(**kw: int) -> float:
        return planner.plan(prof, "edges", w, "cpu", **{"verify_top": 0, "audit": 0, "active": 0, **kw}).flops

    # the top by estimate and the most active are planned as the larger list; never more than every edge
    assert checked(verify_top=10, active=n_edges - 5) == pytest.approx(checked(verify_top=n_edges - 5), rel=1e-9)
    assert checked(active=n_edges - 5) < checked(active=n_edges + 50) == pytest.approx(checked(active=10 * n_edges))
    # the labels: two heads an edge of the longest of show, three and top (every head at the most),
    # three positional ablations a head besides the intact run and the pattern pass
    every = sum(layer.heads for layer in prof.layers)

    def labels(**kw: Any) -> tuple[list[str], float]:
        pl = planner.plan(prof, "edges", w, "cpu", verify_top=10, audit=10, **kw)
        return [ph["phase"] for ph in pl.phases if ph["phase"].startswith("labels of")], pl.flops

    no_roles = labels(roles=False)
    assert no_roles[0] == []
    for kw, heads in (({}, min(20, every)), ({"show": 1, "top": 1}, min(6, every))):
        names, flops = labels(**kw)
        assert names == [f"labels of about {heads} heads (three ablations each)"]
        assert flops - no_roles[1] == pytest.approx(planner.scoring_phase(prof, w, "x", 2 + 3 * heads, {}).flops(prof))
    # a phase that runs a share of its layers (the receiver copies) costs that share of the whole
    # layers' time, compute included: the share is taken once
    whole = planner.Phase("copies", 2, 16, 60.0, list(range(len(prof.layers))), 0, backward=2.0)
    share = planner.Phase("copies", 2, 16, 60.0, list(range(len(prof.layers))), 0, backward=2.0, part=0.3)
    dev = planner.device("cpu")
    assert share.seconds(prof, dev) == pytest.approx(0.3 * whole.seconds(prof, dev), rel=1e-12)
    assert share.flops(prof) == pytest.approx(0.3 * whole.flops(prof), rel=1e-12)
    path = planner.plan(prof, "path", w, "cpu", sender="L0H0", receiver="L2H1", parts="together,q")
    assert {"path", "edges"} <= set(planner.costed_experiments()) and path.flops < edges.flops

    # `ganda plan -e edges` plans ganda edges' own defaults (--verify-top 10 --audit 10), not rank's (--audit 0)
    def planned(*extra: str) -> float:
        assert main(["plan", "lab-llama-h1", "-e", "edges", "--task", "lab-mmlu", "-n", "12", "--device", "cpu",
                     "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)["flops"]

    assert planned() == planned("--verify-top", "10", "--audit", "10", "--active", str(ACTIVE_EDGES)) \
        > planned("--verify-top", "0", "--audit", "0", "--active", "0")  # lab-llama-h1: 6 edges, all checked


def test_viewer_keeps_and_remaps_the_marked_positions():
    from ganda.report.viewer import prompt_payload, sample_positions

    assert 40 in sample_positions(400, [], max_tokens=50, marks=[40])  # kept like a summary token
    rec = {"tokens": [f"t{i}" for i in range(400)], "rows": None, "segments": [[30, 41]], "gold_segment": 0,
           "heads": {"L3H0": {"kind": "softmax", "map": [[0.0] * 400 for _ in range(400)]}},
           "marks": [5, 40], "mark_label": "where L2H0's write moves L3H0 most"}
    p = prompt_payload(rec, max_tokens=60)
    assert [p["pos"][i] for i in p["marks"]] == [5, 40] and p["mark_label"].startswith("where L2H0")
    assert "marks" not in prompt_payload({**rec, "marks": []}, max_tokens=60)
