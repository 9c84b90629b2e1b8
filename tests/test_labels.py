"""The one head labeller (ganda.labels) and the scores it reads (ganda.patterns): constructed maps,
a tiny Llama with a built previous-token head and the lab models whose G&A heads are known (the real
models' scores are in test_labels_real.py)."""

from __future__ import annotations

import json

import pytest
import torch

import ganda
from ganda.experiments.heads import discover
from ganda.heads import expand
from ganda.labels import LABELS, MIN_SCORE, label_head, label_model, parts, role_of
from ganda.patterns import (
    AUTO,
    SUMMARY_TOKENS,
    HeadScore,
    choose_summary,
    pattern_scores,
    pattern_scores_by_summary,
    prompt_positions,
    reads_gold,
    repeated_tokens,
    standard_map_scores,
    standard_scores,
    summary_spans,
)
from ganda.tasks import get_task

L = 6  # tokens per copy in the constructed protocol maps (prefix: one <bos>)
T = 1 + 2 * L


def _previous_token(t: int = T) -> torch.Tensor:
    m = torch.zeros(t, t)
    m[0, 0] = 1.0
    for i in range(1, t):
        m[i, i - 1] = 1.0
    return m


def test_standard_scores_of_a_previous_token_map():
    s = standard_map_scores(_previous_token(), prefix=1, length=L)
    assert s["previous_token"] == pytest.approx(1.0)
    assert s["sink"] == pytest.approx(1 / (T - 1))  # only row 1's previous token is the first token
    assert s["induction"] == pytest.approx(0.0)  # rows of the second copy read i - 1, not i - L + 1
    lab = label_head("L0H0", **s)
    assert lab.label == "previous-token" and lab.roles == ["previous-token"]


def test_standard_scores_of_an_induction_map():
    m = torch.eye(T)  # rows with no earlier occurrence read themselves
    for i in range(1 + L, T):
        m[i] = 0.0
        m[i, i - L + 1] = 1.0  # the token after the earlier occurrence of x_i
    s = standard_map_scores(m, prefix=1, length=L)
    assert s["induction"] == pytest.approx(1.0) and s["induction_sink"] == pytest.approx(0.0)
    assert s["sink"] == pytest.approx(0.0) and s["previous_token"] == pytest.approx(0.0)
    lab = label_head("L1H0", **s)
    assert lab.label == "induction" and "induction score 1.000" in lab.reason


def test_a_head_gets_every_role_it_meets():
    """An induction head that parks the rest of its rows on <bos> is induction *and* sink."""
    m = torch.zeros(T, T)
    m[:, 0] = 1.0
    for i in range(1 + L, T):
        m[i, 0], m[i, i - L + 1] = 0.3, 0.7
    s = standard_map_scores(m, prefix=1, length=L)
    assert s["sink"] >= MIN_SCORE["sink"] and s["induction"] == pytest.approx(0.7)
    lab = label_head("L2H1", **s)
    assert lab.roles == ["induction", "sink"] and lab.label == "induction+sink"
    assert parts(lab.label) == ["induction", "sink"] and set(lab.roles) <= set(LABELS)
    assert role_of(lab.label) == "neither" and role_of("Gather+sink") == "gather"


def test_roles_are_judged_off_the_first_token():
    """0.2 on the induction target with 0.6 on <bos> is half of what the head does elsewhere:
    induction; the same 0.2 beside no sink is not; crumbs beside a sink make no role."""
    assert label_head("L0H0", induction=0.2, induction_sink=0.6, sink=0.6).roles == ["induction", "sink"]
    assert label_head("L0H0", induction=0.2, induction_sink=0.0, sink=0.0).label == "none"
    crumbs = label_head("L0H0", induction=0.1, induction_sink=0.9, sink=0.9)  # 1.0 off the first token
    assert crumbs.roles == ["sink"]


def test_sink_map():
    m = torch.zeros(T, T)
    m[:, 0] = 0.8
    for i in range(T):
        m[i, i] += 0.2
    s = standard_map_scores(m, prefix=1, length=L)
    assert s["sink"] == pytest.approx(0.8)
    assert label_head("L0H1", **s).label == "sink"


def test_signed_implicit_maps_are_scored_by_their_magnitude():
    m = -_previous_token()  # an SSM head's implicit map may be negative
    assert standard_map_scores(m, prefix=1, length=L)["previous_token"] == pytest.approx(1.0)


def test_gather_and_aggregate_need_their_minimum_score():
    assert label_head("L2H0", aggregate=0.000215, gather=0.2).label == "none"
    # a big ablation drop does not make a low pattern score Aggregate
    low = label_head("L2H0", aggregate=0.01, ablation={"drop_all": 0.6, "drop_query": 0.6, "drop_context": 0.0})
    assert low.label == "none"
    assert label_head("L3H0", aggregate=0.2, gather=0.1).label == "Aggregate"
    assert label_head("L1H0", aggregate=0.0, gather=0.7).label == "Gather"
    # G&A and the task-free roles are listed together
    assert label_head("L3H0", aggregate=0.2, sink=0.9).label == "Aggregate+sink"


def test_gather_excludes_what_a_previous_token_pattern_gives_by_itself():
    # the summary rows put 0.8 on their previous token, and the head does so everywhere
    prev = label_head("L1H0", gather=0.9, gather_previous=0.8, previous_token=0.85)
    assert prev.label == "previous-token" and prev.scores["gather_evidence"] == pytest.approx(0.1)
    # the same share at the summary rows, but a head that reads its previous token nowhere else
    only_here = label_head("L1H0", gather=0.9, gather_previous=0.8, previous_token=0.05)
    assert only_here.label == "Gather" and only_here.scores["gather_evidence"] == pytest.approx(0.85)
    # evidence that meets the minimum but not the head's previous-token score: not Gather
    beaten = label_head("L1H0", gather=0.7, gather_previous=0.0, previous_token=0.72)
    assert beaten.roles == ["previous-token"] and "not Gather: gather evidence 0.700 <= previous-token score 0.720" \
        in beaten.reason
    tie = label_head("L1H0", gather=0.4, gather_previous=0.0, previous_token=0.45)
    assert tie.label == "none" and "gather evidence 0.400 <= previous-token score 0.450" in tie.reason
    assert "< 0.25" not in tie.reason


def test_aggregate_needs_its_interval_above_zero():
    """The aggregate score is gold less the other summaries, 0 in expectation for a final row
    blind to which option is gold; a mean over the minimum whose interval reaches 0 is not
    Aggregate (lab-hybrid-late-7k5's L3H2 on 40 prompts: 0.063 [-0.068, 0.195]; 0.029 on 120)."""
    blind = label_head("L3H2", aggregate=0.063, aggregate_ci_low=-0.068)
    assert blind.label == "none"
    assert "not Aggregate: aggregate score 0.063's 95% interval over prompts reaches -0.068, not above 0" \
        in blind.reason and "aggregate 0.063 < 0.05" not in blind.reason
    reads = label_head("L3H0", aggregate=0.205, aggregate_ci_low=0.133)
    assert reads.label == "Aggregate" and "95% interval from 0.133" in reads.reason
    assert label_head("L3H0", aggregate=0.205).label == "Aggregate"  # no interval measured: the score decides
    # the other roles are kept, the reason says why Aggregate is not among them
    both = label_head("L1H0", aggregate=0.1, aggregate_ci_low=-0.01, gather=0.5, sink=0.6)
    assert both.roles == ["Gather", "sink"] and "not Aggregate" in both.reason


def _agg(head: str, aggregate: float, low: float | None) -> HeadScore:
    return HeadScore(head=head, layer=3, kind="softmax", aggregate=aggregate, aggregate_segment=0.0, gather=0.0,
                     aggregate_peak=1.0, aggregate_hit=0.0, gather_contrast=1.0, aggregate_ci_low=low)


def test_the_summary_token_is_one_a_head_reads_the_gold_on():
    """``auto`` chooses the candidate where a head's aggregate score meets the rule, interval
    included: a larger score whose interval reaches 0 does not choose, another head's does."""
    by = {"end": [_agg("L0H0", 0.01, -0.02)], "first+1": [_agg("L3H2", 0.063, -0.068)],
          "first+2": [_agg("L3H0", 0.06, 0.01), _agg("L3H1", 0.09, -0.02)]}
    chosen, best = choose_summary(by)
    assert chosen == "first+2" and best["first+2"]["head"] == "L3H0" and best["first+2"]["reads_gold"]
    assert best["first+1"] == {"head": "L3H2", "aggregate": 0.063, "aggregate_ci_low": -0.068,
                               "aggregate_ci_high": None, "reads_gold": False}
    del by["first+2"]
    assert choose_summary(by)[0] == "end"  # no head reads the gold anywhere: the paper's \n
    assert reads_gold(_agg("L3H0", 0.2, None)) and not reads_gold(_agg("L3H0", 0.04, 0.01))


def test_where_the_ablation_hurts_decides_between_two_qualifying_patterns():
    both = {"aggregate": 0.06, "gather": 0.9}  # gather is the larger multiple of its minimum
    assert label_head("L1H0", **both).roles == ["Gather", "Aggregate"]
    hurt_at_query = {"drop_all": 0.3, "drop_query": 0.3, "drop_context": 0.0}
    assert label_head("L1H0", **both, ablation=hurt_at_query).label == "Aggregate"
    # an ablation that does not hurt says nothing
    harmless = {"drop_all": 0.01, "drop_query": 0.01, "drop_context": 0.0}
    assert label_head("L1H0", **both, ablation=harmless).label == "Gather+Aggregate"
    # one qualifying pattern keeps its label; the reason says where the ablation hurts instead
    lab = label_head("L1H0", aggregate=0.2, ablation={"drop_all": 0.3, "drop_query": 0.0, "drop_context": 0.3})
    assert lab.label == "Aggregate" and "before the final position" in lab.reason


def test_the_causal_role_is_where_the_ablation_hurts():
    """``ganda roles``' causal role and rule 3 of the labels are one rule (ganda.labels)."""
    from ganda.labels import causal_role, where_it_hurts

    at_query = {"drop_all": 0.3, "drop_query": 0.3, "drop_context": 0.1}
    before = {"drop_all": 0.3, "drop_query": 0.1, "drop_context": 0.2}
    assert where_it_hurts(at_query) == causal_role(at_query) == "aggregate"
    assert where_it_hurts(before) == causal_role(before) == "gather"
    tie = {"drop_all": 0.3, "drop_query": 0.1, "drop_context": 0.1}
    assert causal_role(tie) == "gather"  # only a larger cost at the final position makes it Aggregate
    harmless = {"drop_all": 0.04, "drop_query": 0.04, "drop_context": 0.0}
    assert where_it_hurts(harmless) is None and causal_role(harmless) == "-"
    assert causal_role(harmless, min_drop=0.0) == "aggregate"
    assert causal_role(at_query, control_drop=0.2) == "knowledge"
    assert causal_role(at_query, control_drop=0.2, max_control_drop=0.25) == "aggregate"
    assert where_it_hurts({"drop_all": 0.3}) is None  # no positional ablation: the position says nothing
    both = {"aggregate": 0.06, "gather": 0.9}
    for drops in (at_query, before):
        assert role_of(label_head("L1H0", **both, ablation=drops).label) == causal_role(drops)


def test_summary_tokens_count_from_either_end():
    spans = [(10, 14), (15, 19), (20, 21)]
    assert summary_spans(spans, "end") == spans and summary_spans(spans, "last") == [(10, 13), (15, 18), (20, 20)]
    assert summary_spans(spans, "first+2") == [(10, 12), (15, 17), (20, 21)]  # a short segment keeps its end
    assert summary_spans(spans, "first") == [(10, 10), (15, 15), (20, 20)]
    with pytest.raises(ganda.GandaError, match="summary must be one of"):
        summary_spans(spans, "middle")


def _previous_token_llama(byte_tok):
    """A one-layer Llama whose head 0 reads the previous token at every position: its query and
    key are constant (zero weights, a bias), the key the query rotated by one position of RoPE's
    fastest frequencies, so ``q_i . k_j`` peaks at ``j = i - 1`` (scaled to a one-hot softmax)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from ganda import from_model

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(byte_tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096,
                      attention_bias=True, pad_token_id=0, eos_token_id=0, bos_token_id=None)
    model = LlamaForCausalLM(cfg).eval()
    attn, d = model.model.layers[0].self_attn, 8  # head_dim
    theta = cfg.rope_parameters["rope_theta"] if hasattr(cfg, "rope_parameters") else cfg.rope_theta
    q, k = torch.zeros(d), torch.zeros(d)
    for f in range(3):  # RoPE pairs dims (f, f + d/2) at frequency theta^(-2f/d)
        w = theta ** (-2 * f / d)
        q[f], q[f + d // 2] = 30.0, 0.0
        k[f], k[f + d // 2] = 30.0 * torch.cos(torch.tensor(w)), 30.0 * torch.sin(torch.tensor(w))
    with torch.no_grad():
        for proj, vec in ((attn.q_proj, q), (attn.k_proj, k)):
            proj.weight[:d].zero_()
            proj.bias.zero_()
            proj.bias[:d] = vec
    return from_model(model, byte_tok, spec="tiny-previous-token")


def test_a_pure_previous_token_head_is_not_called_gather(byte_tok):
    """The built head reads each summary's previous token, inside its segment: the gather score
    the paper's rule reads is high, and all of it is what a previous-token pattern gives."""
    a = _previous_token_llama(byte_tok)
    exs = get_task("kv", pairs=3).examples(limit=4, seed=0)
    std = standard_scores(a, batch=2)
    assert std["L0H0"]["previous_token"] > 0.99  # the construction works
    scores = pattern_scores(a, exs, progress=False, summary="end")
    labels = label_model(a, scores, standard=std)
    head = next(s for s in scores if s.head == "L0H0")
    assert head.gather > MIN_SCORE["gather"] * 2  # by the gather score alone it would be Gather
    assert head.gather_evidence < 0.01 and head.label == labels["L0H0"].label
    assert labels["L0H0"].roles == ["previous-token"]


def test_repeated_tokens_follow_the_protocol(tiny):
    seqs, prefix, length = repeated_tokens(tiny, batch=3, length=7, seed=1)
    assert len(seqs) == 3 and length == 7 and all(len(s) == prefix + 14 for s in seqs)
    special = set(tiny.require_tokenizer().all_special_ids)
    for s in seqs:
        body = s[prefix:]
        assert body[:7] == body[7:] and not special & set(body)
    assert repeated_tokens(tiny, batch=3, length=7, seed=1)[0] == seqs  # seeded
    assert repeated_tokens(tiny, batch=3, length=7, seed=2)[0] != seqs


def test_standard_scores_are_the_same_whatever_the_map_budget(tiny, monkeypatch):
    """Long sequences are scored a few heads at a time; the scores do not depend on how many."""
    import ganda.patterns as patterns

    whole = standard_scores(tiny, batch=2)
    monkeypatch.setattr(patterns, "MAP_BUDGET", 1)  # one head per pass
    one = standard_scores(tiny, batch=2)
    assert one.keys() == whole.keys() and len(one) == len(tiny.heads())
    for h in whole:
        for k in ("induction", "previous_token", "sink"):
            assert one[h][k] == pytest.approx(whole[h][k], abs=1e-6)
            assert 0.0 <= whole[h][k] <= 1.0 + 1e-6


# ---- the lab models, whose G&A heads are known by ablation ----------------------------------


@pytest.mark.usefixtures("lab_checkpoints")
def test_lab_llama_g_and_a_heads_are_labelled_by_pattern(tmp_path):
    """``ganda heads lab-llama-h1 --task lab-mmlu --limit 40``: the final rows read the gold
    option's first word (``A. cold port``: the token two after the letter), so that is the
    summary; there L3H0 reads the gold first word (Aggregate) and L2H0's first-word rows read
    their own option beyond what a previous-token pattern gives (Gather), the two heads ablation
    verifies (lab-mmlu 97% -> 29.5% / 28.5%)."""
    from ganda.cli import main

    assert main(["-q", "heads", "lab-llama-h1", "--task", "lab-mmlu", "--limit", "40", "--verify-n", "4",
                 "--top", "1", "--out", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["summary"]["summary_token"] == "first+2"
    choice = saved["summary"]["summary_choice"]["first+2"]  # L3H0 reads the gold first word, beyond noise
    assert choice["head"] == "L3H0" and choice["reads_gold"] and choice["aggregate_ci_low"] > 0.1
    labels = saved["summary"]["labels"]
    assert labels == {"L2H0": "Gather", "L3H0": "Aggregate"}
    by = {r["head"]: r for r in saved["all_heads"]}
    assert by["L3H0"]["aggregate"] > 0.15 and by["L2H0"]["gather_evidence"] > 0.28
    assert by["L2H0"]["previous_token"] < 0.1  # it reads its previous token only at the summary
    for r in by.values():  # every head's standard scores are in the result
        assert all(0.0 <= r[k] <= 1.0 for k in ("induction", "previous_token", "sink"))
    import csv

    rows = list(csv.DictReader((tmp_path / "heads.csv").open()))
    assert {"induction", "previous_token", "sink", "gather_evidence", "label"} <= set(rows[0])
    from ganda import results

    table = results.load(tmp_path).heads.set_index("head")
    assert table.loc["L2H0", "previous_token"] == pytest.approx(by["L2H0"]["previous_token"])
    assert table.loc["L3H0", "label"] == "Aggregate" and "induction" in table.columns
    from ganda.experiments.heads import HeadsResult

    head = HeadsResult.from_json(saved).headline()  # what the report opens with
    assert "Summary token: **first+2** (the token the final rows read: L3H0's aggregate score 0.205)" in head
    assert "Labels of 4 heads: 1 Gather, 1 Aggregate, 0 induction, 0 previous-token, 0 sink alone, 2 none" in head


@pytest.mark.usefixtures("lab_checkpoints")
def test_lab_hybrid_attention_aggregate_reads_the_question_not_the_options():
    """lab-hybrid-late-7k5's L3H3 is its Aggregate head by ablation (at the final position only:
    84% -> 38%), but its final row reads the question (``soba`` or the ``?`` in "What is the home
    of soba?", three quarters of it, n = 40) and otherwise the first option's letter, whichever
    option is gold: no candidate summary token gives it an aggregate score whose interval lies
    above 0, so it is not called Aggregate; nor is L3H2 (0.063 at the ``.``, interval reaching
    below 0), whose ablation costs nothing. No head reads the gold: the summary is the ``\\n``."""
    a = ganda.load_model("lab-hybrid-late-7k5", device="cpu", dtype=torch.float32)
    exs = get_task("lab-mmlu", adapter=a).examples(limit=40, seed=0)
    by = pattern_scores_by_summary(a, exs, progress=False, summaries=SUMMARY_TOKENS)
    for scores in by.values():
        l3h3 = next(x for x in scores if x.head == "L3H3")
        assert l3h3.aggregate < 0.01 and l3h3.aggregate_ci_low < 0 < l3h3.aggregate_ci_high
    read = l3h3.read
    assert read["outside"] > 0.7 and read["argmax_gold"] < 0.25  # its largest entry in the gold option: below chance
    chosen, best = choose_summary(by)
    assert chosen == "end" and not any(b["reads_gold"] for b in best.values())
    assert best["first+1"]["head"] == "L3H2" and best["first+1"]["aggregate"] > 0.05
    assert best["first+1"]["aggregate_ci_low"] < 0
    labels = label_model(a, by[chosen])
    assert not any(lab.has("Aggregate") for lab in labels.values())
    assert labels["L3H3"].label == "none" and labels["L3H2"].label == "none"
    # why no pattern can make it Aggregate: on every prompt its final row lies on tokens before the
    # first option's words (the question, then option A's letter and '.'), so in a causal model what
    # it writes there cannot depend on the options (measured: at least 0.987, 0.9987 on average)
    before = []
    for ex in exs:
        ids, spans, final = prompt_positions(a, ex)
        row = a.attention_maps(torch.tensor([ids]), expand("L3H3", a), rows=[final])
        row = next(iter(row.values()))[-1].abs().float()
        before.append(float(row[: spans[0][0] + 2].sum() / row.sum()))
    assert min(before) > 0.98 and sum(before) / len(before) > 0.995


@pytest.mark.usefixtures("lab_checkpoints")
def test_labels_of_a_real_lab_model():
    a = ganda.load_model("lab-llama-h1", device="cpu", dtype=torch.float32)
    exs = get_task("lab-mmlu", adapter=a).examples(limit=6, seed=0)
    scores = pattern_scores(a, exs, progress=False, summary=AUTO)
    labels = label_model(a, scores)
    assert sorted(labels) == sorted(str(h) for h in a.heads())
    for lab in labels.values():
        for k in ("sink", "previous_token", "induction"):
            assert 0.0 <= lab.scores[k] <= 1.0 + 1e-6
    # discover labels every head it scores with the same labeller
    d = discover(a, exs, exs[:4], top=2, progress=False)
    assert {s.head: s.label for s in d.scores} == {h: lab.label for h, lab in labels.items()}


@pytest.mark.usefixtures("lab_checkpoints")
def test_heads_and_roles_give_every_head_they_both_report_the_same_label(tmp_path):
    """``ganda heads`` ranks by pattern and ``ganda roles`` by ablation; on the same prompts both
    label a head alike (the summary token is chosen over every head in both)."""
    from ganda.cli import main

    common = ["lab-llama-h1", "--task", "lab-mmlu", "--limit", "8", "--seed", "0"]
    assert main(["-q", "heads", *common, "--verify-n", "4", "--top", "2", "--out", str(tmp_path / "h")]) == 0
    assert main(["-q", "roles", *common, "--top", "4", "--control", "none", "--max-heads", "1",
                 "--out", str(tmp_path / "r")]) == 0
    saved = json.loads((tmp_path / "h" / "result.json").read_text())
    heads = saved["all_heads"]
    assert saved["summary"]["labels"] == {h["head"]: h["label"] for h in heads if h["label"] != "none"}
    roles = json.loads((tmp_path / "r" / "result.json").read_text())["rows"]
    by_heads = {r["head"]: r["label"] for r in heads}
    by_roles = {r["head"]: r["label"] for r in roles}
    assert len(by_heads) == 4 and len(by_roles) == 4  # lab-llama-h1: 4 layers x 1 head
    assert by_roles == {h: by_heads[h] for h in by_roles}
    assert "Aggregate" in parts(by_heads["L3H0"])
    assert {r["role"] for r in roles} <= {"gather", "aggregate", "-", "knowledge"}


@pytest.mark.usefixtures("lab_checkpoints")
def test_ssm_heads_are_labelled_from_their_implicit_maps():
    """lab-mamba2-9k's SSM heads are scored on their exact implicit maps. No final row reads the
    gold option beyond noise, so the summary is the ``\\n``, where L0H5's rows read their own
    option (Gather). L3H6's aggregate score on these 8 prompts, 0.105, has an interval reaching
    far below 0 (on 40 prompts its score is -0.005): not Aggregate (docs/heads.md)."""
    a = ganda.load_model("lab-mamba2-9k", device="cpu", dtype=torch.float32)
    exs = get_task("lab-mmlu", adapter=a).examples(limit=8, seed=0)
    scores = pattern_scores(a, exs, progress=False, summary=AUTO)
    assert {s.summary for s in scores} == {"end"}
    labels = label_model(a, scores)
    assert "Gather" in labels["L0H5"].roles and labels["L3H6"].label == "none"
    l3h6 = next(x for x in scores if x.head == "L3H6")
    assert l3h6.aggregate > 0.1 and l3h6.aggregate_ci_low < -0.2 and "not Aggregate" in labels["L3H6"].reason
    for lab in labels.values():
        assert set(lab.roles) <= set(LABELS)
        if lab.has("Gather"):
            assert lab.scores["gather_evidence"] > max(lab.scores["previous_token"], MIN_SCORE["gather"] / 2)


@pytest.mark.usefixtures("lab_checkpoints")
def test_standard_scores_inside_a_layer_edit_are_the_submodels_own():
    """The standard scores' default heads are the running layers' (``heads(running=True)``): inside
    a layer edit that keeps layers 0 and 2 they are those of the same submodel built by hand."""
    import copy

    from ganda.patterns import standard_scores

    a = ganda.load_model("lab-llama", device="cpu", dtype=torch.float32)
    sub = copy.deepcopy(a.model)
    sub.model.layers = torch.nn.ModuleList([sub.model.layers[i] for i in (0, 2)])
    for i, layer in enumerate(sub.model.layers):
        layer.self_attn.layer_idx = i
    sub.config.num_hidden_layers = 2
    want = {k.replace("L1H", "L2H"): v for k, v in standard_scores(ganda.from_model(sub, a.tokenizer, spec="sub")).items()}
    with a.layer_edit([0, 2], "the submodel"):
        got = standard_scores(a)
    assert sorted(got) == sorted(want) and {k[:2] for k in got} == {"L0", "L2"}
    for head, scores in want.items():
        assert got[head] == pytest.approx(scores, abs=1e-6), head
