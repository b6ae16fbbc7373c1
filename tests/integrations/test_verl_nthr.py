"""NTHR on verl (the ``tokenbalance_nthr`` trainer), its pieces on CPU without Ray.

* the worker: verl 0.9.1's real ``TrainingWorker.infer_batch`` and ``FSDPEngineWithLMHead``
  forward (one process, an unsharded tiny Llama, float64) under our
  ``NTHRActorRolloutRefWorker.compute_log_prob``: the returned hidden states are the decoder's at
  the positions that predict each response token (packed and padded inputs, micro-batches
  reordered by dynamic batch size), the log-probs are verl's, the output layer is the model's,
  the actor's loss function is back afterwards, and without the flag nothing changes;
* the trainer's step: :func:`nthr_advantages` on verl's stored batch equals our trainer's
  ``build_update_passes`` (NTHR on our GRPO advantages) bit for bit, weights and metrics, for
  both ``positives`` rules; and from the worker's hidden states on, the whole path gives the
  weights our trainer gives from a per-row forward of the same model;
* the trainer class: the flag reaches the old-log-prob call only, the hidden field stays out of
  later fetches, the weighted advantages are written back, the worker class is swapped;
* settings and launch checks, with the reason and the key.

The end-to-end run (Ray, FSDP2 on two ranks, TransferQueue, 2 steps) is in ``test_verl_e2e.py``.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

import transfer_queue
from omegaconf import OmegaConf
from tensordict import NonTensorStack, TensorDict
from transfer_queue import KVBatchMeta
from transformers import LlamaConfig, LlamaForCausalLM
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1.trainer_base import PPOTrainer, get_trainer_cls
from verl.utils import seqlen_balancing
from verl.workers.config import FSDPEngineConfig
from verl.workers.engine.fsdp import transformer_impl
from verl.workers.engine_workers import TrainingWorker
from verl.workers.utils.padding import response_to_nested

from tests.integrations.verl_batch import stored_samples
from tests.tolerances import assert_close_in
from tokenbalance.algorithms.methods import (
    AdvantageConfig,
    KLConfig,
    Method,
    NTHRInputs,
    build_update_passes,
    compute_advantages,
)
from tokenbalance.algorithms.nthr import NTHRConfig
from tokenbalance.integrations.verl import nthr_worker
from tokenbalance.integrations.verl.names import (
    NTHR_HIDDEN_FIELD,
    NTHR_HIDDEN_KEY,
    NTHR_TRAINER,
    POLICY_LOSS_CONFIG_TARGET,
)
from tokenbalance.integrations.verl.nthr import NTHRSettings, nthr_advantages, nthr_settings
from tokenbalance.integrations.verl.nthr_worker import NTHRActorRolloutRefWorker
from tokenbalance.integrations.verl.reward import REWARD_PATH
from tokenbalance.integrations.verl.validation import validate_launch

VOCAB, HIDDEN = 48, 16
GROUP = 4
PROMPT_LENS = (3, 2, 4, 1, 2, 5, 3, 2)
RESPONSE_LENS = (6, 3, 5, 1, 4, 6, 2, 5)
TEMPERATURE = 0.7
MAX_REWARD = 3.0
REWARDS = (3.0, -1.0, 3.0, -3.0, -0.5, 3.0, -1.0, -1.0)  # K&K-like: two groups, both mixed


# --------------------------------------------------------------------------- a tiny model, verl's batch


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config).double().eval()


def token_rows(seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randint(0, VOCAB, (p,), generator=gen), torch.randint(0, VOCAB, (r,), generator=gen))
        for p, r in zip(PROMPT_LENS, RESPONSE_LENS, strict=True)
    ]


def stored_batch(rows, **non_tensor) -> TensorDict:
    """The batch as verl's worker receives it from TransferQueue: every response token valid."""
    return stored_samples([(prompt, response, torch.ones_like(response)) for prompt, response in rows], **non_tensor)


@pytest.fixture(scope="module")
def process_group(tmp_path_factory):
    """verl's worker all-reduces over the data-parallel group: one gloo process."""
    started = not torch.distributed.is_initialized()
    if started:
        store = tmp_path_factory.mktemp("pg") / "store"
        torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    if started:
        torch.distributed.destroy_process_group()


def actor_worker(model, monkeypatch) -> NTHRActorRolloutRefWorker:
    """Our worker around verl's real TrainingWorker and FSDP engine, built without Ray or sharding."""
    for module, name in (
        (transformer_impl, "get_device_id"),
        (transformer_impl, "get_device_name"),
        (seqlen_balancing, "get_device_name"),
    ):
        monkeypatch.setattr(module, name, lambda: "cpu")  # no accelerator platform here (the e2e registers one)
    engine = object.__new__(transformer_impl.FSDPEngineWithLMHead)
    engine.engine_config = FSDPEngineConfig(use_torch_compile=False)
    engine.module, engine.scaler, engine._autocast_dtype = model, None, torch.float32
    engine.use_ulysses_sp, engine.pad_to_length, engine.ulysses_sequence_parallel_size = False, False, 1
    engine.ulysses_device_mesh = engine.ulysses_parallel_group = None
    engine._is_offload_param = engine._is_offload_optimizer = False
    engine.compute_entropy_from_logits = transformer_impl.verl_F.entropy_from_logits
    actor = object.__new__(TrainingWorker)
    actor.engine, actor.engine_config, actor.model_config = engine, engine.engine_config, {}
    actor.flops_counter, actor.device_name = None, "cpu"
    actor.loss_fn = verl_loss = object()
    worker = object.__new__(NTHRActorRolloutRefWorker)
    worker.actor, worker.enable_routing_replay = actor, False
    worker.verl_loss = verl_loss
    return worker


def reference_hidden_and_logp(model, rows) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T, D] hidden states and [B, T] log-probs at T of each response token, one row per forward."""
    B, T = len(rows), max(RESPONSE_LENS)
    hidden_BTD = torch.zeros(B, T, HIDDEN, dtype=torch.float64)
    logp_BT = torch.zeros(B, T, dtype=torch.float64)
    with torch.no_grad():
        for row, (prompt, response) in enumerate(rows):
            ids = torch.cat([prompt, response])[None]
            hidden = model.model(input_ids=ids).last_hidden_state[0, len(prompt) - 1 : -1]
            logits = model.lm_head(hidden) / TEMPERATURE
            hidden_BTD[row, : len(response)] = hidden
            logp_BT[row, : len(response)] = torch.log_softmax(logits, -1).gather(-1, response[:, None])[:, 0]
    return hidden_BTD, logp_BT


def padded(nested: torch.Tensor) -> torch.Tensor:
    return torch.nested.to_padded_tensor(nested, 0.0)


# --------------------------------------------------------------------------- the worker


@pytest.mark.parametrize(
    "remove_padding, dynamic", [(True, False), (False, False), (True, True)], ids=["packed", "padded", "dynamic_bsz"]
)
def test_old_log_prob_forward_returns_the_response_hidden_states(
    model, process_group, monkeypatch, remove_padding, dynamic
):
    worker = actor_worker(model, monkeypatch)
    rows = token_rows()
    settings = dict(
        temperature=TEMPERATURE,
        calculate_entropy=True,
        compute_loss=False,
        use_remove_padding=remove_padding,
        use_dynamic_bsz=dynamic,
        micro_batch_size_per_gpu=2,
        max_token_len_per_gpu=20,  # dynamic: micro-batches of uneven sizes, out of order
    )
    output = worker.compute_log_prob(stored_batch(rows, **settings, **{NTHR_HIDDEN_KEY: True}))

    expected_hidden, expected_logp = reference_hidden_and_logp(model, rows)
    response_mask = stored_batch(rows)["response_mask"]
    from verl.workers.utils.padding import response_from_nested

    logp = padded(response_from_nested(output["log_probs"], response_mask))
    hidden = output[NTHR_HIDDEN_FIELD]
    assert hidden.is_nested and [len(h) for h in hidden.unbind()] == list(RESPONSE_LENS)
    assert_close_in(padded(hidden), expected_hidden, torch.float64, msg="hidden states")  # packed vs one row
    # verl's own log-probs at the same positions; verl divides by the temperature cast to float32
    assert_close_in(logp, expected_logp, torch.float32, msg="log-probs")
    assert worker.actor.loss_fn is worker.verl_loss  # restored
    layer = worker.nthr_output_layer()  # in the worker; the worker group collects one answer per rank
    assert torch.equal(layer.weight, model.lm_head.weight) and not layer.weight.requires_grad

    plain = worker.compute_log_prob(stored_batch(rows, **settings))  # the reference's call: no flag
    assert NTHR_HIDDEN_FIELD not in plain.keys() and worker.actor.loss_fn is worker.verl_loss
    torch.testing.assert_close(plain["log_probs"].values(), output["log_probs"].values(), rtol=0, atol=0)


def test_worker_replaces_verls_actor_worker_whatever_its_role():
    for role in (Role.ActorRollout, Role.ActorRolloutRef, Role.Actor):
        mapping = {role: object(), Role.Critic: "critic"}
        nthr_worker.use_nthr_worker(mapping)
        assert mapping[role].__ray_metadata__.modified_class.__name__ == "NTHRActorRolloutRefWorker"
        assert mapping[Role.Critic] == "critic"


# --------------------------------------------------------------------------- the trainer's step


def verl_batch(rows, advantages_BT, old_logp_BT, hidden_BTD, rewards=REWARDS) -> TensorDict:
    """What the trainer reads back from TransferQueue after verl's advantages (all jagged, uid per row)."""
    data = stored_batch(rows)
    mask = data["response_mask"]
    lengths = list(RESPONSE_LENS)
    scores_BT = torch.zeros(len(rows), max(lengths), dtype=torch.float32)
    scores_BT[torch.arange(len(rows)), torch.tensor(lengths) - 1] = torch.tensor(rewards)
    out = data.select("responses", "response_mask")
    out["rm_scores"] = response_to_nested(scores_BT, mask)
    out["old_log_probs"] = response_to_nested(old_logp_BT, mask)
    out["advantages"] = response_to_nested(advantages_BT, mask)
    out[NTHR_HIDDEN_FIELD] = torch.nested.as_nested_tensor(
        [hidden_BTD[row, :length] for row, length in enumerate(lengths)], layout=torch.jagged
    )
    out["uid"] = NonTensorStack(*[f"prompt-{row // GROUP}" for row in range(len(rows))])
    return out


def our_trainer(model, rows, config: NTHRConfig, hidden_BTD, old_logp_BT):
    """Our trainer's NTHR on the same batch: GRPO advantages x ``nthr_token_weights`` (build_update_passes)."""
    B, T = len(rows), max(RESPONSE_LENS)
    mask_BT = torch.arange(T)[None] < torch.tensor(RESPONSE_LENS)[:, None]
    tokens_BT = torch.zeros(B, T, dtype=torch.long)
    for row, (_, response) in enumerate(rows):
        tokens_BT[row, : len(response)] = response
    method = Method(advantage=AdvantageConfig(estimator="grpo"), kl=KLConfig(placement="none"), nthr=config)
    group_ids_B = torch.arange(B) // GROUP
    scores_B = torch.tensor(REWARDS, dtype=torch.float64)
    inputs = NTHRInputs.from_output_layer(model.lm_head, tokens_BT, hidden_BTD, TEMPERATURE, max_reward=MAX_REWARD)
    (update_pass,), metrics = build_update_passes(method, scores_B, group_ids_B, mask_BT, old_logp_BT, None, inputs)
    advantages_BT = compute_advantages(method, scores_B, group_ids_B, mask_BT)
    return advantages_BT, update_pass.advantages_BT, metrics


@pytest.mark.parametrize("positives", ["correct", "advantage_sign"])
def test_nthr_advantages_equal_our_trainer_bit_for_bit(model, positives):
    rows = token_rows(seed=1)
    hidden_BTD, old_logp_BT = reference_hidden_and_logp(model, rows)
    config = NTHRConfig(beta=0.0, eta=0.5, positives=positives)
    advantages_BT, expected_BT, expected_metrics = our_trainer(model, rows, config, hidden_BTD, old_logp_BT)

    data = verl_batch(rows, advantages_BT, old_logp_BT, hidden_BTD)
    weighted, metrics = nthr_advantages(data, model.lm_head, NTHRSettings(config, MAX_REWARD), TEMPERATURE)

    assert weighted.is_nested
    assert torch.equal(padded(weighted), expected_BT)
    for key in [k for k in expected_metrics if k.startswith("nthr/")]:
        assert metrics[key] == expected_metrics[key], key
    assert metrics["nthr/mixed_groups"] == 2 and 0 < metrics["nthr/selected_frac"] < 1
    assert (
        metrics["nthr/neg_weight_min"] == 0.5 and metrics["nthr/pos_weight_min"] == metrics["nthr/pos_weight_max"] == 1
    )


def test_worker_hidden_states_give_our_trainers_weights(model, process_group, monkeypatch):
    """From verl's packed forward on: the same NTHR weights as our trainer's per-row forward (float64)."""
    rows = token_rows(seed=2)
    worker = actor_worker(model, monkeypatch)
    flags = dict(temperature=TEMPERATURE, calculate_entropy=True, compute_loss=False, use_remove_padding=True)
    output = worker.compute_log_prob(
        stored_batch(rows, **flags, use_dynamic_bsz=False, micro_batch_size_per_gpu=4, **{NTHR_HIDDEN_KEY: True})
    )
    from verl.workers.utils.padding import response_from_nested

    old_logp_BT = padded(response_from_nested(output["log_probs"], stored_batch(rows)["response_mask"]))
    hidden_BTD, reference_logp_BT = reference_hidden_and_logp(model, rows)
    config = NTHRConfig(beta=0.0)  # the paper's R1-distill setting; beta = 1 selects none of this random batch
    advantages_BT, expected_BT, _ = our_trainer(model, rows, config, hidden_BTD, reference_logp_BT)
    head = worker.nthr_output_layer()
    data = verl_batch(rows, advantages_BT, old_logp_BT, padded(output[NTHR_HIDDEN_FIELD]))
    weighted, metrics = nthr_advantages(data, head, NTHRSettings(config, MAX_REWARD), TEMPERATURE)
    assert metrics["nthr/mixed_groups"] == 2 and 0 < metrics["nthr/selected_frac"] < 1
    assert torch.equal(padded(weighted), expected_BT)  # the same tokens selected: the same products


# --------------------------------------------------------------------------- the trainer class


class FakeVerl:
    """What the trainer calls around its own code: verl's parent stages, TransferQueue, the worker group.

    The parent stages return a fresh handle listing the stored fields, as verl's do after a write;
    ``kv_batch_get`` serves ``stored``; ``kv_batch_put`` keeps what is written.
    """

    FIELDS = ("responses", NTHR_HIDDEN_FIELD, "advantages")

    def __init__(self, stored: TensorDict, head: torch.nn.Module):
        self.stored, self.head = stored, head
        self.old_log_prob_extra_info: list[dict] = []
        self.written: dict[str, torch.Tensor] = {}

    def handle(self, extra_info=None) -> KVBatchMeta:
        keys = [f"k{i}" for i in range(len(PROMPT_LENS))]
        return KVBatchMeta(
            keys=keys,
            tags=[{}] * len(keys),
            partition_id="train",
            fields=list(self.FIELDS),
            extra_info=extra_info or {},
        )

    def compute_old_log_prob(self, batch, metrics):
        self.old_log_prob_extra_info.append(dict(batch.extra_info))
        return self.handle()

    def compute_advantage(self, batch, metrics):
        return self.handle()

    def kv_batch_get(self, keys, partition_id, select_fields):
        return self.stored.select(*select_fields)

    def kv_batch_put(self, keys, partition_id, fields):
        self.written.update(fields.items())
        return self.handle()

    def nthr_output_layer(self):
        return [self.head, None]  # ONE_TO_ALL: every rank answers, global rank 0 with the layer


def test_trainer_asks_for_hidden_states_once_and_writes_the_weighted_advantages(model, monkeypatch):
    rows = token_rows(seed=1)
    hidden_BTD, old_logp_BT = reference_hidden_and_logp(model, rows)
    config = NTHRConfig(beta=0.0, eta=0.5)
    advantages_BT, expected_BT, _ = our_trainer(model, rows, config, hidden_BTD, old_logp_BT)
    fake = FakeVerl(verl_batch(rows, advantages_BT, old_logp_BT, hidden_BTD), model.lm_head)
    monkeypatch.setattr(PPOTrainer, "_compute_old_log_prob", fake.compute_old_log_prob)
    monkeypatch.setattr(PPOTrainer, "_compute_advantage", fake.compute_advantage)
    monkeypatch.setattr(transfer_queue, "kv_batch_get", fake.kv_batch_get)
    monkeypatch.setattr(transfer_queue, "kv_batch_put", fake.kv_batch_put)
    trainer = object.__new__(get_trainer_cls(NTHR_TRAINER))
    trainer.config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"temperature": TEMPERATURE}}})
    trainer.nthr_settings = NTHRSettings(config, MAX_REWARD)
    trainer.actor_rollout_wg, trainer.timing_raw = fake, {}

    batch = fake.handle({"temperature": TEMPERATURE})
    after_old_log_prob = trainer._compute_old_log_prob(batch, {})
    assert fake.old_log_prob_extra_info == [{"temperature": TEMPERATURE, NTHR_HIDDEN_KEY: True}]
    assert batch.extra_info == {"temperature": TEMPERATURE}  # the caller's handle is untouched
    assert after_old_log_prob.fields == ["responses", "advantages"]  # the reference and the update skip it
    metrics: dict[str, float] = {}
    after_advantage = trainer._compute_advantage(after_old_log_prob, metrics)
    assert after_advantage.fields == ["responses", "advantages"]
    assert torch.equal(padded(fake.written["advantages"]), expected_BT)
    assert metrics["tokenbalance/nthr/neg_weight_min"] == 0.5 and "tokenbalance_nthr" in trainer.timing_raw


# --------------------------------------------------------------------------- settings and launch checks


def launch_config(**overrides):
    config = OmegaConf.create(
        {
            "algorithm": {"adv_estimator": "tokenbalance_grpo", "rollout_correction": {"bypass_mode": False}},
            "trainer": {"use_v1": True, "v1": {"trainer_mode": NTHR_TRAINER}},
            "reward": {"custom_reward_function": {"path": REWARD_PATH, "reward_kwargs": {}}},
            "actor_rollout_ref": {
                "actor": {
                    "strategy": "fsdp2",
                    "ulysses_sequence_parallel_size": 1,
                    "policy_loss": {"_target_": POLICY_LOSS_CONFIG_TARGET, "loss_mode": "tokenbalance_grpo"},
                }
            },
        }
    )
    for key, value in overrides.items():
        OmegaConf.update(config, key, value, force_add=True)
    return config


SECTION = f"trainer.v1.{NTHR_TRAINER}"


def test_settings_default_to_the_paper_and_the_tasks_maximum_reward():
    settings = nthr_settings(None, {"path": REWARD_PATH, "reward_kwargs": {}})
    assert settings == NTHRSettings(NTHRConfig(), 3.0)  # K&K, the default task
    assert nthr_settings({}, {"path": REWARD_PATH, "reward_kwargs": {"task": "arith"}}).max_reward == 1.0
    assert (
        nthr_settings({}, {"path": REWARD_PATH, "reward_kwargs": {"reward": "m:f", "max_reward": 2}}).max_reward == 2.0
    )
    given = nthr_settings({"beta": 0, "eta": 0.4, "max_reward": 5}, {"path": "/my/reward.py"})
    assert given == NTHRSettings(NTHRConfig(beta=0.0, eta=0.4), 5.0)
    assert nthr_settings({"positives": "advantage_sign"}, None).max_reward is None


def test_bad_settings_fail_naming_the_key():
    with pytest.raises(ValueError, match=rf"{SECTION}: unknown key\(s\) betta; valid: beta, eta"):
        nthr_settings({"betta": 1.0})
    with pytest.raises(ValueError, match=rf"{SECTION}\.eta: must be in \[0\.0, 1\.0\], got 1\.5"):
        nthr_settings({"eta": 1.5, "max_reward": 1})
    with pytest.raises(ValueError, match=rf"{SECTION}\.max_reward: must be a finite number"):
        nthr_settings({"max_reward": math.inf})
    with pytest.raises(
        ValueError, match=rf"{SECTION}\.max_reward: NTHR's positives='correct' .*positives=advantage_sign"
    ):
        nthr_settings({}, {"path": "/my/reward.py"})


def test_the_nthr_trainer_launches_where_it_gets_the_hidden_states():
    validate_launch(launch_config())
    validate_launch(launch_config(**{"actor_rollout_ref.actor.policy_loss.loss_mode": "tokenbalance_ar"}))
    for key, value, reason in [
        ("actor_rollout_ref.actor.strategy", "fsdp", r"strategy='fsdp': .* FSDP2 engine only"),
        ("actor_rollout_ref.actor.strategy", "megatron", r"strategy='megatron'"),
        ("actor_rollout_ref.actor.ulysses_sequence_parallel_size", 2, r"ulysses_sequence_parallel_size=2: .* one rank"),
        ("algorithm.rollout_correction.bypass_mode", True, r"bypass_mode=True: .* old-log-prob forward"),
        ("trainer.use_v1", False, rf"the {NTHR_TRAINER} trainer is a verl v1 trainer"),
        (f"{SECTION}.beta", math.nan, rf"{SECTION}\.beta: must be a finite float"),
    ]:
        with pytest.raises(ValueError, match=reason):
            validate_launch(launch_config(**{key: value}))


def test_nthr_as_a_loss_or_estimator_points_to_the_trainer():
    for key in ("actor_rollout_ref.actor.policy_loss.loss_mode", "algorithm.adv_estimator"):
        with pytest.raises(
            ValueError, match=rf"not a policy loss or an advantage estimator.*trainer_mode={NTHR_TRAINER}"
        ):
            validate_launch(launch_config(**{key: "tokenbalance_nthr"}))
    with pytest.raises(ValueError, match=rf"{SECTION} is set but the trainer is 'sync'"):
        validate_launch(launch_config(**{"trainer.v1.trainer_mode": "sync", f"{SECTION}.beta": 0.0}))
