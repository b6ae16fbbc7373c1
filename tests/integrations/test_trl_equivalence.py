"""On a fixed batch, the TRL subclass and our trainer compute the same loss and gradient.

TRL side: ``TokenBalanceGRPOTrainer.compute_loss`` on a hand-built ``inputs`` dict shaped like the
one ``_generate_and_score_completions`` returns, TRL's own forward (fused LM head) included.
Our side: ``build_update_passes`` + ``pass_loss`` (per pass) and ``run_update`` (whole
schedules, gradient accumulation), with our trainer's log-prob function. Same float64 model,
same tensors, sampling temperature 0.1 so that token probabilities spread over (0, 1) on this
random model (TR-GRPO weights above 1, both Lopti passes non-empty).

The model runs in float64, but TRL's chunked log-prob kernel computes the log-softmax and its
gradient in float32 (``tile.float()``) whatever the model's dtype; ours stays in float64. So the two
sides agree to float32 rounding, and every tolerance below is derived from float32's epsilon and the
magnitude compared (``tests/tolerances.py``), not from one CPU's summation order.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.integrations.test_trl_support import GROUP, fixed_batch, tiny_policy_dir
from tests.tolerances import assert_close_in, dtype_atol
from tokenbalance.algorithms.loss import pass_loss, pass_normaliser
from tokenbalance.algorithms.methods import AdvantageConfig, NTHRInputs, build_update_passes, compute_advantages
from tokenbalance.algorithms.nthr import nthr_correct
from tokenbalance.algorithms.presets import apply_method_overrides, get_method
from tokenbalance.integrations.trl import (
    TaskReward,
    build_grpo_trainer,
    task_prompt_dataset,
)
from tokenbalance.models import load_policy
from tokenbalance.trainer.distributed import DistContext
from tokenbalance.trainer.logprobs import (
    batched_response_logprobs,
    pack_sequences,
    response_logprobs,
)
from tokenbalance.trainer.update import UpdateRows, UpdateSettings, UpdateSpec, run_update

pytestmark = pytest.mark.usefixtures("trl_offline")

TEMPERATURE = 0.1
MAX_LEN = 7
LOGSOFTMAX_DTYPE = torch.float32  # TRL's kernel; bounds every comparison below


def method_case(name: str):
    """Presets, with thresholds moved so that every stage acts on this tiny random model."""
    if name == "lopti":  # both passes non-empty
        return apply_method_overrides(get_method("lopti"), {"lopti.eta": 0.05})
    if name == "nthr":  # tau = 0: some negative tokens selected; "correct" = reward >= 0 (random rewards)
        return apply_method_overrides(get_method("nthr"), {"nthr.beta": 0.0, "nthr.correct_threshold": 0.0})
    if name == "seq_mean":
        return get_method("ar").replace(name="ar_seq_mean", loss_agg_mode="seq-mean-token-mean")
    if name == "dr_grpo":
        return get_method("grpo").replace(
            name="dr", loss_agg_mode="seq-mean-token-sum-norm", advantage=AdvantageConfig(estimator="dr_grpo")
        )
    return get_method(name)


@pytest.fixture(scope="module")
def tokenizer():
    return load_policy(tiny_policy_dir())[1]


def make_trainer(method, tokenizer, tmp_path, reward_funcs=None, **config):
    torch.manual_seed(0)
    model, _ = load_policy(tiny_policy_dir())
    trainer = build_grpo_trainer(
        model.double(),
        tokenizer=tokenizer,
        train_dataset=task_prompt_dataset(2, difficulty=2, template="compact"),
        reward_funcs=TaskReward(tokenizer) if reward_funcs is None else reward_funcs,
        method=method,
        group_size=GROUP,
        prompts_per_step=2,
        max_completion_length=MAX_LEN,
        output_dir=str(tmp_path),
        temperature=TEMPERATURE,
        **config,
    )
    trainer.model.train()
    return trainer


def sampled_batch(policy, tokenizer) -> dict:
    """``fixed_batch`` prompts with completions sampled from ``policy`` (EOS ends a completion)."""
    batch = fixed_batch(tokenizer, max_len=MAX_LEN)
    torch.manual_seed(1)
    with torch.no_grad():
        out = policy.generate(
            input_ids=batch["prompt_ids"],
            attention_mask=batch["prompt_mask"],
            do_sample=True,
            temperature=TEMPERATURE,
            top_k=0,
            top_p=1.0,
            max_new_tokens=MAX_LEN,
            min_new_tokens=MAX_LEN,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=None,
        )
    completion_ids = out[:, batch["prompt_ids"].shape[1] :]
    mask = batch["completion_mask"].bool()
    batch["completion_ids"] = completion_ids.masked_fill(~mask, tokenizer.pad_token_id)
    return batch


class OurSide:
    """Old / reference log-probs, NTHR inputs and passes exactly as ``trainer/loop.py`` builds them."""

    def __init__(self, method, policy, batch):
        self.method = method
        self.mask_BT = batch["completion_mask"].bool()
        self.packed = pack_sequences(
            batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"], batch["completion_mask"]
        )
        B = self.mask_BT.shape[0]
        self.old = batched_response_logprobs(
            policy, self.packed, temperature=TEMPERATURE, micro_batch=B, with_hidden=method.needs_hidden_states
        )
        self.ref_logp_BT = self.old.logp_BT.clone()  # the reference policy is the initial policy
        nthr_inputs = None
        if method.needs_hidden_states:
            head = policy.get_output_embeddings()
            nthr_inputs = NTHRInputs(
                tokens_BT=batch["completion_ids"],
                hidden_BTD=self.old.hidden_BTD.float(),
                unembed_VD=head.weight.detach().float(),
                temperature=TEMPERATURE,
            )
        self.passes, self.metrics = build_update_passes(
            method,
            batch["scores_B"],
            batch["group_ids_B"],
            self.mask_BT,
            self.old.logp_BT,
            self.ref_logp_BT,
            nthr_inputs,
        )
        self.advantages_B = compute_advantages(method, batch["scores_B"], batch["group_ids_B"], self.mask_BT)[:, 0]

    def pass_loss_and_grads(self, policy, index: int):
        policy.zero_grad(set_to_none=True)
        current = response_logprobs(policy, self.packed, temperature=TEMPERATURE, with_entropy=True)
        update_pass = self.passes[index]
        out = pass_loss(
            self.method,
            update_pass,
            current.logp_BT,
            self.old.logp_BT,
            self.ref_logp_BT,
            current.entropy_BT,
            normaliser=pass_normaliser(self.method, update_pass),
        )
        out.loss.backward()
        return out.loss.detach(), grads_of(policy)

    def trl_inputs(self, batch, rows=slice(None), *, with_old_logp: bool) -> dict:
        """The dict ``_generate_and_score_completions`` returns (``rows`` of it, as TRL's split does)."""
        inputs = {key: batch[key][rows] for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
        inputs["advantages"] = self.advantages_B[rows]
        inputs["num_items_in_batch"] = self.mask_BT.sum()
        inputs["ref_per_token_logps"] = self.ref_logp_BT[rows]
        inputs["group_ids"] = batch["group_ids_B"][rows]
        inputs["rewards"] = batch["scores_B"][rows].float()  # as _generate_and_score_completions adds them
        if with_old_logp:  # TRL computes them at generation when num_iterations > 1 (Lopti)
            inputs["old_per_token_logps"] = self.old.logp_BT[rows]
        return inputs


def grads_of(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def trl_loss_and_grads(trainer, inputs, *, step: int):
    trainer.model.zero_grad(set_to_none=True)
    trainer._step = step  # the micro-step counter TRL's loop keeps; it selects the Lopti pass
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach(), grads_of(trainer.model)


def assert_close_grads(ours, theirs):
    assert ours.keys() == theirs.keys()
    scale = max(float(g.abs().max()) for g in ours.values())
    assert scale > 1e-4  # a real gradient, not zeros on both sides
    atol = dtype_atol(LOGSOFTMAX_DTYPE, scale)
    for name in ours:
        assert torch.allclose(theirs[name], ours[name], rtol=0, atol=atol), name


@pytest.mark.parametrize("name", ["grpo", "ar", "tr_grpo", "lopti", "nthr", "seq_mean", "dr_grpo"])
def test_loss_and_gradient_match_per_pass(name, tokenizer, tmp_path):
    method = method_case(name)
    loss_type = {"seq_mean": "grpo", "dr_grpo": "dr_grpo"}.get(name, "dapo")
    trainer = make_trainer(method, tokenizer, tmp_path, loss_type=loss_type)
    policy = trainer.model
    batch = sampled_batch(policy, tokenizer)
    ours = OurSide(trainer.balance_method, policy, batch)
    assert trainer.balance_method.max_response_len in (None, MAX_LEN)
    inputs = ours.trl_inputs(batch, with_old_logp=method.lopti is not None)
    for index in range(len(ours.passes)):
        our_loss, our_grads = ours.pass_loss_and_grads(policy, index)
        trl_loss, trl_grads = trl_loss_and_grads(trainer, inputs, step=index)
        assert torch.isfinite(trl_loss)
        assert abs(float(trl_loss) - float(our_loss)) <= dtype_atol(LOGSOFTMAX_DTYPE, float(our_loss)), (name, index)
        assert_close_grads(our_grads, trl_grads)
    if name == "tr_grpo":
        assert trainer._metrics["train"]["tr_grpo/w_max"][-1] > 1.0  # the weights are not all 1
    if name == "nthr":
        assert ours.metrics["nthr/selected_frac"] > 0
        assert trainer._metrics["train"]["nthr/selected_frac"][-1] == pytest.approx(ours.metrics["nthr/selected_frac"])
    if name == "lopti":
        assert 0 < ours.metrics["lopti/low_token_frac"] < 1


def sgd_update(model, lr: float) -> None:
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= lr * p.grad
    model.zero_grad(set_to_none=True)


@pytest.mark.parametrize(
    ("name", "loss_type", "scope"),
    [
        ("lopti", "dapo", "mini_batch"),  # two optimizer passes, two micro-batches each
        ("ar", "dapo", "mini_batch"),  # global token-mean over accumulated micro-batches
        ("seq_mean", "grpo", "micro_batch"),  # TRL's per-micro-batch scope = our token_mean_scope="micro_batch"
    ],
)
def test_schedule_with_accumulation_matches_run_update(name, loss_type, scope, tokenizer, tmp_path):
    """Whole update: our ``run_update`` vs TRL rounds of 2 accumulated micro-batches (SGD)."""
    lr = 0.05
    method = method_case(name)
    trainer = make_trainer(method, tokenizer, tmp_path, loss_type=loss_type, gradient_accumulation_steps=2)
    policy = trainer.model
    batch = sampled_batch(policy, tokenizer)
    ours = OurSide(trainer.balance_method, policy, batch)
    start = {n: p.detach().clone() for n, p in policy.named_parameters()}

    our_policy = copy.deepcopy(policy)
    optimizer = torch.optim.SGD(our_policy.parameters(), lr=lr)
    B = ours.mask_BT.shape[0]
    metrics = run_update(
        UpdateSpec(
            trainer.balance_method,
            ours.passes,
            UpdateRows(ours.packed, ours.old.logp_BT, ours.ref_logp_BT),
            UpdateSettings(
                temperature=TEMPERATURE,
                mini_batch_rows=B,
                micro_batch_rows=B // 2,
                grad_clip=1e9,
                token_mean_scope=scope,
            ),
        ),
        our_policy,
        optimizer,
        DistContext(),
    ).metrics
    assert metrics["optim/steps"] == len(ours.passes)

    trainer.current_gradient_accumulation_steps = 2
    halves = [slice(0, B // 2), slice(B // 2, B)]
    step = 0
    for _ in ours.passes:
        trainer.model.zero_grad(set_to_none=True)
        for rows in halves:  # TRL's split of one generation batch into accumulation micro-batches
            trainer._step = step
            trainer.compute_loss(trainer.model, ours.trl_inputs(batch, rows, with_old_logp=True)).backward()
            step += 1
        sgd_update(trainer.model, lr)

    for name_, p in policy.named_parameters():
        trl_delta = (p.detach() - start[name_]) / lr
        our_delta = (dict(our_policy.named_parameters())[name_].detach() - start[name_]) / lr
        assert_close_in(trl_delta, our_delta, LOGSOFTMAX_DTYPE, msg=name_)
    assert max(float((p.detach() - start[n]).abs().max()) for n, p in policy.named_parameters()) > 1e-5


def test_hidden_states_captured_on_the_training_forward_are_the_old_policys(tokenizer, tmp_path):
    """NTHR's inputs from TRL's training forward equal those of our separate old-policy pass."""
    method = method_case("nthr")
    trainer = make_trainer(method, tokenizer, tmp_path)
    batch = sampled_batch(trainer.model, tokenizer)
    ours = OurSide(method, trainer.model, batch)
    logp_BT, _, hidden_BTD = trainer._policy_forward(trainer.model, ours.trl_inputs(batch, with_old_logp=False))
    mask = ours.mask_BT
    assert logp_BT.requires_grad and not hidden_BTD.requires_grad
    # float64 decoder, but transformers keeps the rotary tables in float32 (computed over other shapes here)
    assert_close_in(hidden_BTD[mask], ours.old.hidden_BTD[mask], torch.float32)
    # log-probs at temperature 0.1: logits / 0.1 are 10x larger, so is their float32 rounding
    assert_close_in(logp_BT.detach()[mask], ours.old.logp_BT[mask], LOGSOFTMAX_DTYPE, ulps=64 * round(1 / TEMPERATURE))
    assert not trainer._policy_module().model._forward_hooks  # the hook is removed after the forward


def test_nthr_correct_completions_are_those_with_the_maximum_reward(tokenizer, tmp_path):
    """TaskReward's max_reward (K&K: 3) is the default maximum; the rewards of this process's rows are kept."""
    trainer = make_trainer(get_method("nthr"), tokenizer, tmp_path)
    assert trainer.nthr_max_reward == 3.0
    # TRL's gathered [rows of all processes, functions] rewards; NaN = unscored by every function
    trainer._rewards_per_func = torch.tensor([[3.0], [float("nan")], [-1.0], [3.0]])
    rewards = trainer._local_rewards(4)
    assert rewards[[0, 2, 3]].tolist() == [3.0, -1.0, 3.0] and torch.isnan(rewards[1])
    correct = nthr_correct(rewards, trainer.balance_method.nthr, trainer.nthr_max_reward)
    assert correct.tolist() == [True, False, False, True]

    def plain(completions, **_):
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match=r"the maximum is unknown: reward function\(s\) \['plain'\]"):
        make_trainer(get_method("nthr"), tokenizer, tmp_path, reward_funcs=plain)
    given = make_trainer(get_method("nthr"), tokenizer, tmp_path, reward_funcs=plain, nthr_max_reward=1.0)
    assert given.nthr_max_reward == 1.0
    stated = apply_method_overrides(get_method("nthr"), {"nthr.correct_threshold": 0.5})
    assert make_trainer(stated, tokenizer, tmp_path, reward_funcs=plain).nthr_max_reward is None
