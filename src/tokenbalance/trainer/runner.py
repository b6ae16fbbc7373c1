"""From a config to a finished run: the checks before any work, device, distributed setup, the
policy, the run directory (claimed and locked), the loop, and the before/after table. Shared by
``tokenbalance train`` and the tests.

Order (docs/reliability.md): everything that can be checked without a model first
(:func:`check_before_work`: seconds), then the run directory is locked and, on ``--resume``,
repaired (interrupted writes cleaned, a lost ``latest`` pointer recovered, the checkpoint's files
read); only then the embedded policy build or the model load.
"""

from __future__ import annotations

import json
import netrc
import os
import time
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlparse

import torch

from tokenbalance.checks import check_choice
from tokenbalance.config import OutputConfig, RunConfig, absolute_paths, load_config
from tokenbalance.diagnostics.sinks import parse_metrics_lines, read_metrics
from tokenbalance.extras import missing_package
from tokenbalance.outputs import check_writable_dir
from tokenbalance.run.checkpoints import STATE_FILE, checkpoint_step, latest_checkpoint, verify_checkpoint
from tokenbalance.run.lock import RunLock
from tokenbalance.run.repair import check_new_run_dir, clean_interrupted_writes, recover_latest, undo_failed_start
from tokenbalance.run.resume import RESUMABLE_KEYS, changed_setting
from tokenbalance.run.state import LOG_FILE, RunStatus, resume_command, run_status
from tokenbalance.trainer.distributed import DistContext, barrier, init_distributed
from tokenbalance.trainer.progress import progress_log

REPORTING_EXTRAS = ("tensorboard", "wandb")  # output flags named as their extras (tokenbalance.extras)
WANDB_OPTIONS = ("wandb_project", "wandb_entity", "wandb_name", "wandb_mode")
WANDB_ENV_MODES = ("offline", "online", "disabled", "dryrun", "run")  # what wandb takes from WANDB_MODE


def has_wandb_login(environ: Mapping[str, str]) -> bool:
    """Whether W&B can log in online without asking: ``WANDB_API_KEY``, or an entry for the W&B
    host (``WANDB_BASE_URL``, default api.wandb.ai) in the netrc file ``wandb login`` writes."""
    if environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    path = environ.get("NETRC") or os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_problem(output: OutputConfig, environ: Mapping[str, str]) -> str | None:
    """Why the W&B settings cannot work as given, checked before the model loads (None when they
    can): a ``wandb_*`` option set while ``output.wandb`` is off (it would be ignored), a
    ``WANDB_MODE`` that is not a W&B mode, or online logging without a login."""
    defaults = OutputConfig()
    if not output.wandb:
        given = [name for name in WANDB_OPTIONS if getattr(output, name) != getattr(defaults, name)]
        if given:
            return (
                f"output.{given[0]}={getattr(output, given[0])!r}: applies only with output.wandb=true (W&B is off "
                "and would ignore it); set output.wandb=true or leave it out"
            )
        return None
    env_mode = environ.get("WANDB_MODE") or None
    if env_mode is not None and env_mode not in WANDB_ENV_MODES:
        return (
            f"WANDB_MODE={env_mode!r} in the environment (it wins over output.wandb_mode): not a W&B mode; valid: "
            "offline, online, disabled; fix or unset it"
        )
    mode = env_mode or output.wandb_mode
    if mode in ("online", "run") and not has_wandb_login(environ):
        return (
            "output.wandb: W&B online needs a login and this machine has none (no WANDB_API_KEY, no netrc entry); "
            "run `wandb login`, or log offline with output.wandb_mode=offline (`wandb sync` uploads it later)"
        )
    return None


def check_before_work(config: RunConfig, *, run_dir: Path | None = None, resume: bool = False) -> None:
    """What can be checked without a model, before the (possibly minutes-long) SFT build or model
    load: the method (already resolved when the config was built), the device, the task's template,
    the data (files exist and follow the schema, gold answers agree with the rows' own solution
    columns), the policy directory's files and, with its tokenizer, the task's tags and every
    prompt's length, the reporting extras and W&B settings (:func:`wandb_problem`), and where the run writes: a new run needs a new or
    empty, writable ``run_dir``; the embedded policy's cache directory must be writable when the
    policy has to be built. With ``data.reward`` (your function): a policy is given, the function
    imports and is callable, every row has the prompt and the columns it takes, chat prompts
    render with the policy's chat template, and it returns a reward for the empty response on the
    first rows of each file."""
    from tokenbalance.algorithms.token_rules import probe_rule
    from tokenbalance.models.loading import check_policy_dir, check_special_tokens, load_checked_tokenizer
    from tokenbalance.tasks import get_task
    from tokenbalance.tasks.function import FunctionTask
    from tokenbalance.trainer.data import eval_examples, function_task_for_run, rl_examples
    from tokenbalance.trainer.embedded import embedded_key
    from tokenbalance.trainer.scoring import encode_prompts
    from tokenbalance.trainer.sft import check_sft_target, row_pairs

    rule = config.method().token_rule
    if rule is not None:
        probe_rule(rule)  # a rule that raises or returns the wrong thing: named now, not after a rollout
    if config.data.reward is not None and config.model.path is None and config.data.target_column is None:
        raise ValueError(
            "data.reward: give the policy to train with --model PATH (a Hugging Face model directory), or "
            "--target-column NAME (the column holding a good response to each prompt) to build the embedded tiny "
            "model on your rows and warm-start it on that column"
        )
    if config.data.target_column is not None and config.model.path is not None and not resume:
        raise ValueError(
            f"data.target_column={config.data.target_column!r}: it builds the embedded tiny model on your rows, "
            "without --model; to warm-start your own model on it, run `tokenbalance sft --model PATH --out DIR "
            "--target-column NAME` (with the same --data, --eval-data, --reward) and train --model DIR"
        )
    task = get_task(config.data.task)  # data.reward: imports your function (not found, not callable: named)
    check_choice("data.template", config.data.template, task.templates)
    if config.model.path is None:
        check_sft_target(task, config.sft)
    resolve_device(config.train.device)
    for key in ("train_file", "eval_file"):
        path = getattr(config.data, key)
        if path is not None and not Path(path).is_file():
            raise ValueError(f"data.{key}={path!r}: no such file")
    for flag in REPORTING_EXTRAS:
        module = missing_package(flag) if getattr(config.output, flag) else None
        if module is not None:
            raise ValueError(f"output.{flag}=true needs the {module} package: pip install {module}")
    problem = wandb_problem(config.output, os.environ)
    if problem:
        raise ValueError(problem)
    if run_dir is not None and not resume:
        check_new_run_dir(run_dir)
    tokenizer = None
    if config.model.path is not None:
        tokenizer = load_checked_tokenizer(check_policy_dir(config.model.path))
        if config.data.reward is not None:
            task = function_task_for_run(config.data, tokenizer)  # chat prompts: the policy's template
    train_examples, evals = rl_examples(config.data), eval_examples(config.data)
    if config.model.path is None and config.data.reward is not None:
        row_pairs(config.data)  # every row has its target: before the tokenizer and model are built on them
    if tokenizer is not None:
        check_real_model_settings(config, tokenizer)
        check_special_tokens(tokenizer, task.special_tokens)
        encode_prompts(tokenizer, train_examples, config.data.max_prompt_tokens)
        encode_prompts(tokenizer, evals, config.data.max_prompt_tokens)
    elif not (Path(config.model.cache_dir) / embedded_key(config) / "tokenbalance_sft.json").is_file():
        check_writable_dir(config.model.cache_dir, "model.cache_dir")
    if isinstance(task, FunctionTask):
        task.check_reward(train_examples)
        task.check_reward(evals)


def check_real_model_settings(config: RunConfig, tokenizer) -> None:
    """``ValueError`` when a chat model (its tokenizer has a chat template; the embedded tiny
    tokenizer has none) meets the tiny model's prompt template, naming the settings that fit it
    (:data:`~tokenbalance.config.REAL_MODEL_SETTINGS`): the terse ``compact`` prompt and a 48-token
    budget score every answer -3, which no RL step can learn from."""
    from tokenbalance.config import DEFAULT_TEMPLATE, REAL_MODEL_SETTINGS

    if config.data.template != DEFAULT_TEMPLATE or not getattr(tokenizer, "chat_template", None):
        return
    flags = " ".join(f"--set {key}={value}" for key, value in REAL_MODEL_SETTINGS)
    raise ValueError(
        f"model.path={config.model.path}: a chat model (its tokenizer has a chat template) with "
        f"data.template={DEFAULT_TEMPLATE!r}, the embedded tiny model's prompt, scores every answer as a format "
        f"error; pass {flags} (the settings of docs/results.md's SmolLM2 runs), or another data.template"
    )


def compute_device(config: RunConfig) -> torch.device:
    """The device a command computes on, with this process's torch threads set from
    ``train.threads`` (:func:`tokenbalance.threads.use_threads`). A fixed count stays in the config;
    0 stays 0 (automatic: the RL loop then adapts the count to the load, ``timing/threads``)."""
    from tokenbalance.threads import use_threads

    use_threads(config.train.threads)
    return resolve_device(config.train.device)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"train.device={name!r}: unknown device; valid: auto, cpu, cuda, cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"train.device={name!r}: CUDA is not available on this machine; use cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(
            f"train.device={name!r}: this machine has {torch.cuda.device_count()} CUDA device(s) "
            f"(cuda:0..cuda:{torch.cuda.device_count() - 1})"
        )
    if device.type not in ("cpu", "cuda"):
        available = getattr(torch.backends, device.type, None)
        if available is None or not getattr(available, "is_available", lambda: False)():
            raise ValueError(f"train.device={name!r}: not available on this machine; valid: auto, cpu, cuda, cuda:N")
    if device.type == "cuda" and "LOCAL_RANK" in os.environ and device.index is None:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return device


def default_run_dir(config: RunConfig) -> Path:
    return Path("runs") / f"{config.method().name}-{time.strftime('%Y%m%d-%H%M%S')}"  # a token rule's own name


def policy_path(config: RunConfig, device: torch.device, ctx: DistContext, log) -> str:
    """``model.path``, or the embedded tiny policy (built by rank 0, reused by the others)."""
    if config.model.path is not None:
        return config.model.path
    from tokenbalance.trainer.embedded import ensure_embedded_policy

    if not ctx.is_main:
        barrier(ctx)
    path = ensure_embedded_policy(
        config,
        device=device,
        progress=config.output.progress and ctx.is_main,
        log=log if ctx.is_main else (lambda *_: None),
    )
    if ctx.is_main:
        barrier(ctx)
    return str(path)


def before_after_table(run_dir: Path) -> str:
    """Held-out accuracy per difficulty and mean reward at the first and the last evaluation of a
    run (the reward is what moves on a task of your own whose responses are seldom fully right)."""
    evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("kind") == "eval"]
    if not evals:
        return "no evaluation logged"
    first, last = evals[0], evals[-1]
    keys = sorted({k for k in first if k.startswith("eval/") and ("/acc" in k or k.endswith("/reward"))})
    lines = [
        f"{'held-out accuracy, reward':<28}{'step ' + str(first['step']):>10}{'step ' + str(last['step']):>10}"
        f"{'change':>10}"
    ]
    for key in keys:
        before, after = first[key], last.get(key, float("nan"))
        lines.append(f"{key.removeprefix('eval/'):<28}{before:>10.3f}{after:>10.3f}{after - before:>+10.3f}")
    return "\n".join(lines)


def load_run_policy(config: RunConfig, path: str, *, embedded: bool, device: torch.device):
    """``load_policy`` at the run's dtype; a damaged embedded policy's message says how to rebuild it."""
    from tokenbalance.models import load_policy

    try:
        return load_policy(path, device=device, dtype=getattr(torch, config.model.dtype))
    except ValueError as err:
        if not embedded:
            raise
        raise ValueError(
            f"{err}. This is the cached embedded policy: delete {path} and the next run builds it again"
        ) from None


def check_checkpoint_config(checkpoint: Path, config: RunConfig) -> None:
    """``ValueError`` when ``config`` differs from the config ``checkpoint`` recorded (its
    ``trainer_state.json``; checkpoints written before it recorded one are not checked) outside
    :data:`~tokenbalance.run.resume.RESUMABLE_KEYS`."""
    from tokenbalance.config import from_dict

    recorded = json.loads((checkpoint / STATE_FILE).read_text()).get("config")
    if not isinstance(recorded, dict):
        return
    changed = changed_setting(from_dict(RunConfig, recorded), config)
    if changed is not None:
        key, before, after = changed
        raise ValueError(
            f"{checkpoint.parent.parent / 'config.yaml'}: {key} is {after!r}, but the run was trained with {before!r} "
            f"(its checkpoint {checkpoint.name}); a resume may change only {', '.join(RESUMABLE_KEYS)}. Put it back, "
            f"or start a new run from the checkpoint's weights: --model {checkpoint / 'model'} --run-dir NEW_DIR"
        )


def repair_for_resume(run_dir: Path, log, config: RunConfig | None = None) -> None:
    """Before a resume does any work (the lock held): remove what an interrupted write left, re-point
    a lost ``latest`` at the newest complete checkpoint, read that checkpoint's files, check that
    ``config`` (the run's config.yaml with the resume's changes) is still the config the checkpoint
    was trained with outside the settings a resume may change (an edited ``config.yaml`` is refused,
    naming the key), and check ``metrics.jsonl`` (a torn last line is reported here and dropped by
    the loop)."""
    removed = clean_interrupted_writes(run_dir)
    if removed:
        log(f"removed what an interrupted write left in {run_dir}: {', '.join(removed)}")
    note = recover_latest(run_dir)
    if note:
        log(note)
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is not None:
        verify_checkpoint(checkpoint)
        if config is not None:
            check_checkpoint_config(checkpoint, config)
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        _, torn = parse_metrics_lines(metrics)
        if torn is not None:
            log(f"{metrics}: its last line is torn (an interrupted write) and is dropped: {torn[:60]!r}")
    if run_status(run_dir) is RunStatus.RUNNING:
        log(f"{run_dir}: the previous process ended without recording how (status 'running'); resuming")


def stopped_message(run_dir: Path, reason: str) -> str:
    """Where a stopped run stands and the command that continues it."""
    if not (run_dir / "config.yaml").is_file():
        return f"{reason}; nothing was trained yet in {run_dir}: run the same command again"
    step = checkpoint_step(run_dir)
    where = f"its last checkpoint is step {step}" if step else "it has no checkpoint yet (a resume starts at step 0)"
    return f"{reason}; the run in {run_dir} stopped ({where}). Continue it with: {resume_command(run_dir)}"


def run_training(config: RunConfig | None, *, run_dir: Path | None = None, resume: bool = False, log=print) -> Path:
    """Train per ``config`` (or continue ``run_dir`` when ``resume``); returns the run directory."""
    from tokenbalance.trainer.data import reused_examples
    from tokenbalance.trainer.loop import prepare_training, train

    if resume:
        if run_dir is None or not (Path(run_dir) / "config.yaml").is_file():
            raise ValueError(f"--resume {run_dir}: not a run directory (no config.yaml)")
        if config is None:  # the saved config as it is (the CLI passes it with the changes a resume allows)
            config = load_config(Path(run_dir) / "config.yaml")
    if config is None:
        raise ValueError("run_training: a config is required unless resuming a run directory")
    run_dir = Path(run_dir) if run_dir is not None else Path(config.output.run_dir or default_run_dir(config))
    main_rank = os.environ.get("RANK", "0") == "0"
    with reused_examples():
        check_before_work(config, run_dir=run_dir if main_rank else None, resume=resume)  # paths as given
        run_dir = Path(os.path.abspath(run_dir))
        config = absolute_paths(config)  # config.yaml names files the same from any working directory
        config.output.run_dir = str(run_dir)
        device = compute_device(config)  # train.threads=0 stays 0: the loop adapts the count
        ctx = init_distributed(device)
        lock = RunLock(run_dir).acquire() if ctx.is_main else None
        with progress_log(run_dir / LOG_FILE if ctx.is_main else None):
            try:
                if resume and ctx.is_main:
                    repair_for_resume(run_dir, log, config)
                torch.manual_seed(config.train.seed)
                embedded = config.model.path is None
                config.model.path = policy_path(config, device, ctx, log)
                policy, tokenizer = load_run_policy(config, config.model.path, embedded=embedded, device=device)
                parts = prepare_training(config, run_dir, policy, tokenizer, device, ctx, resume=resume)
                if ctx.is_main:
                    log(
                        f"run directory: {run_dir}  (method {config.train.method}, steps "
                        f"{parts.start_step}..{config.train.steps}, rollout engine {type(parts.runtime.engine).__name__})"
                    )
                try:
                    train(parts)
                except Exception:
                    if ctx.is_main and not resume:  # failed before its first status: the same command runs again
                        undo_failed_start(run_dir)
                    raise
            except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM (the CLI raises it): say how to continue
                raise KeyboardInterrupt(stopped_message(run_dir, str(err) or "interrupted")) from None
            except OSError as err:  # a full disk, a lost mount: an environment error, not a bug
                what = f"{err.strerror or err}" + (f": {err.filename}" if err.filename else "")
                raise ValueError(stopped_message(run_dir, f"cannot write ({what})")) from None
            finally:
                if lock is not None:
                    lock.release()
    if ctx.is_main:
        log(before_after_table(run_dir))
        log(f"status: {run_status(run_dir)}; metrics: {run_dir / 'metrics.jsonl'}")
    return run_dir
