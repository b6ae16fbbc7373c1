"""The ``tokenbalance_lopti`` trainer and its loss, executed on CPU with verl's own code and data.

* Registration: after ``import verl`` the trainer is in verl's ``TRAINER_REGISTRY``; with
  ``transfer_queue`` unimportable (simulated) it is not, and a launch asking for it fails clearly.
* ``lopti_ppo_loss`` on micro-batches built by verl's own functions along the path a batch takes
  in verl's v1 trainer: per-response dicts as ``AgentLoopWorkerTQ`` stores them ->
  ``list_of_dict_to_tensordict`` (jagged nested tensors); old log-probs / advantages / ref
  log-probs as the trainer writes them (``response_to_nested``); the trainer's ``extra_info`` as
  non-tensor data (as verl's TransferQueue dispatch attaches it); mini-batches from
  ``tu.make_iterator`` (``TrainingWorker.train_mini_batch``); ``batch_num_tokens`` / ``dp_size``
  as ``FSDPEngine.forward_backward_batch`` assigns them; micro-batches from
  ``prepare_micro_batches``; model outputs as the no-padding engine returns them (nested
  full-sequence ``log_probs`` / ``entropy``). Compared, float64, with our ``pass_loss`` and with
  verl's own ``ppo_loss``.
* The trainer's ``_setup`` and ``_update_actor`` overrides, running verl's real base
  ``_update_actor`` on a real composed config; only Ray (the parent ``_setup`` and the actor
  worker group) is replaced by a documented fake.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
import torch

verl = pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.trainer_base import PPOTrainer, get_trainer_cls
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import tensordict_utils as tu
from verl.workers.config import ActorConfig, PolicyLossConfig
from verl.workers.engine.utils import prepare_micro_batches
from verl.workers.utils.losses import ppo_loss
from verl.workers.utils.padding import response_to_nested

from tests.integrations.verl_batch import stored_samples
from tokenbalance.algorithms.loss import pass_loss
from tokenbalance.algorithms.methods import KLConfig, Method, passes_from_advantages
from tokenbalance.algorithms.passes import LoptiConfig
from tokenbalance.algorithms.surrogate import ClipConfig
from tokenbalance.algorithms.weights import ARConfig
from tokenbalance.integrations.verl import lopti, plugin, validation
from tokenbalance.integrations.verl.config import TokenBalancePolicyLossConfig
from tokenbalance.integrations.verl.losses import lopti_ppo_loss, select_pass
from tokenbalance.integrations.verl.names import (
    LOPTI_TRAINER,
    POLICY_LOSS_CONFIG_TARGET,
    UPDATE_PASS_KEY,
)
from tokenbalance.integrations.verl.validation import validate_launch

REPO = Path(__file__).resolve().parents[2]
PASSES = ("lopti_low", "lopti_high")
PROMPT_LENS = (3, 2, 4, 1, 2, 5, 3, 2)
RESPONSE_LENS = (6, 3, 5, 1, 4, 6, 2, 5)
ROW_TOKEN = 100  # prompt i is filled with token id 100 + i, so a micro-batch names its rows
FILLER = float("nan")  # model outputs at non-response positions: reading one poisons the loss
MINI_BATCH, MICRO_BATCH = 4, 2  # responses; 8 responses = 2 mini-batches x 2 micro-batches
ENTROPY_COEFF = 0.01
CLIP = ClipConfig(eps_low=0.2, eps_high=0.24, dual_clip_c=10.0, log_ratio_clamp=20.0)  # verl's clamp
KL = KLConfig(coef=0.001, estimator="k3", log_ratio_clamp=20.0)  # verl's low_var_kl x 0.001


# --------------------------------------------------------------------------- data


@dataclass
class Rollout:
    """One RL step's padded tensors, all ``[B, T]`` (B = 8, T = longest response), float64.

    ``mask_BT`` has one masked token inside a response (a tool-output token in multi-turn).
    """

    mask_BT: torch.Tensor
    logp_BT: torch.Tensor
    old_BT: torch.Tensor
    ref_BT: torch.Tensor
    advantages_BT: torch.Tensor
    entropy_BT: torch.Tensor


def make_rollout(seed: int = 0) -> Rollout:
    """Old probabilities on both sides of eta = 0.5; current log-probs far enough from them
    that clipping and dual clipping act; group-constant advantages of both signs."""
    gen = torch.Generator().manual_seed(seed)
    rows, length = len(RESPONSE_LENS), max(RESPONSE_LENS)
    mask_BT = torch.arange(length)[None, :] < torch.tensor(RESPONSE_LENS)[:, None]
    mask_BT[0, 2] = False
    old_BT = torch.log(0.05 + 0.9 * torch.rand(rows, length, generator=gen, dtype=torch.float64))
    logp_BT = old_BT + (torch.rand(rows, length, generator=gen, dtype=torch.float64) - 0.5) * 0.9
    logp_BT[2, 0] = old_BT[2, 0] + 3.0  # ratio e^3 > c = 10 on a negative advantage: dual clip
    ref_BT = logp_BT + (torch.rand(rows, length, generator=gen, dtype=torch.float64) - 0.5) * 0.4
    advantages_B = torch.tensor([1.2, 0.4, -0.9, -0.7, 0.8, -1.1, 1.5, -0.2], dtype=torch.float64)
    entropy_BT = 0.1 + 2.0 * torch.rand(rows, length, generator=gen, dtype=torch.float64)
    zero = torch.zeros((), dtype=torch.float64)
    return Rollout(
        mask_BT=mask_BT,
        logp_BT=torch.where(mask_BT, logp_BT, zero),
        old_BT=torch.where(mask_BT, old_BT, zero),
        ref_BT=torch.where(mask_BT, ref_BT, zero),
        advantages_BT=advantages_B[:, None] * mask_BT,
        entropy_BT=torch.where(mask_BT, entropy_BT, zero),
    )


def stored_batch(rollout: Rollout, extra_info: dict):
    """The batch as verl's TrainingWorker receives it: jagged tensors, extra_info as non-tensor data."""
    rows = [
        (
            torch.full((prompt_len,), ROW_TOKEN + row),
            torch.arange(response_len) + 1,
            rollout.mask_BT[row, :response_len].long(),
        )
        for row, (prompt_len, response_len) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS, strict=True))
    ]
    data = stored_samples(rows, **extra_info)
    for key, padded_BT in (
        ("old_log_probs", rollout.old_BT),
        ("advantages", rollout.advantages_BT),
        ("ref_log_prob", rollout.ref_BT),
    ):
        data[key] = response_to_nested(padded_BT, data["response_mask"])
    return data


def engine_micro_batches(data, mini_batch_size: int = MINI_BATCH, micro_batch_size: int = MICRO_BATCH):
    """``[[micro-batch, ...] per mini-batch]`` as verl's worker and FSDP engine split ``data`` (one rank)."""
    tu.assign_non_tensor(data, use_dynamic_bsz=False, micro_batch_size_per_gpu=micro_batch_size)
    mini_batches = []
    for mini in tu.make_iterator(
        data, mini_batch_size=mini_batch_size, epochs=1, seed=42, dataloader_kwargs={"shuffle": False}
    ):
        tu.assign_non_tensor(mini, batch_num_tokens=int(mini["loss_mask"].sum()), dp_size=1)
        micro_batches, _ = prepare_micro_batches(mini, dp_group=None, same_micro_num_in_dp=True)
        mini_batches.append(micro_batches)
    return mini_batches


def rows_of(batch) -> list[int]:
    return [int(prompt[0]) - ROW_TOKEN for prompt in batch["prompts"].unbind()]


def full_sequence_nested(values_BT: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """Jagged ``[b, prompt + response]`` model output of ``rows``: the value of response token t
    sits at position ``prompt_len - 1 + t`` (the logits that predict it), the rest is FILLER."""
    pieces, lengths = [], []
    for row in rows:
        prompt_len, response_len = PROMPT_LENS[row], RESPONSE_LENS[row]
        filler = torch.full((prompt_len - 1,), FILLER, dtype=values_BT.dtype)
        pieces += [filler, values_BT[row, :response_len], torch.full((1,), FILLER, dtype=values_BT.dtype)]
        lengths.append(prompt_len + response_len)
    offsets = torch.cumsum(torch.tensor([0, *lengths]), dim=0)
    return torch.nested.nested_tensor_from_jagged(torch.cat(pieces), offsets)


def model_output(micro_batch, logp_BT, entropy_BT=None) -> dict:
    """What the no-padding engine hands the loss: nested ``log_probs`` (and ``entropy``)."""
    rows = rows_of(micro_batch)
    output = {"log_probs": full_sequence_nested(logp_BT, rows)}
    if entropy_BT is not None:
        output["entropy"] = full_sequence_nested(entropy_BT, rows)
    return output


def actor_config(policy_loss) -> ActorConfig:
    return ActorConfig(
        strategy="fsdp",
        rollout_n=4,
        ppo_mini_batch_size=1,
        ppo_micro_batch_size_per_gpu=MICRO_BATCH,
        clip_ratio_low=0.2,
        clip_ratio_high=0.24,
        clip_ratio_c=10.0,
        use_kl_loss=True,
        kl_loss_type="low_var_kl",
        kl_loss_coef=0.001,
        entropy_coeff=ENTROPY_COEFF,
        policy_loss=policy_loss,
    )


def core_method(with_ar: bool, with_lopti: bool = True) -> Method:
    """Our Method equal to :func:`actor_config` with AR alpha 0.3 / Lopti eta 0.5."""
    return Method(
        clip=CLIP,
        kl=KL,
        entropy_coeff=ENTROPY_COEFF,
        ar=ARConfig(alpha=0.3) if with_ar else None,
        lopti=LoptiConfig(eta=0.5) if with_lopti else None,
    )


def core_mini_batch_loss(method: Method, pass_name: str | None, rollout: Rollout, rows: list[int], logp_BT, entropy_BT):
    """Our ``pass_loss`` of one pass (``None``: the single pass) on a mini-batch's padded rows."""
    passes, _ = passes_from_advantages(method, rollout.advantages_BT[rows], rollout.mask_BT[rows], rollout.old_BT[rows])
    update_pass = passes[0] if pass_name is None else select_pass(passes, pass_name)
    return pass_loss(
        method,
        update_pass,
        logp_BT[rows],
        rollout.old_BT[rows],
        ref_logp_BT=rollout.ref_BT[rows],
        entropy_BT=entropy_BT[rows],
    ).loss


def leaves(rollout: Rollout):
    return rollout.logp_BT.clone().requires_grad_(True), rollout.entropy_BT.clone().requires_grad_(True)


def grads(loss, *tensors):
    return torch.autograd.grad(loss, tensors)


# --------------------------------------------------------------------------- (1) registration


def test_import_verl_registers_our_trainer_subclass():
    trainer_cls = get_trainer_cls(LOPTI_TRAINER)
    assert issubclass(trainer_cls, PPOTrainerSync)
    assert trainer_cls.__module__ == lopti.__name__
    assert trainer_cls._update_actor is not PPOTrainerSync._update_actor
    assert trainer_cls._setup is not PPOTrainerSync._setup
    assert lopti.build_lopti_trainer() is trainer_cls  # idempotent: the plugin runs in every process
    assert validation.TRAINER_IMPORT_ERROR is None


def lopti_launch_config():
    return OmegaConf.create(
        {
            "algorithm": {"adv_estimator": "tokenbalance_grpo"},
            "trainer": {"use_v1": True, "v1": {"trainer_mode": LOPTI_TRAINER}},
            "actor_rollout_ref": {
                "actor": {
                    "policy_loss": {
                        "_target_": POLICY_LOSS_CONFIG_TARGET,
                        "loss_mode": "tokenbalance_ar",
                        "lopti_eta": 0.5,
                    }
                }
            },
        }
    )


def test_without_transfer_queue_the_trainer_is_skipped_and_a_launch_fails_clearly(monkeypatch):
    validate_launch(lopti_launch_config())  # installed: valid
    for name in [name for name in sys.modules if name.startswith("verl.trainer.ppo.v1")]:
        monkeypatch.delitem(sys.modules, name)  # restored after the test
    monkeypatch.setitem(sys.modules, "transfer_queue", None)  # `import transfer_queue` raises ImportError
    monkeypatch.setattr(validation, "TRAINER_IMPORT_ERROR", None)
    plugin.register_all()
    assert "transfer_queue" in validation.TRAINER_IMPORT_ERROR
    with pytest.raises(
        ValueError,
        match=(
            r"trainer\.v1\.trainer_mode=tokenbalance_lopti: verl's v1 trainer could not be imported "
            r"\(ModuleNotFoundError: .*transfer_queue.*\); install tokenbalance's verl extra .*TransferQueue"
        ),
    ):
        validate_launch(lopti_launch_config())


# --------------------------------------------------------------------------- (2) lopti_ppo_loss on verl's data


@pytest.mark.parametrize("pass_name", PASSES)
def test_lopti_ppo_loss_on_verl_nested_micro_batches_equals_pass_loss(pass_name):
    rollout = make_rollout()
    config = actor_config(TokenBalancePolicyLossConfig(loss_mode="tokenbalance_ar", ar_alpha=0.3, lopti_eta=0.5))
    loss_fn = partial(lopti_ppo_loss, config=config)  # what the trainer installs with set_loss_fn
    extra_info = {UPDATE_PASS_KEY: pass_name, "global_batch_size": MINI_BATCH, "temperature": 0.7}
    logp_BT, entropy_BT = leaves(rollout)
    logp_core_BT, entropy_core_BT = leaves(rollout)

    low_BT = rollout.mask_BT & (rollout.old_BT.exp() < 0.5)
    assert 0 < int(low_BT.sum()) < int(rollout.mask_BT.sum())  # both passes hold tokens
    verl_total, core_total = 0.0, 0.0
    for micro_batches in engine_micro_batches(stored_batch(rollout, extra_info)):
        rows = [row for micro in micro_batches for row in rows_of(micro)]
        losses, metrics = zip(
            *[
                loss_fn(model_output=model_output(micro, logp_BT, entropy_BT), data=micro, dp_group=None)
                for micro in micro_batches
            ]
        )
        core = core_mini_batch_loss(core_method(with_ar=True), pass_name, rollout, rows, logp_core_BT, entropy_core_BT)
        torch.testing.assert_close(sum(losses), core, rtol=0, atol=1e-10)
        logged = metrics[0]["actor/pg_loss"].init_list()
        for micro_metrics in metrics:  # verl adds the micro-batch losses of a mini-batch
            logged.extend(micro_metrics["actor/pg_loss"])
        assert abs(logged.aggregate() - core.item()) < 1e-10
        verl_total, core_total = verl_total + sum(losses), core_total + core

    assert abs(core_total.item()) > 1e-3
    for verl_grad, core_grad in zip(
        grads(verl_total, logp_BT, entropy_BT), grads(core_total, logp_core_BT, entropy_core_BT), strict=True
    ):
        assert torch.isfinite(verl_grad).all()  # no FILLER position was read
        torch.testing.assert_close(verl_grad, core_grad, rtol=0, atol=1e-10)
        assert verl_grad.abs().max() > 1e-4


def test_lopti_passes_sum_to_verl_ppo_loss_on_the_same_micro_batches():
    """Both passes through lopti_ppo_loss == verl's own ppo_loss (vanilla, k3 KL, entropy) in
    value and gradient, micro-batch by micro-batch."""
    rollout = make_rollout(seed=1)
    ours = partial(
        lopti_ppo_loss, config=actor_config(TokenBalancePolicyLossConfig(loss_mode="tokenbalance_grpo", lopti_eta=0.5))
    )
    verls = partial(ppo_loss, config=actor_config(PolicyLossConfig(loss_mode="vanilla")))
    logp_BT, entropy_BT = leaves(rollout)
    logp_verl_BT, entropy_verl_BT = leaves(rollout)
    ours_total, verl_total = 0.0, 0.0
    for pass_name in PASSES:
        extra_info = {UPDATE_PASS_KEY: pass_name, "global_batch_size": MINI_BATCH}
        for micro in (m for minis in engine_micro_batches(stored_batch(rollout, extra_info)) for m in minis):
            loss, _ = ours(model_output=model_output(micro, logp_BT, entropy_BT), data=micro, dp_group=None)
            ours_total = ours_total + loss
            if pass_name == PASSES[0]:
                single, _ = verls(model_output=model_output(micro, logp_verl_BT, entropy_verl_BT), data=micro)
                verl_total = verl_total + single
    torch.testing.assert_close(ours_total, verl_total, rtol=0, atol=1e-10)
    for our_grad, verl_grad in zip(
        grads(ours_total, logp_BT, entropy_BT), grads(verl_total, logp_verl_BT, entropy_verl_BT), strict=True
    ):
        torch.testing.assert_close(our_grad, verl_grad, rtol=0, atol=1e-10)


def test_lopti_ppo_loss_without_the_pass_name_names_the_trainer():
    rollout = make_rollout()
    config = actor_config(TokenBalancePolicyLossConfig(loss_mode="tokenbalance_grpo"))
    micro = engine_micro_batches(stored_batch(rollout, {"global_batch_size": MINI_BATCH}))[0][0]
    with pytest.raises(ValueError, match=f"{UPDATE_PASS_KEY}: missing.*trainer_mode={LOPTI_TRAINER}"):
        lopti_ppo_loss(config, model_output(micro, rollout.logp_BT), micro)


# --------------------------------------------------------------------------- (3) the trainer's overrides


class FakeActorWorkerGroup:
    """Stands in for the Ray worker group of verl's ActorRolloutRefWorker (no Ray, no GPU).

    ``set_loss_fn`` keeps the loss; ``update_actor(batch)`` records the handle and a copy of its
    ``extra_info``, then does what the worker does with it at fixed weights: attach extra_info
    to the stored batch, pop the mini-batch settings, split, and evaluate the installed loss per
    micro-batch. Returns the worker's output (``{"metrics": {...}}`` with per-mini-batch lists).
    """

    def __init__(self, rollout: Rollout, grad_norms: list[float]):
        self.rollout, self.grad_norms = rollout, list(grad_norms)
        self.loss_fn, self.received = None, []

    def set_loss_fn(self, loss_fn):
        self.loss_fn = loss_fn

    def update_actor(self, batch):
        self.received.append((batch, dict(batch.extra_info)))
        data = stored_batch(self.rollout, batch.extra_info)
        mini_batch_size = tu.pop(data, key="mini_batch_size", default=None)
        entropy_BT = self.rollout.entropy_BT if tu.get(data, "calculate_entropy", default=False) else None
        losses = [
            sum(
                self.loss_fn(model_output=model_output(micro, self.rollout.logp_BT, entropy_BT), data=micro)[0].item()
                for micro in micro_batches
            )
            for micro_batches in engine_micro_batches(data, mini_batch_size=mini_batch_size)
        ]
        return {
            "metrics": {
                "pg_loss": losses,
                "mfu": [0.5] * len(losses),
                "grad_norm": [self.grad_norms.pop(0)] * len(losses),
            }
        }


def composed_config():
    """verl's ppo_trainer config composed by hydra, as examples/verl/kk_ar_lopti.sh sets it."""
    actor, loss = "actor_rollout_ref.actor", "actor_rollout_ref.actor.policy_loss"
    overrides = [
        f"{loss}._target_={POLICY_LOSS_CONFIG_TARGET}",
        f"{loss}.loss_mode=tokenbalance_ar",
        f"+{loss}.ar_alpha=0.3",
        f"+{loss}.lopti_eta=0.5",
        f"trainer.v1.trainer_mode={LOPTI_TRAINER}",
        "algorithm.adv_estimator=tokenbalance_grpo",
        "actor_rollout_ref.rollout.n=4",
        f"{actor}.ppo_mini_batch_size=1",
        f"{actor}.ppo_micro_batch_size_per_gpu={MICRO_BATCH}",
        f"{actor}.clip_ratio_low=0.2",
        f"{actor}.clip_ratio_high=0.24",
        f"{actor}.clip_ratio_c=10.0",
        f"{actor}.use_kl_loss=True",
        f"{actor}.kl_loss_type=low_var_kl",
        f"{actor}.kl_loss_coef=0.001",
        f"{actor}.entropy_coeff={ENTROPY_COEFF}",
        "actor_rollout_ref.rollout.temperature=0.7",
    ]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose("ppo_trainer", overrides=overrides)


def test_trainer_setup_installs_our_loss_and_update_actor_runs_verl_once_per_pass(monkeypatch):
    rollout = make_rollout(seed=2)
    workers = FakeActorWorkerGroup(rollout, grad_norms=[1.0, 3.0])

    def parent_setup(self):  # verl's _setup builds Ray worker groups; keep only its outcome
        self.actor_rollout_wg = workers

    monkeypatch.setattr(PPOTrainer, "_setup", parent_setup)
    trainer = object.__new__(get_trainer_cls(LOPTI_TRAINER))
    trainer.config = composed_config()
    trainer._setup()

    assert trainer.lopti_pass_names == list(PASSES)
    assert workers.loss_fn.func is lopti_ppo_loss
    installed = workers.loss_fn.keywords["config"]
    assert isinstance(installed, ActorConfig) and isinstance(installed.policy_loss, TokenBalancePolicyLossConfig)
    assert (installed.policy_loss.ar_alpha, installed.policy_loss.lopti_eta, installed.entropy_coeff) == (
        0.3,
        0.5,
        0.01,
    )
    assert (
        pickle.loads(pickle.dumps(workers.loss_fn)).keywords["config"].policy_loss.lopti_eta == 0.5
    )  # ships to workers

    batch = KVBatchMeta(
        keys=[f"uid{i}" for i in range(8)], tags=[{}] * 8, partition_id="train", extra_info={"temperature": 0.7}
    )
    metrics = {"actor/entropy": 0.25}
    assert trainer._update_actor(batch, metrics) is batch

    assert batch.extra_info == {"temperature": 0.7}  # the stored batch's handle is untouched
    assert [info[UPDATE_PASS_KEY] for _, info in workers.received] == list(PASSES)
    for handle, info in workers.received:
        assert handle is not batch and handle.keys == batch.keys and handle.partition_id == "train"
        assert info["global_batch_size"] == MINI_BATCH and info["calculate_entropy"] is True  # verl's own settings

    expected = {
        name: sum(
            core_mini_batch_loss(
                core_method(with_ar=True), name, rollout, rows, rollout.logp_BT, rollout.entropy_BT
            ).item()
            for rows in ([0, 1, 2, 3], [4, 5, 6, 7])
        )
        / 2
        for name in PASSES
    }  # verl's reduce_metrics averages the mini-batches
    single = (
        sum(
            core_mini_batch_loss(
                core_method(with_ar=True, with_lopti=False), None, rollout, rows, rollout.logp_BT, rollout.entropy_BT
            ).item()
            for rows in ([0, 1, 2, 3], [4, 5, 6, 7])
        )
        / 2
    )
    for name in PASSES:
        assert abs(metrics[f"actor/pg_loss/{name}"] - expected[name]) < 1e-10
    assert abs(metrics["actor/pg_loss"] - single) < 1e-10  # the passes' sum = the single-pass loss
    assert metrics["actor/grad_norm/lopti_low"] == 1.0 and metrics["actor/grad_norm"] == 2.0  # mean over passes
    assert metrics["perf/mfu/actor"] == 0.5 and metrics["actor/entropy"] == 0.25


# --------------------------------------------------------------------------- (4) the launcher writes nothing here


def test_preset_dry_run_validates_and_writes_nothing_in_the_working_directory(tmp_path, tmp_path_factory):
    scratch = tmp_path_factory.mktemp("tmpdir")  # TMPDIR: where the dry run's hydra log goes
    env = {
        **os.environ,
        "DRY_RUN": "1",
        "TMPDIR": str(scratch),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    script = str(REPO / "examples/verl/kk_ar_lopti.sh")
    result = subprocess.run(
        ["bash", script, "trainer.total_epochs=1"],
        cwd=tmp_path,
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "tokenbalance: config valid (dry run, nothing launched)" in result.stdout
    assert f"trainer_mode: {LOPTI_TRAINER}" in result.stdout and "    lopti: eta=0.5," in result.stdout
    assert list(tmp_path.iterdir()) == []  # no hydra outputs/ (nor runs/) where it was started
    assert [path.name.startswith("tokenbalance-verl-dry-run-") for path in scratch.iterdir()] == [True]


def test_launcher_run_dir_defaults_keep_hydra_out_of_the_working_directory():
    from tokenbalance.integrations.verl.main import RUN_DIR, with_default_run_dir

    assert with_default_run_dir(["a=1"], dry_run=False) == ["a=1", f"hydra.run.dir={RUN_DIR}"]
    assert RUN_DIR.startswith("runs/")  # git-ignored
    dry = with_default_run_dir(["a=1"], dry_run=True)
    assert dry[-1] == "hydra.output_subdir=null" and Path(dry[1].split("=", 1)[1]).is_dir()
    Path(dry[1].split("=", 1)[1]).rmdir()
    assert with_default_run_dir(["hydra.run.dir=/x"], dry_run=True) == ["hydra.run.dir=/x"]  # the user's wins
