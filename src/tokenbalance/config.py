"""Typed run configuration: one source of truth for defaults, help text and validation.

A :class:`RunConfig` tree of small dataclasses whose fields declare default, help and valid values (:func:`option`);
YAML in and out, dotted overrides (``train.steps=20``, ``method.lopti.eta=0.4``); the method is resolved when the
config is built, so a typo fails before any work (docs/training.md)."""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tokenbalance.algorithms.describe import method_options
from tokenbalance.algorithms.methods import Method
from tokenbalance.algorithms.presets import RULE_EXAMPLE, merged_overrides, normalized_overrides, resolve_method
from tokenbalance.algorithms.registry import did_you_mean
from tokenbalance.checks import check_choice
from tokenbalance.diagnostics.config import DiagnosticsConfig
from tokenbalance.options import field_types, is_string_field, option, path_fields, validate
from tokenbalance.outputs import write_text_atomic
from tokenbalance.tasks.base import SFT_TARGETS
from tokenbalance.tasks.function import FUNCTION_TASK, PROMPT_FORMATS, normalized_reward_spec
from tokenbalance.tasks.registry import DEFAULT_TASK, TASK_NAMES
from tokenbalance.user_code import is_spec, normalized_spec

METHOD_PREFIX = "method."
# data.eval_set -> the Task.example_source use it evaluates
EVAL_SET_USES = {"test": "eval", "validation": "validation"}
DEFAULT_TEMPLATE = "compact"
# What a real (chat) model needs where the defaults suit the embedded tiny model: the settings of docs/results.md's
# SmolLM2-135M-Instruct runs (Logic-RL's ChatML prompt, its ~300-token prompts, room for a reasoning trace).
# run.setup.prepare names them when a chat model meets the defaults.
REAL_MODEL_SETTINGS = (
    ("data.template", "qwen-instruct"),
    ("data.max_prompt_tokens", 320),
    ("rollout.max_new_tokens", 400),
)


@dataclass
class ModelConfig:
    path: str | None = option(
        None,
        "local Hugging Face model directory; None builds (or reuses) the embedded tiny model, SFT-warmed on K&K",
        nullable=True,
        path=True,
    )
    arch: str = option("llama", "architecture of the embedded tiny model", choices=("llama", "qwen2"))
    hidden_size: int = option(128, "embedded model hidden size", low=8, high=8192)
    num_layers: int = option(4, "embedded model layers", low=1, high=128)
    num_heads: int = option(4, "embedded model attention heads", low=1, high=128)
    intermediate_size: int = option(512, "embedded model MLP size", low=8, high=65536)
    vocab_size: int = option(
        1024,
        "embedded tokenizer vocabulary, at most (byte-level BPE trained on task text; a corpus with fewer "
        "merges to learn gives fewer: the build's log line says the real size)",
        low=300,
        high=65536,
    )
    attn_implementation: str = option("sdpa", "attention kernel", choices=("sdpa", "eager"))
    dtype: str = option(
        "float32",
        "parameter dtype (bfloat16 / float16 store the weights in half precision: refused when an AdamW step of "
        "optim.lr would round away at the policy's typical |w|; model.autocast keeps float32 weights instead)",
        choices=("float32", "bfloat16", "float16"),
    )
    autocast: str = option(
        "off",
        "compute type of every forward (rollout, old / reference / current log-probs, evaluation) through "
        "torch.autocast, the weights staying model.dtype=float32 and the log-softmax, losses and optimizer state "
        "float32: off, or bfloat16 (CPUs with AVX-512 BF16 or AMX, and GPUs); float16 is refused (it would need "
        "a gradient scaler)",
        choices=("off", "bfloat16", "float16"),
    )
    cache_dir: str = option(".cache/tokenbalance", "where the embedded tokenizer and SFT policy are cached", path=True)

    def __post_init__(self) -> None:
        if self.autocast == "float16":
            raise ValueError(
                "model.autocast=float16: float16 needs a gradient scaler, which the trainer does not have; "
                "use model.autocast=bfloat16"
            )
        if self.autocast != "off" and self.dtype != "float32":
            raise ValueError(
                f"model.autocast={self.autocast} keeps float32 master weights: it needs model.dtype=float32, "
                f"got model.dtype={self.dtype}"
            )


class _DataTasks(Sequence):
    """``data.task``'s choices: the registered task names (what help and messages list) and ``function``, the task of
    ``data.reward``, which the config names but never registers."""

    def __getitem__(self, index):
        return TASK_NAMES[index]

    def __len__(self) -> int:
        return len(TASK_NAMES)

    def __contains__(self, name: object) -> bool:
        return name == FUNCTION_TASK or name in TASK_NAMES


DATA_TASKS: Sequence[str] = _DataTasks()


@dataclass
class DataConfig:
    # the choices are the registry's names when validated
    task: str = option(DEFAULT_TASK, "task name ('function' when data.reward is set)", choices=DATA_TASKS)
    template: str = option(
        DEFAULT_TEMPLATE,
        "prompt template (compact: terse statements, no instruction, for tiny models; plain: the natural-language "
        "quiz without special tokens); with data.reward, how the prompt column becomes the prompt: auto (text as "
        "is, chat messages through the policy's chat template), text, or chat (text becomes one user message)",
    )
    train_difficulties: tuple[int, ...] = option(
        (3,),
        "K&K people / arith levels to train on (SFT and RL); "
        "the default is 3 people: the tiny model stays at chance on "
        "2 people, whose ~300 RL puzzles are its SFT puzzles too "
        "(docs/results.md)",
        default_factory=lambda: (3,),
    )
    eval_difficulties: tuple[int, ...] = option(
        (3,), "difficulties evaluated (per-difficulty accuracy)", default_factory=lambda: (3,)
    )
    train_file: str | None = option(
        None, "train parquet/JSONL (Logic-RL / DeepScaleR schema) instead of generated data", nullable=True, path=True
    )
    eval_file: str | None = option(None, "evaluation parquet/JSONL instead of generated data", nullable=True, path=True)
    reward: str | None = option(
        None,
        "your reward function, MODULE:FUNCTION or FILE.py:FUNCTION, called as fn(response, **row) on the rows of "
        "data.train_file and data.eval_file (both required); makes data.task 'function' (docs/tasks.md)",
        nullable=True,
    )
    prompt_column: str = option(
        "prompt", "with data.reward: the column holding each row's prompt (text, or chat messages)"
    )
    target_column: str | None = option(
        None,
        "with data.reward: the column holding a good response to each prompt of data.train_file; without "
        "model.path the embedded tiny tokenizer and model are built on your rows (prompts and targets) and "
        "SFT-warmed on the targets (docs/tasks.md)",
        nullable=True,
    )
    max_reward: float = option(
        1.0,
        "with data.reward: the reward of a correct response (reward/acc and eval/*/acc count rewards equal to it)",
        low=-1e6,
        high=1e6,
    )
    eval_count: int = option(
        1000,
        "held-out examples per difficulty (K&K 2 people: at most 100); 1000 resolves a few points of accuracy",
        low=1,
        high=10**6,
    )
    rl_count: int = option(
        1900,
        "generated RL prompts per difficulty (K&K 3+ people: the first 900 are the Logic-RL train puzzles, at "
        "most 1900; K&K 2 people: always its 298)",
        low=1,
        high=10**6,
    )
    eval_set: str = option(
        "test",
        "generated examples evaluated: test (the held-out puzzles results report) or validation (a disjoint "
        "generator range for choosing settings, so nothing is tuned on the test puzzles)",
        choices=tuple(EVAL_SET_USES),
    )
    max_prompt_tokens: int = option(256, "prompts longer than this are an error", low=8, high=10**6)

    def __post_init__(self) -> None:
        """With ``data.reward``: the task is ``function`` (your function's, built by
        :func:`tokenbalance.run.examples.task_for`, never registered), the template one of its prompt formats (the
        default becomes ``auto``), both files given."""
        if not isinstance(self.reward, str) or not self.reward:  # None, or a wrong type validate() names
            if self.target_column is not None:
                raise ValueError(
                    f"data.target_column={self.target_column!r}: the target column of your rows goes with your reward "
                    "function (--reward MODULE:FUNCTION); a generated task (kk, arith) writes its own SFT targets"
                )
            if self.task == FUNCTION_TASK:
                raise ValueError(
                    "data.task='function' is your reward function's task: set data.reward=MODULE:FUNCTION "
                    "(tokenbalance train --reward) instead"
                )
            for key, flag in (("prompt_column", " (--prompt-column)"), ("max_reward", "")):
                value, default = getattr(self, key), getattr(type(self), key, None)
                if default is not None and value != default:
                    raise ValueError(
                        f"data.{key}={value!r}{flag}: applies only with data.reward (your reward function; "
                        f"--reward); {self.task}'s data has its own prompts and rewards. Leave it out, or set data.reward"
                    )
            return
        self.reward = normalized_reward_spec(self.reward)
        if self.task not in (DEFAULT_TASK, FUNCTION_TASK):
            raise ValueError(
                f"data.task={self.task!r}: data.reward replaces the task's reward with yours; leave data.task "
                f"unset (it becomes {FUNCTION_TASK!r})"
            )
        self.task = FUNCTION_TASK
        if self.template == DEFAULT_TEMPLATE:
            self.template = PROMPT_FORMATS[0]
        check_choice("data.template", self.template, PROMPT_FORMATS)
        for key, flag in (("train_file", "--data"), ("eval_file", "--eval-data")):
            if getattr(self, key) is None:
                raise ValueError(
                    f"data.{key}: data.reward needs your {'prompts' if key == 'train_file' else 'held-out prompts'} "
                    f"in a parquet/JSONL file ({flag} FILE)"
                )


@dataclass
class RolloutConfig:
    engine: str = option(
        "auto",
        "rollout engine: auto (fast for a Llama / Qwen2 model of at most 100M parameters on a CPU or 1B on a CUDA "
        "GPU, where each decode step is replayed as a CUDA graph: measured faster there; hf otherwise), fast (a "
        "preallocated-KV-cache decode loop) or hf (Hugging Face generate)",
        choices=("auto", "fast", "hf"),
    )
    prompts_per_step: int = option(16, "prompts per RL step", low=1, high=10**6)
    group_size: int = option(8, "responses per prompt (G)", low=1, high=1024)
    max_new_tokens: int = option(48, "response budget in tokens", low=1, high=10**6)
    temperature: float = option(
        1.0, "sampling temperature (also the log-prob temperature)", low=0.0, low_open=True, high=10.0
    )
    top_p: float = option(1.0, "nucleus sampling", low=0.0, low_open=True, high=1.0)
    top_k: int = option(0, "top-k sampling (0 = off)", low=0, high=10**6)
    old_logprobs: str = option(
        "recompute",
        "old-policy log-probs: recompute them with a forward pass (the "
        "reference's way), or take the sampler's (no forward; equal up to float rounding "
        "for a float32 model; needs top_p=1, top_k=0; NTHR still runs the forward; the "
        "bucket statistics then lack the old-policy entropy)",
        choices=("recompute", "sampler"),
    )

    def __post_init__(self) -> None:
        if self.old_logprobs == "sampler" and (self.top_p != 1.0 or self.top_k != 0):
            raise ValueError(
                f"rollout.old_logprobs='sampler' needs the untruncated distribution (top_p=1, top_k=0), "
                f"got top_p={self.top_p}, top_k={self.top_k}: the sampler's log-probs are of the "
                "truncated one"
            )


@dataclass
class OptimConfig:
    lr: float = option(
        1e-4,
        "AdamW learning rate (constant); 1e-4 is chosen for the embedded tiny model on validation puzzles "
        "(docs/results.md): lower it for real models",
        low=0.0,
        low_open=True,
        high=1.0,
    )
    beta1: float = option(0.9, "AdamW beta1", low=0.0, high=1.0)
    beta2: float = option(0.99, "AdamW beta2", low=0.0, high=1.0)
    weight_decay: float = option(0.01, "AdamW weight decay", low=0.0, high=1.0)
    grad_clip: float = option(1.0, "gradient-norm clip before every optimizer step", low=0.0, low_open=True, high=1e6)
    mini_batch_size: int = option(128, "responses per optimizer step (one step per mini-batch)", low=1, high=10**6)
    micro_batch_size: int = option(128, "responses per forward/backward (gradient accumulation)", low=1, high=10**6)
    token_mean_scope: str = option(
        "mini_batch",
        "denominator scope: the whole mini-batch (the paper's objective) or each micro-batch (the reference code)",
        choices=("mini_batch", "micro_batch"),
    )
    logit_chunk_tokens: int = option(
        0,
        "response positions whose output layer and float32 log-softmax run at once in every log-prob forward "
        "(0 = all of a micro-batch's at once); with a gradient each chunk's logits are recomputed in the backward "
        "instead of kept, so no micro-batch's full-vocabulary float32 logits ever exist whole; the same log-probs "
        "up to float rounding",
        low=0,
        high=10**9,
    )
    activation_checkpointing: bool = option(
        False,
        "recompute each decoder layer's activations in the backward instead of keeping them (transformers' gradient "
        "checkpointing, non-reentrant; TRL's GRPOConfig turns it on by default): the update keeps about one layer's "
        "activations instead of all, for about one more forward of compute; the same gradients up to float rounding; "
        "prompts are then not shared (share_prompts)",
    )
    share_prompts: str = option(
        "auto",
        "run each distinct prompt of a batch once in every log-prob forward, its keys and values shared by the rows "
        "that follow it (on), or every row's prompt in its own forward (off); auto: on on a CPU, off on a GPU, as "
        'measured (docs/results.md, "Speed"); the same log-probs up to float rounding',
        choices=("auto", "on", "off"),
    )
    group_by_length: bool = option(
        False,
        "cut each mini-batch into micro-batches of rows of similar response length, each forward stopping at its "
        "own longest response: less padding for ragged reasoning traces (with micro_batch_size below the batch); "
        "the same loss up to float rounding",
    )


@dataclass
class SFTConfig:
    steps: int = option(400, "SFT optimizer steps", low=1, high=10**7)
    batch_size: int = option(64, "SFT batch (examples)", low=1, high=10**6)
    lr: float = option(1e-3, "peak learning rate (warmup then cosine to 10%)", low=0.0, low_open=True, high=1.0)
    warmup_steps: int = option(50, "linear warmup steps", low=0, high=10**7)
    target: str = option(
        "answer",
        "what the response teaches: the answer only; the synthetic reasoning then the answer (K&K: Logic-RL's "
        "search; arith: the step-by-step working); or cot_random, the same with its choices (K&K: who first, "
        "knight or knave first; arith: the order and the wording) drawn per example, so that the trace is "
        "one of several valid ones",
        choices=SFT_TARGETS,
    )
    error_rate: float = option(
        0.0,
        "a noisy teacher (arith, sft.target=cot or cot_random): each operation of the working is, with this "
        "probability, written with a slip (a result off by one, or another operator applied) and the working "
        "goes on from what it wrote, so that the policy learns to put about this much on wrong decisions; "
        "0 = the exact working",
        low=0.0,
        high=1.0,
    )
    save_every: int = option(
        0,
        "checkpoint the SFT every k steps (0 = never), so that a stopped SFT resumes from its last checkpoint "
        "(bit for bit); changes no number, so it is not part of the embedded policy's cache key",
        low=0,
        high=10**7,
    )
    train_count: int = option(
        500,
        "generated SFT examples per difficulty (disjoint from the RL prompts and the held-out set); 500 leaves "
        "the embedded tiny policy short of data, so RL on new puzzles has something to teach (docs/results.md)",
        low=1,
        high=10**7,
    )

    micro_batch_size: int = option(
        0,
        "examples per forward/backward, their gradients summed into the batch's (0 = the whole batch at once): "
        "less peak memory for a real model's SFT, the same loss up to float rounding; set, it is part of the "
        "embedded policy's cache key",
        low=0,
        high=10**6,
    )

    def result_settings(self) -> dict:
        """The settings that decide the SFT's numbers: all but ``save_every`` (how, not what), and
        ``micro_batch_size`` (float rounding) and ``error_rate`` only where set: at their defaults they change nothing,
        and the keys of policies built before they existed (the committed grids' records name them) stay as they were."""
        settings = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "save_every"}
        for later in ("micro_batch_size", "error_rate"):  # options added after policies were built and recorded
            if not settings[later]:
                del settings[later]
        return settings


@dataclass
class TrainConfig:
    method: str = option(
        "ar_lopti",
        "method preset (tokenbalance list-methods), or your token rule: MODULE:RULE or FILE.py:RULE "
        "(docs/methods.md §10)",
    )
    method_overrides: dict[str, Any] = option(
        None,
        "the preset's hyper-parameters changed, e.g. {'lopti.eta': 0.4} (on the command line: "
        "--set method.lopti.eta=0.4; every field is listed under method.* below)",
        default_factory=dict,
    )
    steps: int = option(150, "RL steps", low=0, high=10**7)
    seed: int = option(0, "seed of everything (data order, init, sampling)", low=0, high=2**31 - 1)
    eval_every: int = option(50, "evaluate every k steps (0 = only before and after)", low=0, high=10**7)
    start_eval_cache: str | None = option(
        None,
        "a directory where runs share the step-0 evaluation's responses: a run whose start policy, evaluation "
        "prompts and generation settings match another's reads its greedy responses (and its sampled ones at the "
        "same seed) instead of generating them; tokenbalance ablate sets it for its cells (docs/ablate.md)",
        nullable=True,
        path=True,
    )
    save_every: int = option(10, "checkpoint every k steps (0 = only at the end)", low=0, high=10**7)
    keep_checkpoints: int = option(
        0,
        "keep only the newest k checkpoints of the run, removing older ones once a new one is complete "
        "(0 = keep every one; a real model's checkpoint with its optimizer state is about 12 bytes per "
        "parameter); 2 or more keeps a way back when the newest is damaged",
        low=0,
        high=10**7,
    )
    device: str = option("auto", "cpu, cuda, cuda:N or auto")
    threads: int = option(
        0,
        "CPU threads of torch's compute pool (0 = automatic: the CPUs the process may run on, shared among "
        "torchrun ranks, and in a single-process RL run fewer while other processes keep CPUs busy, re-decided "
        "between the phases of every step and logged as timing/threads); only runs at the same fixed count are "
        "bit-identical (docs/training.md)",
        low=0,
        high=1024,
    )

    def __post_init__(self) -> None:
        """A token rule's ``FILE.py`` (``train.method``, ``method.token_rule``) made absolute, so that a saved config
        names the same file from any working directory (``--resume``); every method override checked against its field
        and stored as plain data (:func:`normalized_overrides`)."""
        if is_spec(self.method):
            self.method = normalized_spec(self.method, "train.method", RULE_EXAMPLE)
        if isinstance(self.method_overrides, dict):  # anything else: validate() names its type
            self.method_overrides = normalized_overrides(self.method_overrides)


@dataclass
class OutputConfig:
    run_dir: str | None = option(None, "run directory (default runs/<method>-<time>)", nullable=True, path=True)
    tensorboard: bool = option(False, "also log to TensorBoard (needs the tensorboard extra)")
    wandb: bool = option(False, "also log to Weights & Biases (output.wandb_* below)")
    wandb_project: str = option("tokenbalance", "W&B project")
    wandb_entity: str | None = option(None, "W&B entity, a team or user (None: your default)", nullable=True)
    wandb_name: str | None = option(None, "W&B run name (None: the run directory's name)", nullable=True)
    wandb_mode: str = option(
        "offline",
        "W&B mode: offline (written under RUN_DIR/wandb; `wandb sync` uploads it), online or disabled; "
        "WANDB_MODE in the environment wins",
        choices=("offline", "online", "disabled"),
    )
    progress: bool = option(True, "show a progress bar")


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)

    def __post_init__(self) -> None:
        validate(self)
        self.method()  # the preset and its overrides are part of what is validated at load

    def method(self) -> Method:
        """The method this run trains with: ``train.method`` with ``train.method_overrides`` applied. ``ValueError``
        naming the field (and the closest valid name) when either is wrong."""
        return resolve_method(self.train.method, self.train.method_overrides, setting="train.method")


def to_dict(config: Any) -> dict:
    """Plain nested dict (tuples become lists) for YAML / JSON."""

    def plain(value):
        if isinstance(value, tuple):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    return {k: plain(v) for k, v in dataclasses.asdict(config).items()}


def from_dict(cls: type, data: dict, prefix: str = "") -> Any:
    """Build ``cls`` from a nested dict, rejecting unknown keys by name."""
    if not isinstance(data, dict):
        raise ValueError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        hint = did_you_mean(unknown[0], fields)
        raise ValueError(f"{prefix}{unknown[0]}: unknown option; valid: {', '.join(fields)}{hint}")
    kwargs = {}
    for name, value in data.items():
        f = fields[name]
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        if dataclasses.is_dataclass(default):
            kwargs[name] = from_dict(type(default), value, prefix=f"{prefix}{name}.")
        elif isinstance(default, tuple) and isinstance(value, list):
            kwargs[name] = tuple(value)
        elif isinstance(default, float) and isinstance(value, (str, int)) and not isinstance(value, bool):
            try:  # YAML 1.1 reads 1e-4 as a string; an int where a float is expected is fine
                kwargs[name] = float(value)
            except ValueError:
                kwargs[name] = value  # validation names the field
        else:
            kwargs[name] = value
    built = cls(**kwargs)
    validate(built, prefix)
    return built


def config_yaml(config: RunConfig) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False)


def save_config(config: RunConfig, path: str | Path) -> None:
    """Write ``config`` as YAML through a temporary file and a rename (never a half-written file)."""
    write_text_atomic(path, config_yaml(config))


def absolute_paths(config: RunConfig) -> RunConfig:
    """``config`` with every path option (``model.path``, ``model.cache_dir``, ``data.*_file``, ``output.run_dir``)
    made absolute (``~`` expanded), so that a saved config means the same files from any working directory
    (``--resume`` runs from anywhere). Changed in place; returned."""
    for f in dataclasses.fields(config):
        section = getattr(config, f.name)
        if not dataclasses.is_dataclass(section):
            continue
        for name in path_fields(type(section)):
            value = getattr(section, name)
            if isinstance(value, str) and value:
                setattr(section, name, os.path.abspath(os.path.expanduser(value)))
    return config


def load_config(path: str | Path) -> RunConfig:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"config file {str(path)!r} is not valid YAML{where}: {problem}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"config file {str(path)!r} cannot be read: {err}") from None
    return from_dict(RunConfig, data)


def _parse_value(text: str) -> Any:
    """YAML scalars and lists; also numbers YAML 1.1 leaves as strings (``1e-4``)."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def apply_overrides(config: RunConfig, overrides: list[str]) -> RunConfig:
    """Apply ``section.field=value`` overrides (values parsed as YAML: 5, 0.1, true, [2, 3]), each checked against its
    field's declared type (``output.wandb=flase``, ``train.steps=2.5`` fail).

    A string option's value is verbatim (``model.path=null`` is the path ``null``, ``123`` the name ``123``; empty is
    an error). ``method.KEY=VALUE`` (e.g. ``method.lopti.eta=0.4``, ``method.ar=null``) is stored as
    ``train.method_overrides[KEY]`` after earlier ones (``method.lopti=null`` drops earlier ``lopti.*``), as is the
    long form ``train.method_overrides.lopti.eta=0.4``."""
    data = to_dict(config)
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r}: expected section.field=value")
        key, text = item.split("=", 1)
        key = key.strip()
        method_key = _method_override_key(key)
        if method_key is not None:
            train = data["train"]
            train["method_overrides"] = merged_overrides(train["method_overrides"], method_key, _parse_value(text))
            continue
        parts = key.split(".")
        if len(parts) == 2 and parts[0] in data and parts[1] not in data[parts[0]]:
            hint = did_you_mean(parts[1], data[parts[0]])
            raise ValueError(f"{key}: unknown option; valid: {', '.join(data[parts[0]])}{hint}")
        if len(parts) != 2 or parts[0] not in data:
            sections = ", ".join(f"{s}.*" for s in [*data, "method"])
            hint = did_you_mean(parts[0], [*data, "method"]) if len(parts) > 1 else ""
            raise ValueError(f"override {key!r}: unknown option; valid sections: {sections}{hint}")
        section_type = field_types(RunConfig)[parts[0]]
        data[parts[0]][parts[1]] = text if is_string_field(section_type, parts[1]) else _parse_value(text)
    return from_dict(RunConfig, data)


def replace_sections(config: RunConfig, **changes: dict[str, Any]) -> RunConfig:
    """A copy of ``config`` with fields of its sections set to typed values, checked as a loaded config is:
    ``replace_sections(config, train={"seed": 3}, model={"path": "/p"})``. Nothing of ``config`` is shared with the
    copy, so changing one never changes the other."""
    copied = copy.deepcopy(config)
    for name, fields in changes.items():
        known = {f.name for f in dataclasses.fields(getattr(copied, name))}
        for key in fields.keys() - known:
            raise ValueError(f"{name}.{key}: unknown option{did_you_mean(key, known)}")
    sections = {name: dataclasses.replace(getattr(copied, name), **fields) for name, fields in changes.items()}
    return dataclasses.replace(copied, **sections)


def _method_override_key(key: str) -> str | None:
    """``lopti.eta`` for ``method.lopti.eta`` or ``train.method_overrides.lopti.eta``; else ``None``."""
    for prefix in (METHOD_PREFIX, "train.method_overrides."):
        if key.startswith(prefix) and len(key) > len(prefix):
            return key[len(prefix) :]
    return None


def describe_options(config: Any = None, prefix: str = "") -> list[str]:
    """One line per option: ``section.field = default  # help`` (for ``--help-config``), then the
    method's hyper-parameters (``method.*``, the values of the configured preset)."""
    top = config is None or (prefix == "" and isinstance(config, RunConfig))
    config = RunConfig() if config is None else config
    lines = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            lines += describe_options(value, prefix=f"{prefix}{f.name}.")
            continue
        meta = dict(f.metadata)
        rule = ""
        if meta.get("choices"):
            rule = f" (one of {', '.join(map(str, meta['choices']))})"
        lines.append(f"{prefix}{f.name} = {value!r}  # {meta.get('help', '')}{rule}")
    if top:
        lines += method_options(config.method(), prefix=METHOD_PREFIX)
    return lines
