"""Attribution (AtP / AtP*) against exact ablation on tiny real-architecture models.

Checked: the estimate equals the exact effect where the metric is linear in the head (a last-layer
head writing straight into the unembedding), is close on a nonlinear model, GradDrop equals a
brute-force one-pass-per-layer GradDrop and changes nothing where no later layer can cancel,
verification reproduces the exact sweep, SSM heads get gradients, and ``ganda rank --json``.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from checks import tiny_model
from torch import nn

import ganda
from ganda.attribution import (
    attribute,
    false_negative_bound,
    graddrop_blocks,
    margin_of,
    quality,
    rank_heads,
    spearman,
    upper_count,
)
from ganda.attribution.ranking import hypergeom_cdf
from ganda.cli import main
from ganda.effects import mean_margin
from ganda.errors import GandaError
from ganda.scoring import example_pairs, pad_rows
from ganda.sweep import run_sweep
from ganda.tasks.base import Example

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matmuls: see conftest.one_thread


class CharTok:
    pad_token_id = 0
    bos_token_id = None

    def __call__(self, text, add_special_tokens=False):
        return SimpleNamespace(input_ids=[1 + (ord(c) % 60) for c in text])


def llama(layers: int = 3, seed: int = 0, linear_top: bool = False, scale: float = 4.0) -> ganda.ModelAdapter:
    """A tiny random Llama (GQA). ``linear_top``: the last layer's MLP writes nothing and the final
    norm is the identity, so the logits are linear in the last layer's head outputs. ``scale``
    multiplies the layers' weight matrices (HF's init makes every effect tiny)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.model.layers.parameters():
            if p.ndim == 2:
                p.mul_(scale)
    if linear_top:
        with torch.no_grad():
            model.model.layers[-1].mlp.down_proj.weight.zero_()
            model.lm_head.weight.mul_(30.0)  # no final norm to scale the logits up
        model.model.norm = nn.Identity()
    return ganda.from_model(model, CharTok(), spec=f"tiny-llama-{layers}")


EXAMPLES = [
    Example(prompt="ab:13\ncd:57\nef:20\nkey cd is", choices=[" 13", " 57", " 20"], gold=1),
    Example(prompt="Q: which?\nA. x\nB. y\nAnswer:", choices=["A", "B"], gold=0),
    Example(prompt="The sky is ", choices=["blue", "green and wide", "red"], gold=0),
    Example(prompt="Tom beat Ann so _ won.", choices=["Tom", "Ann"], gold=0,
            meta={"contexts": ["Tom beat Ann so Tom", "Tom beat Ann so Ann"], "continuation": " won."}),
]
LETTERS = [Example(prompt=f"Q{i}: pick {c}\nA. a\nB. b\nC. c\nAnswer:", choices=["A", "B", "C"], gold=g)
           for i, (c, g) in enumerate([("a", 0), ("c", 2), ("b", 1), ("a", 0), ("c", 2)])]


def exact_drops(adapter, examples, margin="mean"):
    res = run_sweep(adapter, examples, progress=False)
    golds = [ex.gold for ex in examples]
    clean = mean_margin(res.baseline["loglik"], golds, margin)
    return clean, {r["head"]: clean - mean_margin(r["loglik"], golds, margin) for r in res.records}


def brute_atp(adapter, examples, drop: int | tuple[int, ...] | None = None) -> dict[str, float]:
    """Plain autograd through the whole model, one row per choice (the scorer's layout);
    ``drop``: the gradient through those layers' residual branches is cut (GradDrop's pass)."""
    heads = adapter.heads()
    out = dict.fromkeys((str(h) for h in heads), 0.0)
    layers = adapter.decoder_layers()
    for ex in examples:
        from ganda.scoring import encode_pair

        pairs = [encode_pair(adapter, c, t) for c, t in example_pairs(ex)]
        ids, mask = pad_rows(adapter, [c + t for c, t in pairs])
        zs, handles = {}, []
        for m in adapter.mixers():
            def hook(_mod, args, m=m, zs=zs):
                args[0].retain_grad()
                zs[m.layer, m.kind] = args[0]
            handles.append(adapter.register_out_proj_pre_hook(m, hook))
        def cut(_m, args, kwargs, output):
            h = args[0] if args else kwargs["hidden_states"]
            o = output[0] if isinstance(output, tuple) else output
            new = h + (o - h).detach()
            return (new, *output[1:]) if isinstance(output, tuple) else new
        for ell in () if drop is None else (drop,) if isinstance(drop, int) else drop:
            handles.append(layers[ell].register_forward_hook(cut, with_kwargs=True))
        try:
            with torch.enable_grad():
                logits = adapter.forward(ids, attention_mask=mask)
                lls = []
                for r, (c, t) in enumerate(pairs):
                    lp = torch.log_softmax(logits[r, len(c) - 1:len(c) + len(t) - 1].float(), -1)
                    lls.append(lp[torch.arange(len(t)), torch.tensor(t)].sum())
                margin_of(torch.stack(lls), ex.gold).backward()
        finally:
            for h in handles:
                h.remove()
        for h in heads:
            mx = adapter.mixer_of(h)
            z = zs[mx.layer, mx.kind]
            if z.grad is not None:
                sl = mx.head_slice(h.head)
                out[str(h)] += float((z[..., sl] * z.grad[..., sl]).sum().detach()) / len(examples)
    return out


# ---------------------------------------------------------------------------------------------


def test_linear_case_estimate_equals_exact():
    ad = llama(layers=2, linear_top=True)
    clean, exact = exact_drops(ad, LETTERS)
    for ablation in ("zero", "mean"):
        att = attribute(ad, LETTERS, method="atp", ablation=ablation, progress=False)
        assert att.clean == pytest.approx(clean, abs=1e-5)
        if ablation == "mean":
            res = rank_heads(ad, LETTERS, method="atp", ablation="mean", verify_top=8, active=0, audit=0, progress=False)
            exact = res.exact
        top = {str(h): e for h, e in zip(att.heads, att.atp, strict=True) if h.layer == 1}
        assert max(abs(v) for v in top.values()) > 0.01  # effects well above float noise (~1e-6)
        for h, est in top.items():
            assert est == pytest.approx(exact[h], abs=2e-5), (ablation, h)
        # the first layer's heads reach the logits through layer 1's attention: no longer exact
        first = [abs(e - exact[str(h)]) for h, e in zip(att.heads, att.atp, strict=True) if h.layer == 0]
        assert max(first) > 1e-4


def test_nonlinear_case_is_close():
    ad = llama(layers=3, seed=1, scale=1.0)
    _, exact = exact_drops(ad, EXAMPLES)
    att = attribute(ad, EXAMPLES, method="atp", progress=False)
    est = att.by_head()
    scale = max(abs(v) for v in exact.values())
    err = max(abs(est[h] - exact[h]) for h in exact)
    assert scale > 0.02
    # zero-ablation is not a small perturbation: first order is within 30% of the largest effect
    # here (measured 20%) and ranks the heads almost as the exact sweep does (measured 0.97)
    assert 1e-4 < err < 0.3 * scale
    assert spearman([est[h] for h in exact], [exact[h] for h in exact]) > 0.9


def test_engine_equals_brute_force_autograd_and_graddrop():
    ad = llama(layers=3, seed=2)
    att = attribute(ad, EXAMPLES, method="atp*", progress=False, batch_tokens=64)  # several batches
    atp = att.by_head() if att.graddrop is None else dict(zip([str(h) for h in att.heads], att.atp, strict=True))
    ref = brute_atp(ad, EXAMPLES)
    assert max(abs(atp[h] - ref[h]) for h in ref) < 1e-5
    dropped = [brute_atp(ad, EXAMPLES, drop=ell) for ell in range(3)]
    gd = dict(zip([str(h) for h in att.heads], att.graddrop, strict=True))
    for h in ref:
        want = sum(abs(d[h]) for d in dropped) / 2
        assert gd[h] == pytest.approx(want, abs=1e-5), h
    # GradDrop moved some estimate: this model has cancellation somewhere
    assert max(abs(gd[h] - abs(atp[h])) for h in ref) > 1e-3


def test_blocked_graddrop_equals_brute_force_over_blocks():
    ad = llama(layers=5, seed=2)
    assert graddrop_blocks(5, 2) == [0, 0, 0, 1, 1] and graddrop_blocks(5, None) == [0, 1, 2, 3, 4]
    assert graddrop_blocks(5, 9) == graddrop_blocks(5, None) and graddrop_blocks(5, 1) == [0] * 5
    att = attribute(ad, EXAMPLES, method="atp*", graddrop_blocks=2, progress=False)
    blocks = [(0, 1, 2), (3, 4)]
    dropped = [brute_atp(ad, EXAMPLES, drop=b) for b in blocks]
    gd = dict(zip([str(h) for h in att.heads], att.graddrop, strict=True))
    # two blocks: a head's score is |AtP with the other block dropped| (its own block's pass is 0)
    for h in gd:
        assert gd[h] == pytest.approx(sum(abs(d[h]) for d in dropped), abs=1e-5), h
    per_layer = attribute(ad, EXAMPLES, method="atp*", progress=False)
    assert max(abs(a - b) for a, b in zip(att.graddrop, per_layer.graddrop, strict=True)) > 1e-4  # blocks differ
    one = attribute(ad, EXAMPLES, method="atp*", graddrop_blocks=1, progress=False)
    assert one.graddrop == pytest.approx([abs(a) for a in one.atp], abs=1e-7)
    with pytest.raises(GandaError, match="graddrop_blocks"):
        attribute(ad, EXAMPLES, method="atp*", graddrop_blocks=0, progress=False)


def test_graddrop_changes_nothing_without_later_layers():
    one = llama(layers=1, seed=3)
    a, s = attribute(one, EXAMPLES, method="atp", progress=False), attribute(one, EXAMPLES, method="atp*", progress=False)
    assert s.estimate == pytest.approx(a.estimate, abs=1e-7)
    deep = llama(layers=3, seed=3)
    a, s = attribute(deep, EXAMPLES, method="atp", progress=False), attribute(deep, EXAMPLES, method="atp*", progress=False)
    last = [i for i, h in enumerate(a.heads) if h.layer == 2]
    assert [s.estimate[i] for i in last] == pytest.approx([a.estimate[i] for i in last], abs=1e-7)


def submodel(ad: ganda.ModelAdapter, keep: list[int]) -> ganda.ModelAdapter:
    """A copy of a tiny Llama with only the layers ``keep``, built by hand (what a layer edit runs)."""
    import copy

    sub = copy.deepcopy(ad.model)
    sub.model.layers = nn.ModuleList([sub.model.layers[i] for i in keep])
    for i, layer in enumerate(sub.model.layers):
        layer.self_attn.layer_idx = i
    sub.config.num_hidden_layers = len(keep)
    return ganda.from_model(sub, CharTok(), spec="sub")


@pytest.mark.parametrize("keep", [[1, 2], [0, 2]])
def test_a_ranking_under_a_layer_edit_is_the_submodels_own(keep):
    """Under a layer edit attribution walks the running layers (a layer's position in them is not
    its id): AtP*, its GradDrop blocks and the exact drops equal those of the same submodel built by
    hand, head for head, and a head of a removed layer is refused in one line."""
    from ganda.heads import HeadId

    ad = llama(3)
    want = rank_heads(submodel(ad, keep), LETTERS, method="atp*", graddrop_blocks=2, verify_top=3, active=0,
                      progress=False)
    rename = {f"L{i}H{h}": f"L{layer}H{h}" for i, layer in enumerate(keep) for h in range(4)}
    with ad.layer_edit(keep, "the submodel"):
        got = rank_heads(ad, LETTERS, method="atp*", graddrop_blocks=2, verify_top=3, active=0, progress=False)
        gone = ({0, 1, 2} - set(keep)).pop()
        with pytest.raises(GandaError, match=f"rank: layer {gone} is removed by the submodel"):
            rank_heads(ad, LETTERS, heads=[HeadId(gone, 0)], method="atp", progress=False)
    assert sorted(got.estimate) == sorted(rename[h] for h in want.estimate) and len(got.estimate) == 8
    for h, v in want.estimate.items():
        assert got.estimate[rename[h]] == pytest.approx(v, abs=1e-6), h
    assert sorted(got.exact) == sorted(rename[h] for h in want.exact)
    for h, v in want.exact.items():
        assert got.exact[rename[h]] == pytest.approx(v, abs=1e-5), h


def test_edges_under_a_layer_edit_are_the_submodels_own():
    """Edge attribution inside a layer edit joins the running layers' heads only (no default sender
    or receiver in a removed layer), and its estimates and exact checks are the hand-built submodel's."""
    from ganda.circuit.edges import rank_edges

    ad = llama(3)
    want = rank_edges(submodel(ad, [0, 2]), LETTERS, progress=False)
    with ad.layer_edit([0, 2], "the submodel"):
        got = rank_edges(ad, LETTERS, progress=False)
    rename = lambda e: e.replace("L1H", "L2H")  # noqa: E731 - the submodel's layer 1 is layer 2
    want_rows = {rename(r["edge"]): r for r in want.rows()}
    got_rows = {r["edge"]: r for r in got.rows()}
    assert sorted(got_rows) == sorted(want_rows) and len(got_rows) == 16  # 4 senders of layer 0 x 4 receivers
    for e, r in want_rows.items():
        assert got_rows[e]["estimate"] == pytest.approx(r["estimate"], abs=1e-6), e
        assert (got_rows[e]["exact"] is None) == (r["exact"] is None), e
        if r["exact"] is not None:
            assert got_rows[e]["exact"] == pytest.approx(r["exact"], abs=1e-5), e


def test_the_verification_files_give_the_rankings_intervals(tmp_path):
    """verify/results.csv and the ranking bootstrap with the ranking's seed: one head, one interval,
    whichever file a reader opens (on 12 prompts the seed moves the bounds, so a seed-0 file differs)."""
    import csv

    from ganda.stats import paired_intervals
    from ganda.sweep import load_result

    res = rank_heads(llama(layers=3, seed=4), EXAMPLES * 3, method="atp", verify_top=4, active=0, audit=0, seed=5,
                     out_dir=tmp_path, progress=False)
    rows = {r["head"]: r for r in csv.DictReader((tmp_path / "verify" / "results.csv").open()) if r["head"] != "none"}
    sw = load_result(tmp_path / "verify")
    assert set(rows) == set(res.intervals) and len(rows) == 4
    for h, cis in res.intervals.items():
        for mine, theirs in (("acc_drop", "drop"), ("exact", "margin_drop")):
            want = [cis[f"{mine}_ci_{e}"] for e in ("low", "high")]
            assert [float(rows[h][f"{theirs}_ci_{e}"]) for e in ("low", "high")] == pytest.approx(want, abs=1e-12)
            assert [sw.intervals()[h][f"{theirs}_ci_{e}"] for e in ("low", "high")] == pytest.approx(want, abs=1e-12)
    seed0 = paired_intervals(sw.per_prompt(sw.baseline, "margin"),
                             {r["head"]: sw.per_prompt(r, "margin") for r in sw.records}, "exact", 0)
    assert any(seed0[h] != pytest.approx({k: v for k, v in res.intervals[h].items() if k.startswith("exact")}, abs=1e-12)
               for h in seed0)


def test_verification_reproduces_the_exact_sweep(tmp_path):
    ad = llama(layers=3, seed=4)
    clean, exact = exact_drops(ad, EXAMPLES)
    res = rank_heads(ad, EXAMPLES, method="atp*", verify_top=4, active=0, audit=3, seed=1, out_dir=tmp_path, progress=False)
    assert len(res.verified) == 4 and len(res.audited) == 3 and len(res.exact) == 7
    assert res.clean == pytest.approx(clean, abs=1e-6)
    for h, v in res.exact.items():
        assert v == pytest.approx(exact[h], abs=1e-5)
    order = res.order()
    known = order[:7]
    assert sorted(known) == sorted(res.exact)
    assert [res.exact[h] for h in known] == sorted((res.exact[h] for h in known), reverse=True)
    rest = [res.estimate[h] for h in order[7:]]
    assert rest == sorted(rest, reverse=True)
    for f in ("ranking.json", "ranking.csv", "scatter.png", "attribution.jsonl", "verify/results.jsonl"):
        assert (tmp_path / f).exists(), f
    # every exactly known head's margin and accuracy drops with their paired intervals (seed 1), the
    # bootstrap paired_difference gives the verification's own per-prompt numbers; ranking.json keeps them
    import json

    from ganda.attribution.ranking import RankResult
    from ganda.stats import paired_difference
    from ganda.sweep import load_result

    sw = load_result(tmp_path / "verify")
    assert set(res.intervals) == set(res.exact)
    for r in sw.records:
        for metric, name in (("margin", "exact"), ("acc", "acc_drop")):
            want = paired_difference(sw.per_prompt(sw.baseline, metric), sw.per_prompt(r, metric), seed=1, name=name)
            assert [res.intervals[r["head"]][f"{name}_ci_{e}"] for e in ("low", "high")] == pytest.approx(
                [want[f"{name}_ci_low"], want[f"{name}_ci_high"]], abs=1e-9)
    back = RankResult.from_json(json.loads((tmp_path / "ranking.json").read_text())).intervals
    assert set(back) == set(res.intervals)
    for h, cis in back.items():  # every float of a JSON result file has RESULT_DIGITS significant digits
        assert cis == pytest.approx(res.intervals[h], rel=1e-5, abs=1e-9)
    header = (tmp_path / "ranking.csv").read_text().splitlines()[0].split(",")
    assert header[-4:] == ["exact_ci_low", "exact_ci_high", "acc_drop_ci_low", "acc_drop_ci_high"]
    # a second run resumes: nothing recomputed, same numbers
    again = rank_heads(ad, EXAMPLES, method="atp*", verify_top=4, active=0, audit=3, seed=1, out_dir=tmp_path, progress=False)
    assert again.exact == res.exact and again.estimate == res.estimate and again.intervals == res.intervals


def test_attribution_resumes_from_a_torn_file(tmp_path):
    ad = llama(layers=2, seed=5)
    full = attribute(ad, EXAMPLES, method="atp*", out_dir=tmp_path, batch_tokens=64, progress=False)
    path = tmp_path / "attribution.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    assert len(lines) >= 3  # header + several batches
    path.write_bytes(b"".join(lines[:2]) + lines[2][:10])  # one batch done, the next torn mid-line
    again = attribute(ad, EXAMPLES, method="atp*", out_dir=tmp_path, batch_tokens=64, progress=False)
    assert again.estimate == pytest.approx(full.estimate, abs=1e-7)
    assert len(path.read_bytes().splitlines()) == len(lines)


def test_attribution_resume_refuses_changed_weights(tmp_path):
    ad = llama(layers=2, seed=5)
    attribute(ad, EXAMPLES, method="atp", out_dir=tmp_path, batch_tokens=64, progress=False)
    with torch.no_grad():
        next(ad.model.parameters()).add_(1e-3)  # the same model object, other weights
    with pytest.raises(GandaError, match="the weights of tiny-llama-2 changed since this run started"):
        attribute(ad, EXAMPLES, method="atp", out_dir=tmp_path, batch_tokens=64, progress=False)
    attribute(ad, EXAMPLES, method="atp", out_dir=tmp_path / "b", batch_tokens=64, progress=False)
    with pytest.raises(GandaError, match=r"holds a different attribution \(graddrop_blocks, method differ\)"):
        attribute(ad, EXAMPLES, method="atp*", out_dir=tmp_path / "b", batch_tokens=64, progress=False)


@pytest.mark.parametrize("family", ["mamba2", "llamba", "bamba"])
def test_ssm_heads_get_gradients(family):

    ad = ganda.from_model(tiny_model(family), CharTok(),
                                                                             spec=family)
    exs = [Example(prompt="abc defg hij kl x", choices=[" a", " bq", " c"], gold=1),
           Example(prompt="zzz yy q", choices=[" k", " l", " mm"], gold=2)]
    att = attribute(ad, exs, method="atp", progress=False)
    ssm = [a for h, a in zip(att.heads, att.atp, strict=True) if ad.mixer_of(h).kind == "ssm"]
    assert ssm and all(abs(a) > 1e-6 for a in ssm)
    ref = brute_atp(ad, exs)
    got = dict(zip([str(h) for h in att.heads], att.atp, strict=True))
    assert max(abs(got[h] - ref[h]) for h in ref) < 1e-5


def test_bound_and_statistics():
    assert sum(hypergeom_cdf(x, 50, 7, 10) - hypergeom_cdf(x - 1, 50, 7, 10) for x in range(11)) == pytest.approx(1.0)
    # 0 of 10 audited heads above θ among 100: at 95% at most 24 (P(0 | F=24) = 0.055, P(0 | F=25) = 0.048)
    assert upper_count(0, 100, 10, 0.95) == 24
    assert upper_count(10, 100, 10, 0.95) == 100
    est = {"a": 3.0, "b": 2.0, "c": 0.5, "d": 0.1, "e": 0.05}
    exact = {"a": 3.1, "b": 1.0, "d": 0.3, "e": 0.01}
    b = false_negative_bound(est, exact, ["a", "b"], ["d", "e"], threshold=1.0)
    assert b.audit_above == [] and b.pool == 3 and b.ratio_max == pytest.approx(3.0)
    assert b.at_risk == ["c"]  # 0.5 x 3 >= 1; the audited heads are not listed
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    q = quality({"x": 5.0, "y": -4.0, "z": 0.1}, {"x": 1.0, "y": 0.2, "z": 2.0}, k=1, within=(1, 2))
    assert q["exact_top"] == ["z"] and q["recall_top1_in_1"] == 0.0 and q["recall_top1_in_2"] == 0.0
    assert math.isclose(mean_margin([[0.0, -1.0, -3.0]], [0], "mean"), 2.0)
    assert math.isclose(mean_margin([[0.0, -1.0, -3.0]], [0], "max"), 1.0)


def test_rank_json_and_bad_inputs(tiny_dir, tmp_path, capsys):
    rc = main(["rank", str(tiny_dir), "--task", "kv", "--pairs", "3", "--limit", "3", "--verify-top", "3", "--active", "0",
               "--audit", "2", "--out", str(tmp_path / "rank"), "--json"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    ranking = data["ranking"]
    assert len(ranking) == 12 and {r["head"] for r in ranking} == {f"L{i}H{j}" for i in range(3) for j in range(4)}
    cis = {"exact_ci_low", "exact_ci_high", "acc_drop_ci_low", "acc_drop_ci_high"}  # exactly known heads only
    assert all(set(r) == {"head", "estimate", "exact", "acc_drop"} | (cis if r["exact"] is not None else set())
               for r in ranking)
    assert data["metric"] == "margin" and data["margin"] == "mean"
    known = [r for r in ranking if r["exact"] is not None]
    assert len(known) == 5 and ranking[:5] == known and all(r["acc_drop"] is not None for r in known)
    assert all(r["exact_ci_low"] <= r["exact"] <= r["exact_ci_high"] for r in known)
    assert [r["exact"] for r in known] == sorted((r["exact"] for r in known), reverse=True)
    rest = [r["estimate"] for r in ranking[5:]]
    assert rest == sorted(rest, reverse=True)
    assert data["bound"]["pool"] == 9 and len(data["bound"]["audited"]) == 2
    # --graddrop-blocks 0: the per-layer form; its estimates differ from the 2-block run's, its exact numbers do not
    rc = main(["rank", str(tiny_dir), "--task", "kv", "--pairs", "3", "--limit", "3", "--verify-top", "3", "--active", "0",
               "--audit", "2", "--out", str(tmp_path / "rank0"), "--json", "--method", "atp*", "--graddrop-blocks", "2"])
    two = {r["head"]: r for r in json.loads(capsys.readouterr().out)["ranking"]}
    saved = json.loads((tmp_path / "rank0" / "ranking.json").read_text())["config"]
    assert saved["graddrop_blocks"] == 2 and saved["verify_top"] == 3 and saved["verify_layers"] == []
    rc = main(["rank", str(tiny_dir), "--task", "kv", "--pairs", "3", "--limit", "3", "--verify-top", "12", "--active", "0",
               "--audit", "0", "--out", str(tmp_path / "rank1"), "--json", "--method", "atp*", "--graddrop-blocks", "0"])
    per_layer = {r["head"]: r for r in json.loads(capsys.readouterr().out)["ranking"]}
    assert rc == 0 and any(abs(two[h]["estimate"] - per_layer[h]["estimate"]) > 1e-6 for h in two)
    assert all(abs(r["exact"] - per_layer[r["head"]]["exact"]) < 1e-6 for r in known)
    for argv, msg in ((["--method", "atpx"], "--method"), (["--verify-top", "-1"], "--verify-top"),
                      (["--ablation", "half"], "--ablation"), (["--task", "gsm8k"], "generation"),
                      (["--verify-layers", "0,x"], "--verify-layers"), (["--graddrop-blocks", "-1"], "--graddrop-blocks")):
        rc = main(["rank", str(tiny_dir), "--limit", "2", *argv])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and err[0].startswith("ganda: error:") and msg in err[0], (argv, err)


def test_verified_heads_with_the_estimates_opposite_sign_are_flagged(tmp_path):
    """On this tiny Llama, AtP gives L1H0 a small negative effect (-0.007) where ablating it lowers the
    margin by +0.019: the ranking lists it, its CSV row says so, and the report's headline counts it."""
    from ganda.attribution.ranking import sign_flip_sentence
    from ganda.experiments.head_effects import RankingResult

    ad = llama(layers=3, seed=1)
    _, exact = exact_drops(ad, EXAMPLES)
    res = rank_heads(ad, EXAMPLES, method="atp", verify_top=12, active=0, audit=0, out_dir=tmp_path, progress=False)
    flips = res.sign_flips()
    assert [f["head"] for f in flips] == ["L1H0"]
    f = flips[0]
    assert f["estimate"] < 0 < f["exact"] and f["exact"] == pytest.approx(exact["L1H0"], abs=1e-5)
    assert all(res.estimate[h] * res.exact[h] >= 0 for h in res.verified if h != "L1H0")
    saved = json.loads((tmp_path / "ranking.json").read_text())
    assert [g["head"] for g in saved["sign_flips"]] == ["L1H0"]  # written to 6 significant digits
    assert saved["sign_flips"][0]["estimate"] == pytest.approx(f["estimate"], rel=1e-5)
    assert saved["sign_flips"][0]["exact"] == pytest.approx(f["exact"], rel=1e-5)
    csv_rows = (tmp_path / "ranking.csv").read_text().splitlines()
    col = csv_rows[0].split(",").index("sign_flip")
    assert {r.split(",")[0] for r in csv_rows[1:] if r.split(",")[col] == "True"} == {"L1H0"}
    sentence = sign_flip_sentence(flips)
    assert sentence == f"1 verified head has the estimate's opposite sign: L1H0 (est {f['estimate']:+.3g}, exact {f['exact']:+.3g})"
    assert sentence in RankingResult.read(tmp_path).headline()
    assert sign_flip_sentence([]) == "" and rank_heads(ad, EXAMPLES, method="exact", progress=False).sign_flips() == []


def test_verify_layers_adds_every_head_of_those_layers():
    """``verify_layers`` verifies a layer's heads whatever their estimate, on top of the top K, with
    the sweep's exact numbers; the audit is drawn from the heads left."""
    ad = llama(layers=3, seed=4)
    _, exact = exact_drops(ad, EXAMPLES)
    res = rank_heads(ad, EXAMPLES, method="atp", verify_top=2, active=0, verify_layers=[0], audit=2, seed=0, progress=False)
    top2 = sorted(res.estimate, key=lambda h: (-abs(res.estimate[h]), h))[:2]
    layer0 = [str(h) for h in ad.heads() if h.layer == 0]
    assert res.verified[:2] == top2
    assert set(res.verified) == set(top2) | set(layer0)
    assert not set(res.audited) & set(res.verified) and len(res.audited) == 2
    for h in res.verified:
        assert res.exact[h] == pytest.approx(exact[h], abs=1e-5)
    with pytest.raises(GandaError, match=r"--verify-layers \[3\] outside the model.s layers 0..2"):
        rank_heads(ad, EXAMPLES, method="atp", verify_top=2, active=0, verify_layers=[3], progress=False)


def test_attribution_batches_fill_a_gpu_budget():
    """On a GPU a batch holds as many padded tokens as half the free memory allows (every layer's
    input, the cotangents, one layer's graph), between the CPU's 4,096 and 65,536; the CPU keeps 4,096."""
    from ganda.attribution import BATCH_TOKENS, batch_tokens_for, default_batch_tokens

    assert batch_tokens_for(32, 4096, 2, 6, None) == BATCH_TOKENS == 4096
    h100 = batch_tokens_for(32, 4096, 2, 6, 60e9)  # Llama-3.1-8B dims, 60 GB free
    per_token = 32 * 4096 * 2 + 7 * 4096 * 4 + 16 * 4096 * 2
    assert h100 == int(0.5 * 60e9 // per_token) and 4096 < h100 < 65536
    assert batch_tokens_for(32, 4096, 2, 6, 1e12) == 65536 and batch_tokens_for(32, 4096, 2, 6, 1e6) == 4096
    assert default_batch_tokens(llama(layers=2)) == 4096  # this CPU


@pytest.mark.parametrize("family", ["llama", "mamba2"])
def test_a_batch_that_runs_out_of_memory_runs_as_halves_with_the_same_numbers(family, monkeypatch):
    """A device out of memory on a batch of several prompts: the batch runs as two halves (down to
    one prompt), and AtP, GradDrop and the log-likelihoods are those of the whole batch; one prompt
    that does not fit is one line."""
    from ganda.attribution import engine

    adapter = llama(layers=3) if family == "llama" else ganda.from_model(tiny_model(family), CharTok(),
                                                                             spec=family)
    whole = attribute(adapter, EXAMPLES, method="atp*", progress=False)
    real, sizes = engine.AttributionEngine.run, []

    def run(self, batch):
        sizes.append(len(batch.items))
        if len(batch.items) > 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 448.00 MiB")
        return real(self, batch)

    monkeypatch.setattr(engine.AttributionEngine, "run", run)
    split = attribute(adapter, EXAMPLES, method="atp*", progress=False)
    assert sizes[0] == len(EXAMPLES) and sizes.count(1) == len(EXAMPLES)  # whole batch, then one prompt at a time
    assert torch.allclose(split.per_example, whole.per_example, atol=1e-5)
    assert split.estimate == pytest.approx(whole.estimate, abs=1e-5)
    for a, b in zip(split.clean_logliks, whole.clean_logliks, strict=True):
        assert a == pytest.approx(b, abs=1e-5)

    def none_fit(self, batch):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(engine.AttributionEngine, "run", none_fit)
    with pytest.raises(ganda.GandaError, match=r"one prompt \(\d+ tokens\) does not fit in the memory of cpu"):
        attribute(adapter, EXAMPLES, method="atp*", progress=False)


def test_widen_verifies_by_estimate_until_the_reported_top_holds(tmp_path):
    """``widen``: rounds of the next heads by estimate, each verified exactly (the sweep's numbers),
    until one round leaves the reported top unchanged; before the last round it had changed."""
    from ganda.attribution.ranking import reported_top

    ad = llama(layers=3, seed=4)
    _, exact = exact_drops(ad, EXAMPLES)
    res = rank_heads(ad, EXAMPLES, method="atp", verify_top=1, active=0, audit=0, top=3, widen=2, out_dir=tmp_path,
                     progress=False)
    by_est = sorted(res.estimate, key=lambda h: (-abs(res.estimate[h]), h))
    n = len(res.verified)
    assert res.verified == by_est[:n] and res.config["widened"] == n - 1 and n >= 5  # two rounds at least
    for h in res.verified:
        assert res.exact[h] == pytest.approx(exact[h], abs=1e-5)
    final = reported_top(res.exact, 3)
    if n < len(by_est):  # stopped because the last round changed nothing
        assert reported_top({h: res.exact[h] for h in by_est[: n - 2]}, 3) == final
    if n > 3:  # every earlier round changed the top
        assert reported_top({h: res.exact[h] for h in by_est[: n - 4]}, 3) != reported_top(
            {h: res.exact[h] for h in by_est[: n - 2]}, 3)
    assert set(res.order()[:3]) == final
    again = rank_heads(ad, EXAMPLES, method="atp", verify_top=1, active=0, audit=0, top=3, widen=2, out_dir=tmp_path,
                       progress=False)  # resumes round by round
    assert again.exact == res.exact and (tmp_path / "verify" / "widen-1").is_dir() == (n > 1)
    with pytest.raises(GandaError, match="widen"):
        rank_heads(ad, EXAMPLES, method="atp", widen=-1, progress=False)
