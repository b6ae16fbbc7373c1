"""A small byte-level BPE tokenizer trained locally on task text (no hub, no download).

    tokenizer = train_tokenizer(get_task("kk").tokenizer_corpus([2, 3], "plain"), vocab_size=1024)

``decode(encode(text)) == text`` for every string (no normaliser, no space clean-up), and the reasoning tags are
single added, non-special tokens that stay in the decoded text: the K&K reward reads them byte-exact. Unlike Qwen's
web-trained tokenizer it is trained on the task's text only; its special tokens and vocabulary sizes: docs/training.md
("Models")."""

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
    """Train a byte-level BPE tokenizer on ``texts`` and wrap it for ``transformers``.

    Args:
        texts: training text (any iterable; consumed once).
        vocab_size: total vocabulary size, special tokens and the four reasoning tags included. At least 256 + 8 (the
            byte alphabet and the eight added tokens). A corpus too small to yield enough merges gives a smaller
            vocabulary; ``len(tokenizer)`` is the real size.
        min_frequency: a pair is merged only if it occurs at least this often.
        model_max_length: the longest sequence the tokenizer reports as valid.

    Returns:
        A fast tokenizer with ``pad_token`` / ``eos_token`` set, ``padding_side="left"`` (for generation) and the chat
        turn tokens as extra special tokens. It has no BOS token: like Qwen, sequences start directly with text (the
        model config uses EOS as its BOS id)."""
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
