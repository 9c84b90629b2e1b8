"""A word-level tokenizer for the lab world, saved as an ordinary ``PreTrainedTokenizerFast``.

Pieces are ``\\n``, a word with its leading space (`` hill``) or without (``hill``), and single
punctuation characters (``:``, ``.``, ``?``, ``'``). So ``Answer:`` + `` A`` is ``Answer``, ``:``,
`` A`` and an option line ``A. red hill\\n`` ends in the ``\\n`` token that a Gather head writes its
summary into. Decoding concatenates the pieces, so ``decode(encode(text)) == text`` for any text
made of vocabulary words.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from .world import PUNCT, World

SPECIALS = ["<pad>", "<unk>", "<bos>", "<eos>"]
PATTERN = r"\n| ?[A-Za-z0-9]+| ?[^A-Za-z0-9\s]"


def build_vocab(world: World) -> dict[str, int]:
    toks = list(SPECIALS) + list(PUNCT) + [" " + p for p in PUNCT if p != "\n"]
    for w in world.words:
        toks += [w, " " + w]
    vocab: dict[str, int] = {}
    for t in toks:
        vocab.setdefault(t, len(vocab))
    return vocab


def build_tokenizer(world: World | None = None):
    """A ``PreTrainedTokenizerFast`` over the world's vocabulary."""
    world = world or World()
    tok = Tokenizer(models.WordLevel(vocab=build_vocab(world), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(PATTERN), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        clean_up_tokenization_spaces=False,
        model_max_length=512,
    )
