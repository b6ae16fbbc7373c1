"""Run verl 0.9's own trainer on this CPU: inputs, command line, subprocess, metrics.

The pytest side of the harness (imports no verl). :func:`prepare_inputs` writes a tiny local Llama
and a few K&K prompts; :func:`cpu_overrides` is the hydra command line that puts verl on the CPU
(the settings from docs/verl.md, "End to end on CPU"); :func:`run_verl` starts
``python -m tokenbalance.integrations.verl.main`` with them in a subprocess under a timeout (a
wrong Ray CPU count hangs instead of failing) and returns the per-step metrics that verl's
``file`` logger wrote (one JSON line per step: ``{"step": n, "data": {key: value}}``).

The child and every Ray worker get ``PYTHONPATH`` = this checkout's ``src`` and repository
root (derived from where the packages were imported from), plus ``VERL_USE_EXTERNAL_MODULES``
naming :mod:`.hook`, ``VERL_PLATFORM=cpu`` and ``VERL_ENGINE_DEVICE=cuda`` (verl registers its
FSDP engine for cuda / npu only; the engine itself then runs on ``get_device_name() == "cpu"``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import tokenbalance

REPO_ROOT = Path(__file__).resolve().parents[3]
SRC_DIR = Path(tokenbalance.__file__).resolve().parents[1]
HOOK_MODULE = "tests.integrations.verl_cpu.hook"
REWARD_MODULE = REPO_ROOT / "tests" / "integrations" / "verl_cpu" / "reward.py"

PROMPTS_PER_STEP = 2
GROUP_SIZE = 4
MAX_PROMPT_LENGTH = 256  # K&K, 2 people, plain template: 165-180 tokens with the 512-token tokenizer
MAX_RESPONSE_LENGTH = 16
VOCABULARY = 512  # the tiny tokenizer's size


def child_env(run_dir: Path) -> dict[str, str]:
    """Environment of the launcher and (through ``ray_init.runtime_env``) of every Ray worker."""
    return {
        "PYTHONPATH": os.pathsep.join([str(SRC_DIR), str(REPO_ROOT)]),
        "VERL_USE_EXTERNAL_MODULES": HOOK_MODULE,
        "VERL_PLATFORM": "cpu",
        "VERL_ENGINE_DEVICE": "cuda",
        "VERL_FILE_LOGGER_PATH": str(run_dir / "metrics.jsonl"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "disabled",
        "RAY_DEDUP_LOGS": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
    }


def prepare_inputs(root: Path) -> dict[str, Path]:
    """A tiny Llama (2 layers, hidden 32, 512-token K&K tokenizer) and K&K parquet files.

    Returns paths ``model``, ``train`` (8 prompts, 2 people) and ``val`` (4 prompts).
    """
    from tokenbalance.cli import main as tokenbalance_cli
    from tokenbalance.models import TinyModelConfig, build_tiny_model, save_policy, train_tokenizer
    from tokenbalance.tasks.kk import tokenizer_corpus

    tokenizer = train_tokenizer(tokenizer_corpus((2, 3), count=40), vocab_size=VOCABULARY)
    config = TinyModelConfig(
        hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_position_embeddings=512
    )
    model_dir = save_policy(build_tiny_model(config, tokenizer, seed=0), tokenizer, root / "tiny")
    paths = {"model": model_dir, "train": root / "kk_train.parquet", "val": root / "kk_val.parquet"}
    for split, count in (("train", 8), ("test", 4)):
        path = paths["train" if split == "train" else "val"]
        arguments = ["gen-data", "kk", "--people", "2", "--split", split, "--count", str(count)]
        tokenbalance_cli([*arguments, "--template", "plain", "--out", str(path), "--quiet"])
    return paths


def cpu_overrides(inputs: dict[str, Path], run_dir: Path, *, ranks: int = 1, steps: int = 2) -> list[str]:
    """verl overrides for a ``steps``-step run on ``ranks`` CPU data-parallel ranks.

    GRPO-style K&K settings scaled down (2 prompts x 4 samples, 16-token responses, one
    mini-batch per step, two micro-batches), float32 FSDP2, the ``hf_cpu`` rollout, the varying
    test reward (:mod:`.reward`), validation and checkpoints off (callers turn them on).
    """
    env = child_env(run_dir)
    env_overrides = [f"+ray_kwargs.ray_init.runtime_env.env_vars.{key}='{value}'" for key, value in env.items()]
    fp32 = "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
    micro = GROUP_SIZE * PROMPTS_PER_STEP // (2 * ranks)
    return [
        f"data.train_files={inputs['train']}",
        f"data.val_files={inputs['val']}",
        f"data.train_batch_size={PROMPTS_PER_STEP}",
        f"data.max_prompt_length={MAX_PROMPT_LENGTH}",
        f"data.max_response_length={MAX_RESPONSE_LENGTH}",
        "data.dataloader_num_workers=0",
        "data.shuffle=False",
        f"actor_rollout_ref.model.path={inputs['model']}",
        "actor_rollout_ref.model.custom_chat_template='{{ messages[0].content }}'",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.ref.strategy=fsdp2",
        f"+actor_rollout_ref.actor.fsdp_config.mixed_precision={fp32}",
        f"+actor_rollout_ref.ref.fsdp_config.mixed_precision={fp32}",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
        "actor_rollout_ref.ref.fsdp_config.use_torch_compile=False",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS_PER_STEP}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.entropy_coeff=0.0",
        "algorithm.use_kl_in_reward=False",
        "actor_rollout_ref.rollout.name=hf_cpu",
        f"actor_rollout_ref.rollout.n={GROUP_SIZE}",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.free_cache_engine=False",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "reward.num_workers=1",
        f"reward.custom_reward_function.path={REWARD_MODULE}",
        "reward.custom_reward_function.name=compute_score",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "ray_kwargs.ray_init.num_cpus=16",  # logical; with 2, verl's actors wait for CPUs forever
        f"+ray_kwargs.ray_init.num_gpus={ranks}",  # logical "GPU" resource of the cpu platform
        "+ray_kwargs.ray_init.include_dashboard=False",
        *env_overrides,
        "trainer.device=cpu",
        f"trainer.n_gpus_per_node={ranks}",
        "trainer.nnodes=1",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[console,file]",
        "trainer.project_name=tokenbalance_cpu",
        f"trainer.default_local_dir={run_dir / 'checkpoints'}",
        f"hydra.run.dir={run_dir / 'hydra'}",
    ]


@dataclass
class VerlRun:
    """A finished launch: exit status, wall time, its output's tail and the per-step metrics."""

    returncode: int
    wall_s: float
    log_tail: str
    steps: dict[int, dict[str, float]]


def read_metrics(path: Path) -> dict[int, dict[str, float]]:
    """verl's ``file`` logger lines -> ``{step: metrics}`` (validation lines merge into their step)."""
    steps: dict[int, dict[str, float]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            steps.setdefault(int(record["step"]), {}).update(record["data"])
    return steps


def run_verl(overrides: list[str], run_dir: Path, *, timeout_s: float) -> VerlRun:
    """Launch verl's trainer with ``overrides`` in a fresh process group; kill it all on timeout.

    The launcher starts its own Ray cluster (``ray.init`` in the child); the whole process group
    (Ray's raylet, GCS and workers included) is terminated when the run ends or times out.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    # Ray's socket paths must stay short (AF_UNIX limit), so its temp dir is not under run_dir
    ray_tmp = tempfile.mkdtemp(prefix="tbray-")
    env = {**os.environ, **child_env(run_dir), "RAY_TMPDIR": ray_tmp}
    command = [sys.executable, "-m", "tokenbalance.integrations.verl.main", *overrides]
    log_path = run_dir / "launch.log"
    start = time.monotonic()
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command, cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            returncode = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            returncode = -signal.SIGKILL
        finally:
            _kill_group(process.pid)
            shutil.rmtree(ray_tmp, ignore_errors=True)
    wall_s = time.monotonic() - start
    log_tail = log_path.read_text(errors="replace")[-6000:]
    return VerlRun(returncode, wall_s, log_tail, read_metrics(run_dir / "metrics.jsonl"))


def _kill_group(pid: int, grace_s: float = 5.0) -> None:
    """Terminate the launcher's process group (Ray daemons and workers); kill what is left after ``grace_s``."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)  # raises once no process of the group is left
        except ProcessLookupError:
            return
        time.sleep(0.2)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
