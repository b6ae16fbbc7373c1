"""``optim.activation_checkpointing``: every decoder layer's activations recomputed in the backward
(transformers' gradient checkpointing, as TRL's GRPOConfig does by default): the step's loss and
gradient norm equal those without it up to float32 rounding, and the layers really run again."""

import torch

from tests.tolerances import assert_close_in
from tests.trainer.conftest import SMALL_RUN
from tokenbalance.config import RunConfig, apply_overrides
from tokenbalance.models import load_policy
from tokenbalance.trainer.distributed import DistContext
from tokenbalance.trainer.logprobs import checkpointing
from tokenbalance.trainer.loop import prepare_training, rl_step

CPU = torch.device("cpu")


def first_step(policy_dir, run_dir, *overrides):
    """(metrics of step 0, whether checkpointing was on, forward calls of the first decoder layer in the step)."""
    config = apply_overrides(RunConfig(), [*SMALL_RUN, f"model.path={policy_dir}", *overrides])
    policy, tokenizer = load_policy(policy_dir)
    parts = prepare_training(config, run_dir, policy, tokenizer, CPU, DistContext(device=CPU))
    calls = []
    layer = policy.model.layers[0]
    forward = layer.forward

    def counted(*args, **kwargs):  # not a forward hook: torch runs none while it recomputes a checkpoint
        calls.append(torch.is_grad_enabled())
        return forward(*args, **kwargs)

    layer.forward = counted
    metrics = rl_step(parts, 0)
    return metrics, checkpointing(policy), calls


def test_a_checkpointed_step_equals_the_plain_one_and_recomputes(tiny_policy_dir, tmp_path):
    plain, plain_on, plain_calls = first_step(
        tiny_policy_dir, tmp_path / "plain", "rollout.engine=fast", "optim.share_prompts=off"
    )
    kept, kept_on, kept_calls = first_step(  # share_prompts stays auto (on, on a CPU): checkpointing turns it off
        tiny_policy_dir, tmp_path / "ckpt", "rollout.engine=fast", "optim.activation_checkpointing=true"
    )
    assert not plain_on and kept_on
    for key in ("loss/total", "optim/grad_norm", "reward/mean"):
        assert_close_in(torch.tensor(kept[key]), torch.tensor(plain[key]), torch.float32, msg=key)
    assert plain["optim/grad_norm"] > 0
    # SMALL_RUN: 8 responses in micro-batches of 2, one update pass: 4 forwards with gradient (each a whole row, no
    # shared prompt), each run again in the backward under checkpointing (with gradient: the recomputation)
    assert plain_calls.count(True) == 4
    assert kept_calls.count(True) == 2 * plain_calls.count(True)
