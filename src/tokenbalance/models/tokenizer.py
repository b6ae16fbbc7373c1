"""A small byte-level BPE tokenizer trained locally on task text (no hub): ``decode(encode(text)) == text`` for every
string, the reasoning tags single non-special tokens kept in the decoded text (the K&K reward reads them).
docs/training.md ("Models").

    tokenizer = train_tokenizer(get_task("kk").tokenizer_corpus([2, 3], "plain"), vocab_size=1024)"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tokenbalance.checks import check_range

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|endoftext|>"
CHAT_TURN_TOKENS = ("<|im_start|>", "<|im_end|>")
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, *CHAT_TURN_TOKENS)  # ids 0..3, in this order
REASONING_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
DEFAULT_MODEL_MAX_LENGTH = 2048


def train_tokenizer(
    texts: Iterable[str],
    *,
    vocab_size: int = 1024,
    min_frequency: int = 2,
    model_max_length: int = DEFAULT_MODEL_MAX_LENGTH,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts`` (consumed once) for ``transformers``.

    ``vocab_size`` counts the special tokens and tags, at least 256 + 8 (a small corpus may give fewer:
    ``len(tokenizer)`` is the real size); ``min_frequency``: fewest occurrences of a merged pair. Returns a fast
    tokenizer with ``pad_token`` / ``eos_token``, ``padding_side="left"``, the chat turn tokens as extra special
    tokens and no BOS (the model uses EOS as its BOS id)."""
    byte_alphabet = pre_tokenizers.ByteLevel.alphabet()
    minimum = len(byte_alphabet) + len(SPECIAL_TOKENS) + len(REASONING_TAGS)
    check_range("vocab_size", vocab_size, minimum, integer=True)  # 256 bytes + 8 added tokens
    check_range("min_frequency", min_frequency, 1, integer=True)
    check_range("model_max_length", model_max_length, 1, integer=True)

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(REASONING_TAGS),  # the tags are added after training
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=byte_alphabet,
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    backend.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in REASONING_TAGS])

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        extra_special_tokens=list(CHAT_TURN_TOKENS),
        padding_side="left",
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    return tokenizer
