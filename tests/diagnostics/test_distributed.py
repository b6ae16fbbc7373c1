"""Per-bucket gradient norms with two gloo ranks equal those of one process on the union batch."""

from types import SimpleNamespace

import pytest
import torch

from tests.tolerances import dtype_atol
from tests.trainer.test_distributed import ROWS, fixed_batch, on_two_gloo_ranks
from tokenbalance.algorithms.methods import build_update_passes
from tokenbalance.algorithms.presets import get_method
from tokenbalance.diagnostics.config import DiagnosticsConfig
from tokenbalance.diagnostics.step import StepDiagnostics
from tokenbalance.models import load_policy
from tokenbalance.trainer.distributed import DistContext
from tokenbalance.trainer.logprobs import batched_response_logprobs, pack_sequences
from tokenbalance.trainer.step_policy import StepPolicy


def bucket_norms(policy_dir, rows: slice, ctx: DistContext) -> dict:
    policy, _ = load_policy(policy_dir)
    prompts, responses, mask, scores, groups = (t[rows] for t in fixed_batch())
    packed = pack_sequences(prompts, torch.ones_like(prompts, dtype=torch.bool), responses, mask)
    old = batched_response_logprobs(policy, packed, temperature=0.3, micro_batch=2).logp_BT
    method = get_method("ar_lopti")
    passes, _ = build_update_passes(method, scores, groups, mask, old, old)
    access = StepPolicy(policy, packed, temperature=0.3, micro_batch_rows=2, ctx=ctx)
    diag = StepDiagnostics(DiagnosticsConfig(grad_norm_every=1, grad_norm_rows=0), method, 0, access)
    batch = SimpleNamespace(old_logp_BT=old, mask_BT=mask, entropy_BT=None, correct_B=scores == 3, group_ids_B=groups)
    return diag.before_update(passes, batch)


@pytest.mark.slow  # two processes: in the slow tier, which scripts/test.sh and CI run after the default suite
def test_two_gloo_ranks_measure_the_global_bucket_gradients(tiny_policy_dir, tmp_path):
    torch.set_num_threads(1)
    single = bucket_norms(tiny_policy_dir, slice(0, ROWS), DistContext())
    assert single["diag/grad_norm/all"] > 0
    for ranked in on_two_gloo_ranks(bucket_norms, tiny_policy_dir, tmp_path):
        assert ranked.keys() == single.keys()
        for key, value in single.items():
            assert abs(ranked[key] - value) <= dtype_atol(torch.float32, value), key  # float32 model
