"""Per-bucket gradient norms with two gloo ranks equal those of one process on the union batch."""

import torch

from tests.trainer.test_distributed import ROWS, fixed_batch, on_two_gloo_ranks
from tokenbalance.algorithms.methods import build_update_passes, get_method
from tokenbalance.diagnostics.config import DiagnosticsConfig
from tokenbalance.diagnostics.step import StepDiagnostics
from tokenbalance.models import load_policy
from tokenbalance.trainer.distributed import DistContext, sum_gradients, sum_normaliser
from tokenbalance.trainer.logprobs import batched_response_logprobs, pack_sequences, response_logprobs


def bucket_norms(policy_dir, rows: slice, ctx: DistContext) -> dict:
    policy, _ = load_policy(policy_dir)
    prompts, responses, mask, scores, groups = (t[rows] for t in fixed_batch())
    packed = pack_sequences(prompts, torch.ones_like(prompts, dtype=torch.bool), responses, mask)
    old = batched_response_logprobs(policy, packed, temperature=0.3, micro_batch=2).logp_BT
    method = get_method("ar_lopti")
    passes, _ = build_update_passes(method, scores, groups, mask, old, old)
    diag = StepDiagnostics(DiagnosticsConfig(grad_norm_every=1, grad_norm_rows=0), method, step=0)
    return diag.before_update(
        passes,
        old,
        mask,
        policy=policy,
        micro_batch_rows=2,
        score_fn=lambda index: response_logprobs(policy, packed.rows(index), temperature=0.3).logp_BT,
        reduce_grads=lambda params: sum_gradients(params, ctx),
        reduce_normaliser=lambda normaliser: sum_normaliser(normaliser, ctx),
    )


def test_two_gloo_ranks_measure_the_global_bucket_gradients(tiny_policy_dir, tmp_path):
    torch.set_num_threads(1)
    single = bucket_norms(tiny_policy_dir, slice(0, ROWS), DistContext())
    assert single["diag/grad_norm/all"] > 0
    for ranked in on_two_gloo_ranks(bucket_norms, tiny_policy_dir, tmp_path):
        assert ranked.keys() == single.keys()
        for key, value in single.items():
            assert abs(ranked[key] - value) <= 1e-5 * max(1.0, abs(value)), key
