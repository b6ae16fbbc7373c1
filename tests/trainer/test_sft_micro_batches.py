"""``sft.micro_batch_size``: the SFT's batch in pieces, gradients summed, the same loss and weights as the whole
batch up to float rounding; unset, the embedded policy's cache key is what it was."""

import dataclasses

import pytest
import torch

from tests.trainer.test_sft_checkpoint import SETTINGS, model_of, sft
from tokenbalance.config import RunConfig, apply_overrides
from tokenbalance.models import train_tokenizer
from tokenbalance.run.examples import sft_pairs
from tokenbalance.tasks.kk import tokenizer_corpus
from tokenbalance.trainer.embedded import embedded_key


@pytest.fixture(scope="module")
def setup():
    torch.set_num_threads(1)
    config = apply_overrides(RunConfig(), [*SETTINGS, "sft.batch_size=5"])  # micro-batches of 2: 2 + 2 + 1
    tokenizer = train_tokenizer(list(tokenizer_corpus(people=(2,), count=20, template="compact")))
    return config, tokenizer, sft_pairs(config.data, config.sft)


def test_micro_batches_give_the_whole_batch_s_losses_and_weights(setup):
    config, tokenizer, _ = setup
    # float64, so that the pieces' other summation order stays far below what is compared
    whole, pieces = model_of(tokenizer).double(), model_of(tokenizer).double()
    whole_losses = sft(setup, whole, config.sft)
    piece_losses = sft(setup, pieces, dataclasses.replace(config.sft, micro_batch_size=2))
    assert len(whole_losses) == len(piece_losses) == config.sft.steps
    # float64 rounding (eps 2.2e-16) of sums over a few hundred tokens, then AdamW's division by sqrt(v): 1e-9
    # is far above it and far below any real difference (the weights move by about lr = 1e-3 a step)
    assert piece_losses == pytest.approx(whole_losses, rel=1e-9)
    for (name, a), b in zip(whole.named_parameters(), pieces.parameters()):
        assert torch.allclose(a, b, rtol=0, atol=1e-9), name
    moved = model_of(tokenizer).double()
    assert any(not torch.equal(a, b) for a, b in zip(moved.parameters(), whole.parameters()))  # it trained


def test_a_micro_batch_size_is_part_of_the_cache_key_only_when_set(setup):
    config, _, _ = setup
    assert "micro_batch_size" not in config.sft.result_settings()
    pieces = apply_overrides(RunConfig(), [*SETTINGS, "sft.micro_batch_size=2"])
    assert pieces.sft.result_settings()["micro_batch_size"] == 2
    plain = apply_overrides(RunConfig(), SETTINGS)
    assert embedded_key(pieces) != embedded_key(plain)
    assert embedded_key(plain) == embedded_key(apply_overrides(RunConfig(), [*SETTINGS, "sft.micro_batch_size=0"]))


def test_a_noisy_teacher_is_part_of_the_cache_key_only_when_set():
    plain = apply_overrides(RunConfig(), SETTINGS)
    assert "error_rate" not in plain.sft.result_settings()  # so the keys of policies built before it stay valid
    noisy = apply_overrides(RunConfig(), [*SETTINGS, "sft.error_rate=0.25"])
    assert noisy.sft.result_settings()["error_rate"] == 0.25
    assert embedded_key(noisy) != embedded_key(plain)
    assert embedded_key(plain) == embedded_key(apply_overrides(RunConfig(), [*SETTINGS, "sft.error_rate=0.0"]))
