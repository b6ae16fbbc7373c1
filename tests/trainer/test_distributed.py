"""Two gloo processes compute the same update as one process on the same batch."""

import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.tolerances import assert_close_in, dtype_atol
from tokenbalance.algorithms.methods import build_update_passes, get_method
from tokenbalance.config import RunConfig
from tokenbalance.models import load_policy
from tokenbalance.trainer.distributed import DistContext
from tokenbalance.trainer.logprobs import batched_response_logprobs, pack_sequences
from tokenbalance.trainer.loop import make_optimizer
from tokenbalance.trainer.update import run_update_passes

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
    metrics = run_update_passes(
        method=method,
        passes=passes,
        policy=policy,
        optimizer=optimizer,
        packed=packed,
        old_logp_BT=old,
        ref_logp_BT=old,
        temperature=1.0,
        mini_batch_rows=8 // ctx.world_size,
        micro_batch_rows=2,
        grad_clip=1.0,
        token_mean_scope="mini_batch",
        ctx=ctx,
    )
    assert metrics["optim/steps"] == 2
    # the pre-clip gradient norm sees the summed gradient: a rank that averaged (or skipped the
    # all-reduce) would report a different norm even where AdamW's scale invariance hides it
    return [p.detach().clone() for p in policy.parameters()], metrics["optim/grad_norm"]


def _rank_main(rank, compute, policy_dir, init_file, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    half = ROWS // 2
    result = compute(policy_dir, slice(rank * half, (rank + 1) * half), DistContext(rank=rank, world_size=2))
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def on_two_gloo_ranks(compute, policy_dir, tmp_path) -> list:
    """``compute(policy_dir, rows, ctx)`` on each half of the batch in two gloo processes (a
    module-level function, so the processes can import it); their results, rank 0 first."""
    init_file = tempfile.mktemp(dir=tmp_path)
    mp.spawn(_rank_main, args=(compute, str(policy_dir), init_file, str(tmp_path)), nprocs=2, join=True)
    return [torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1)]


def test_two_gloo_ranks_equal_one_process(tiny_policy_dir, tmp_path):
    single, single_norm = one_update(tiny_policy_dir, slice(0, ROWS), DistContext())
    initial, _ = load_policy(tiny_policy_dir)
    assert max((a - b).abs().max().item() for a, b in zip(single, initial.parameters())) > 1e-5
    for ranked, norm in on_two_gloo_ranks(one_update, tiny_policy_dir, tmp_path):
        assert abs(norm - single_norm) <= dtype_atol(torch.float32, single_norm)
        for a, b in zip(ranked, single):
            assert_close_in(a, b, torch.float32)  # float32 model; the ranks sum in another order
