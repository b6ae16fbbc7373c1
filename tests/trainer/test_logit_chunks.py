"""The output layer and log-softmax in chunks of positions (``optim.logit_chunk_tokens``,
:func:`tokenbalance.trainer.logprobs.chunked_head_logprobs`): the same log-probs, entropies,
sum_j pi_j^2 and parameter gradients as the whole computation, up to float32 rounding (a matrix
product of fewer rows may be split differently by the BLAS kernel), with and without gradient."""

import pytest
import torch

from tests.tolerances import assert_close_in
from tests.trainer.test_precision import random_packed
from tokenbalance.models import load_policy
from tokenbalance.trainer.logprobs import response_logprobs
from tokenbalance.trainer.precision import ForwardSettings


def forward_and_gradients(policy, packed, settings: ForwardSettings):
    policy.zero_grad(set_to_none=True)
    out = response_logprobs(
        policy,
        packed,
        temperature=0.7,
        with_entropy=True,
        entropy_grad=True,
        with_sum_sq_probs=True,
        forward_settings=settings,
    )
    assert out.entropy_BT is not None and out.sum_sq_probs_BT is not None
    (out.logp_BT.sum() + 0.1 * out.entropy_BT.sum()).backward()
    grads = {name: p.grad.detach().clone() for name, p in policy.named_parameters() if p.grad is not None}
    return out, grads


@pytest.mark.parametrize("chunk", [1, 5, 10_000])  # one position, chunks that split rows, one chunk
def test_chunked_log_probs_and_gradients_equal_the_whole_computation(tiny_policy_dir, chunk):
    policy, _ = load_policy(tiny_policy_dir)
    packed = random_packed(policy.config.vocab_size)
    whole, whole_grads = forward_and_gradients(policy, packed, ForwardSettings())
    chunked, chunked_grads = forward_and_gradients(policy, packed, ForwardSettings(chunk_tokens=chunk))
    for name in ("logp_BT", "entropy_BT", "sum_sq_probs_BT"):
        assert_close_in(getattr(chunked, name), getattr(whole, name), torch.float32, msg=name)
    assert whole_grads.keys() == chunked_grads.keys() and whole_grads
    for name, grad in whole_grads.items():
        assert_close_in(chunked_grads[name], grad, torch.float32, msg=name)


def test_chunked_log_probs_without_gradient_and_with_trimmed_padding(tiny_policy_dir):
    policy, _ = load_policy(tiny_policy_dir)
    packed = random_packed(policy.config.vocab_size)
    with torch.no_grad():
        whole = response_logprobs(policy, packed.rows(slice(0, 1)), temperature=1.0, trim_padding=True)
        chunked = response_logprobs(
            policy,
            packed.rows(slice(0, 1)),  # the short row: the trimmed columns come back as zeros
            temperature=1.0,
            trim_padding=True,
            forward_settings=ForwardSettings(chunk_tokens=3),
        )
    assert not chunked.logp_BT.requires_grad and chunked.logp_BT.shape == whole.logp_BT.shape
    assert_close_in(chunked.logp_BT, whole.logp_BT, torch.float32)
    assert torch.equal(chunked.logp_BT[0, 4:], torch.zeros(3))
