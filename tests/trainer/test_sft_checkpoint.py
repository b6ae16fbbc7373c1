"""A stopped SFT continues from its checkpoint bit for bit (``sft.save_every``), refuses a
checkpoint of another SFT, and leaves the embedded policy's cache key alone."""

import dataclasses

import pytest
import torch

from tokenbalance.config import RunConfig, apply_overrides
from tokenbalance.models import TinyModelConfig, build_tiny_model, train_tokenizer
from tokenbalance.run.examples import sft_pairs
from tokenbalance.tasks.kk import tokenizer_corpus
from tokenbalance.trainer import sft_checkpoint
from tokenbalance.trainer.embedded import embedded_key
from tokenbalance.trainer.sft import run_sft

SETTINGS = [
    "data.train_difficulties=[2]",
    "sft.train_count=12",
    "sft.batch_size=4",
    "sft.steps=6",
    "sft.warmup_steps=2",
]


@pytest.fixture(scope="module")
def setup():
    torch.set_num_threads(1)
    config = apply_overrides(RunConfig(), SETTINGS)
    tokenizer = train_tokenizer(list(tokenizer_corpus(people=(2,), count=20, template="compact")))
    return config, tokenizer, sft_pairs(config.data, config.sft)


def model_of(tokenizer):
    return build_tiny_model(
        TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tokenizer, seed=0
    )


def sft(setup, model, sft_config, **kwargs):
    config, tokenizer, pairs = setup
    return run_sft(
        model, tokenizer, pairs, sft_config, seed=0, max_prompt_tokens=256, device="cpu", progress=False, **kwargs
    )


def test_a_stopped_sft_continues_bit_for_bit(setup, tmp_path):
    config, tokenizer, _ = setup
    whole = model_of(tokenizer)
    whole_losses = sft(setup, whole, config.sft)

    checkpointed = dataclasses.replace(config.sft, save_every=2)
    stopped = model_of(tokenizer)

    def stop_after_step_3(step, loss):
        if step == 3:
            raise KeyboardInterrupt("stopped")

    with pytest.raises(KeyboardInterrupt):
        sft(setup, stopped, checkpointed, checkpoint_dir=tmp_path / "ck", on_step=stop_after_step_3)
    assert [p.name for p in (tmp_path / "ck").iterdir()] == ["step_000002"]  # the step-3 update is lost, 2 kept
    resumed = model_of(tokenizer)  # a new process: fresh weights, then the checkpoint
    resumed_losses = sft(setup, resumed, checkpointed, checkpoint_dir=tmp_path / "ck")
    assert resumed_losses == whole_losses
    for name, tensor in whole.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], tensor), name


def test_a_checkpoint_of_another_sft_is_refused(setup, tmp_path):
    config, tokenizer, _ = setup
    checkpointed = dataclasses.replace(config.sft, save_every=2, steps=3)
    sft(setup, model_of(tokenizer), checkpointed, checkpoint_dir=tmp_path / "ck")
    assert sft_checkpoint.latest(tmp_path / "ck").name == "step_000002"
    other = dataclasses.replace(checkpointed, lr=0.5)
    with pytest.raises(ValueError, match="an SFT checkpoint of other settings, examples or tokenizer; delete"):
        sft(setup, model_of(tokenizer), other, checkpoint_dir=tmp_path / "ck")


def test_checkpointing_is_not_part_of_the_cache_key(setup):
    config, _, _ = setup
    assert embedded_key(apply_overrides(config, ["sft.save_every=50"])) == embedded_key(config)
