"""Two gloo processes compute the same update as one process on the same batch, and agree on the
metrics when their key sets differ."""

import math
import os
import tempfile
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.tolerances import assert_close_in, dtype_atol
from tokenbalance.algorithms.methods import build_update_passes
from tokenbalance.algorithms.presets import get_method
from tokenbalance.config import RunConfig
from tokenbalance.models import load_policy
from tokenbalance.trainer.distributed import DistContext, gather_keys, mean_over_ranks
from tokenbalance.trainer.logprobs import batched_response_logprobs, pack_sequences
from tokenbalance.trainer.loop import make_optimizer
from tokenbalance.trainer.update import UpdateRows, UpdateSettings, UpdateSpec, run_update

ROWS, GROUP, T = 8, 4, 5


def fixed_batch():
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(4, 60, (ROWS, 3), generator=gen)
    responses = torch.randint(4, 60, (ROWS, T), generator=gen)
    lengths = torch.tensor([5, 3, 4, 2, 5, 5, 1, 3])
    mask = torch.arange(T)[None] < lengths[:, None]
    scores = torch.tensor([3.0, -1.0, -0.5, 3.0, -3.0, 3.0, -1.0, -1.0])
    return prompts, responses, mask, scores, torch.arange(ROWS // GROUP).repeat_interleave(GROUP)


def one_update(policy_dir, rows: slice, ctx: DistContext):
    torch.manual_seed(0)
    policy, _ = load_policy(policy_dir)
    prompts, responses, mask, scores, groups = (t[rows] for t in fixed_batch())
    packed = pack_sequences(prompts, torch.ones_like(prompts, dtype=torch.bool), responses, mask)
    old = batched_response_logprobs(policy, packed, temperature=1.0, micro_batch=2).logp_BT
    method = get_method("ar_lopti")
    passes, _ = build_update_passes(method, scores, groups, mask, old, old)
    optimizer = make_optimizer(policy, RunConfig())
    metrics = run_update(
        UpdateSpec(
            method,
            passes,
            UpdateRows(packed, old, old),
            UpdateSettings(
                temperature=1.0,
                mini_batch_rows=8 // ctx.world_size,
                micro_batch_rows=2,
                grad_clip=1.0,
                token_mean_scope="mini_batch",
            ),
        ),
        policy,
        optimizer,
        ctx,
    ).metrics
    assert metrics["optim/steps"] == 2
    # the pre-clip gradient norm sees the summed gradient: a rank that averaged (or skipped the
    # all-reduce) would report a different norm even where AdamW's scale invariance hides it
    return [p.detach().clone() for p in policy.parameters()], metrics["optim/grad_norm"]


COLLECTIVE_TIMEOUT = timedelta(seconds=60)  # a rank waiting longer on a collective raises
JOIN_TIMEOUT_S = 240  # a hung pair of ranks fails the test instead of the whole run


def _rank_main(rank, compute, policy_dir, init_file, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=2, timeout=COLLECTIVE_TIMEOUT
    )
    half = ROWS // 2
    result = compute(policy_dir, slice(rank * half, (rank + 1) * half), DistContext(rank=rank, world_size=2))
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def on_two_gloo_ranks(compute, policy_dir, tmp_path) -> list:
    """``compute(policy_dir, rows, ctx)`` on each half of the batch in two gloo processes (a
    module-level function, so the processes can import it); their results, rank 0 first. A hang
    (ranks making different collective calls) fails after ``JOIN_TIMEOUT_S``."""
    init_file = tempfile.mktemp(dir=tmp_path)
    context = mp.spawn(_rank_main, args=(compute, str(policy_dir), init_file, str(tmp_path)), nprocs=2, join=False)
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"two gloo ranks still running after {JOIN_TIMEOUT_S} s: a collective call hangs")
    return [torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1)]


@pytest.mark.slow  # two processes: in the slow tier, which scripts/test.sh and CI run after the default suite
def test_two_gloo_ranks_equal_one_process(tiny_policy_dir, tmp_path):
    single, single_norm = one_update(tiny_policy_dir, slice(0, ROWS), DistContext())
    initial, _ = load_policy(tiny_policy_dir)
    assert max((a - b).abs().max().item() for a, b in zip(single, initial.parameters())) > 1e-5
    for ranked, norm in on_two_gloo_ranks(one_update, tiny_policy_dir, tmp_path):
        assert abs(norm - single_norm) <= dtype_atol(torch.float32, single_norm)
        for a, b in zip(ranked, single):
            assert_close_in(a, b, torch.float32)  # float32 model; the ranks sum in another order


def reduce_mismatched_metrics(policy_dir, rows, ctx):
    """Each rank reports a different key set: shared keys, keys of one rank only, and no keys."""
    mine = [
        {"shared": 1.0, "pass/lopti_low/clip/frac": 0.25, "optim/grad_norm": float("nan")},
        {"shared": 3.0, "tr_grpo/w_mean": 0.5, "optim/grad_norm": 2.0},
    ][ctx.rank]
    return {
        "mixed": mean_over_ranks(mine, ctx),
        "one_empty": mean_over_ranks({"only": 4.0} if ctx.rank == 0 else {}, ctx),
        "both_empty": mean_over_ranks({}, ctx),
        "keys": gather_keys(["b", "a"] if ctx.rank == 0 else ["c", "a"], ctx),
    }


@pytest.mark.slow  # two processes: in the slow tier, which scripts/test.sh and CI run after the default suite
def test_metrics_with_different_keys_per_rank(tmp_path):
    for result in on_two_gloo_ranks(reduce_mismatched_metrics, tmp_path, tmp_path):
        mixed = result["mixed"]
        assert set(mixed) == {"shared", "pass/lopti_low/clip/frac", "tr_grpo/w_mean", "optim/grad_norm"}
        assert mixed["shared"] == 2.0  # averaged over the two ranks
        assert mixed["pass/lopti_low/clip/frac"] == 0.25 and mixed["tr_grpo/w_mean"] == 0.5  # the one rank's
        assert math.isnan(mixed["optim/grad_norm"])  # a NaN on a rank that has the key stays visible
        assert result["one_empty"] == {"only": 4.0} and result["both_empty"] == {}
        assert result["keys"] == ["a", "b", "c"]


def update_with_low_tokens_on_rank_zero(policy_dir, rows, ctx):
    """AR-Lopti where only rank 0 has low-probability tokens: rank 1 runs no ``lopti_low`` micro-batch
    and reports no ``pass/lopti_low/*``; the loop's reduction must still agree on every key."""
    torch.manual_seed(0)
    policy, _ = load_policy(policy_dir)
    prompts, responses, mask, scores, groups = (t[rows] for t in fixed_batch())
    packed = pack_sequences(prompts, torch.ones_like(prompts, dtype=torch.bool), responses, mask)
    old = torch.full(mask.shape, math.log(0.1 if ctx.rank == 0 else 0.9)).masked_fill(~mask, 0.0)
    method = get_method("ar_lopti")
    passes, prep = build_update_passes(method, scores, groups, mask, old, old)
    metrics = run_update(
        UpdateSpec(
            method,
            passes,
            UpdateRows(packed, old, old),
            UpdateSettings(
                temperature=1.0, mini_batch_rows=4, micro_batch_rows=2, grad_clip=1.0, token_mean_scope="mini_batch"
            ),
        ),
        policy,
        make_optimizer(policy, RunConfig()),
        ctx,
    ).metrics
    local = {**prep, **metrics}
    return local, mean_over_ranks(local, ctx)


@pytest.mark.slow  # two processes: in the slow tier, which scripts/test.sh and CI run after the default suite
def test_loop_metrics_when_only_one_rank_has_a_pass(tiny_policy_dir, tmp_path):
    (local0, reduced0), (local1, reduced1) = on_two_gloo_ranks(
        update_with_low_tokens_on_rank_zero, tiny_policy_dir, tmp_path
    )
    low_keys = {k for k in local0 if k.startswith("pass/lopti_low/")}
    assert low_keys and not any(k.startswith("pass/lopti_low/") for k in local1)
    assert reduced0 == reduced1 and set(reduced0) == set(local0) | set(local1)
    for key in low_keys:
        assert reduced0[key] == local0[key]
    for key in set(local0) & set(local1):
        assert reduced0[key] == (local0[key] + local1[key]) / 2 or (
            math.isnan(local0[key]) and math.isnan(reduced0[key])
        )
    assert reduced0["lopti/low_token_frac"] == 0.5  # all of rank 0's tokens, none of rank 1's
