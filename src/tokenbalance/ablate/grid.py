"""What a grid is: methods (rows: a label, the preset it trains, the row it is compared with), presets (a Python
registry of shared run-config overrides, default rows, seeds and steps) and cells (method x seed). docs/ablate.md
("Rows and presets")."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from tokenbalance.algorithms.presets import get_method
from tokenbalance.algorithms.registry import did_you_mean
from tokenbalance.config import TrainConfig


@dataclass(frozen=True)
class GridMethod:
    """One row: ``key`` (cell names, ``--methods``), ``label`` (the table), ``preset`` (the method preset),
    ``baseline`` (the key of the row it is compared with; None for a baseline row)."""

    key: str
    label: str
    preset: str
    baseline: str | None = None


GRID_METHODS: dict[str, GridMethod] = {
    m.key: m
    for m in (
        GridMethod("grpo", "GRPO", "arlopti_kk_fig4_grpo"),
        GridMethod("ar", "+ AR", "arlopti_kk_fig4_ar", "grpo"),
        GridMethod("lopti", "+ Lopti", "arlopti_kk_fig4_lopti", "grpo"),
        GridMethod("ar_lopti", "+ AR + Lopti", "arlopti_kk_fig4_ar_lopti", "grpo"),
        GridMethod("tr_grpo", "TR-GRPO (unverified weight)", "tr_grpo", "grpo"),
        GridMethod("nthr", "NTHR", "nthr", "grpo"),
        GridMethod("rpp", "REINFORCE++", "arlopti_kk_tab7_reinforce_pp"),
        GridMethod("rpp_ar", "REINFORCE++ + AR", "reinforce_pp_ar", "rpp"),
        GridMethod("rpp_lopti", "REINFORCE++ + Lopti", "reinforce_pp_lopti", "rpp"),
        GridMethod("rpp_ar_lopti", "REINFORCE++ + AR + Lopti", "arlopti_kk_tab7_reinforce_pp_ar_lopti", "rpp"),
        GridMethod("grpo_2step", "GRPO, two steps (random halves)", "arlopti_kk_fig4_grpo_two_step", "grpo"),
    )
}
CONTROL_ROWS = ("grpo_2step",)  # rows of a designed experiment (docs/preregistration/), not of the default grid
DEFAULT_METHODS = tuple(key for key in GRID_METHODS if key not in CONTROL_ROWS)
ARITH_COT_METHODS = ("grpo", "ar", "lopti", "ar_lopti", "tr_grpo", "nthr")  # the GRPO family and its rivals


def grid_method(name: str) -> GridMethod:
    """A row by key (``grpo``, ``ar_lopti``, ...) or, for any other method preset or token rule (``MODULE:RULE``,
    keyed by the rule's name), an ad-hoc row compared with ``grpo`` / ``rpp`` according to its advantage estimator."""
    if name in GRID_METHODS:
        return GRID_METHODS[name]
    try:
        method = get_method(name)
    except ValueError:
        raise ValueError(
            f"--methods: unknown row {name!r}; rows: {', '.join(GRID_METHODS)}, or any method preset "
            f"(tokenbalance list-methods){did_you_mean(name, GRID_METHODS)}"
        ) from None
    baseline = "rpp" if method.advantage.estimator == "reinforce_pp" else "grpo"
    return GridMethod(method.name, method.name, name, baseline)  # a token rule's MODULE:RULE: keyed by its name


@dataclass(frozen=True)
class GridPreset:
    """A named grid: ``overrides`` of the run config for every cell (``section.field=value``), the default ``methods``
    (row keys), ``seeds`` and RL ``steps``. ``start_seed``: the SFT seed of every cell's embedded start policy (one
    build shared by all seeds, as RL seeds share one pretrained model); None builds each seed's own."""

    name: str
    description: str
    overrides: tuple[str, ...] = ()
    methods: tuple[str, ...] = DEFAULT_METHODS
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 60
    start_seed: int | None = None
    start_policies: int | None = None
    start_policy_offset: int = 0  # with start_policies: SFT seeds offset .. offset + k - 1 (fresh policies)
    model: str | None = None  # a preset for a given start policy: what --model must name (else None)
    baselines: tuple[tuple[str, str], ...] = ()  # (row, the row it is compared with instead of its own baseline)

    def __post_init__(self) -> None:
        if self.start_seed is not None and self.start_policies is not None:
            raise ValueError(f"grid preset {self.name!r}: give start_seed or start_policies, not both")
        if self.start_policies is not None and self.start_policies < 1:
            raise ValueError(f"grid preset {self.name!r}: start_policies must be >= 1, got {self.start_policies}")
        if self.start_policy_offset and self.start_policies is None:
            raise ValueError(f"grid preset {self.name!r}: start_policy_offset needs start_policies")

    def policy_seed(self, seed: int) -> int:
        """The SFT seed of the start policy of a cell trained from ``seed``: its own, ``start_seed``'s for every seed,
        or with ``start_policies`` = k the seed modulo k plus ``start_policy_offset`` (k start policies, seeds s,
        s + k, ... sharing one), so that the spread over seeds covers the start policy too."""
        if self.start_policies is not None:
            return self.start_policy_offset + seed % self.start_policies
        return seed if self.start_seed is None else self.start_seed


# The arithmetic 2 x 2: {decision noise off, on} x {wording noise off, on} (docs/results.md, the decision-token
# testbed). The arith-cot working and RL settings, sampled at the AR-Lopti K&K scripts' T = 0.7 in every condition, 8
# seeds over 4 start policies, 100 RL steps.
ARITH_2X2_OVERRIDES = (
    "data.task=arith",
    "data.template=plain",
    "data.train_difficulties=[1,2]",
    "data.eval_difficulties=[1,2]",
    "data.eval_count=500",
    "sft.train_count=20000",
    "sft.steps=1500",
    "rollout.max_new_tokens=128",
    "rollout.temperature=0.7",
    "optim.lr=1e-5",
    "optim.group_by_length=true",
    "optim.micro_batch_size=32",
    "train.eval_every=25",
)
NOISY_TEACHER_RATE = 0.25  # the 0.2-0.3, fixed before any run (not tuned on any set)
ARITH_2X2_CONDITIONS = {
    # name: (decision noise, wording noise) -> the SFT target and the teacher's slip rate
    "arith-clean": ("off", "off", ("sft.target=cot",)),
    "arith-wording": ("off", "on", ("sft.target=cot_random",)),
    "arith-decisions": ("on", "off", ("sft.target=cot", f"sft.error_rate={NOISY_TEACHER_RATE}")),
    "arith-decisions-wording": ("on", "on", ("sft.target=cot_random", f"sft.error_rate={NOISY_TEACHER_RATE}")),
}


def arith_2x2_preset(name: str) -> GridPreset:
    decisions, wording, target = ARITH_2X2_CONDITIONS[name]
    return GridPreset(
        name,
        f"the arithmetic 2 x 2, decision noise {decisions}, wording noise {wording}: the arith-cot working "
        + (
            "written by a noisy teacher (each operation slips with probability "
            f"{NOISY_TEACHER_RATE}: a result off by one or another operator, the working going on from it)"
            if decisions == "on"
            else "as written by an exact teacher"
        )
        + (", its order and wording drawn per problem" if wording == "on" else ", one order and one wording")
        + "; T = 0.7, 100 RL steps, 8 seeds over 4 start policies (docs/results.md)",
        overrides=(*ARITH_2X2_OVERRIDES, *target),
        methods=ARITH_COT_METHODS,
        seeds=tuple(range(8)),
        steps=100,
        start_policies=4,
    )


# The step-count control (docs/preregistration/step-count-control.md, written before its first cell): GRPO, GRPO with
# two optimizer steps over random halves, + Lopti and + AR + Lopti in both noisy-teacher conditions, from 4 fresh start
# policies (SFT seeds 4-7, never built by the 2 x 2) and fresh RL seeds 8-15.
STEP_CONTROL_METHODS = ("grpo", "grpo_2step", "lopti", "ar_lopti")
STEP_CONTROL_CONDITIONS = {"arith-steps": "arith-decisions", "arith-steps-wording": "arith-decisions-wording"}


def step_control_preset(name: str) -> GridPreset:
    condition = arith_2x2_preset(STEP_CONTROL_CONDITIONS[name])
    return dataclasses.replace(
        condition,
        name=name,
        description=f"the step-count control in {condition.name} (docs/preregistration/step-count-control.md): "
        + condition.description.split(": ", 1)[1].replace(
            "8 seeds over 4 start policies", "seeds 8-15 over 4 fresh start policies (SFT seeds 4-7)"
        ),
        methods=STEP_CONTROL_METHODS,
        baselines=(("lopti", "grpo_2step"), ("ar_lopti", "grpo_2step")),  # the pre-registered contrasts C2, C3
        seeds=tuple(range(8, 16)),
        start_policy_offset=4,
    )


GRID_PRESETS: dict[str, GridPreset] = {
    p.name: p
    for p in (
        GridPreset(
            "kk-tiny",
            "the CPU testbed: the embedded tiny policy on K&K 3 people with the `tokenbalance train` "
            "defaults (SFT on 500 puzzles, RL on 1900 others, lr 1e-4, 16 prompts x 8, 150 steps), chosen "
            "on validation puzzles so that GRPO raises held-out greedy accuracy (docs/results.md); "
            "evaluation before and after RL only",
            overrides=("train.eval_every=0",),
            steps=150,
        ),
        GridPreset(
            "arith-cot",
            "the reasoning testbed: the embedded tiny policy writes a step-by-step working before its boxed "
            "answer, its order and wording drawn per problem (arith levels 1 + 2; SFT on 20,000 problems per "
            "level, 1500 steps, one start policy for every seed), so that about a quarter of its tokens sit "
            "below p = 0.75; RL at lr 1e-5, 16 prompts x 8, 150 steps, evaluated every 25 steps on 500 held-out "
            "problems per level; chosen on validation problems (docs/results.md, the arithmetic testbed)",
            overrides=(
                "data.task=arith",
                "data.template=plain",
                "data.train_difficulties=[1,2]",
                "data.eval_difficulties=[1,2]",
                "data.eval_count=500",
                "sft.target=cot_random",
                "sft.train_count=20000",
                "sft.steps=1500",
                "rollout.max_new_tokens=128",
                "optim.lr=1e-5",
                "optim.group_by_length=true",
                "optim.micro_batch_size=32",
                "train.eval_every=25",
            ),
            methods=ARITH_COT_METHODS,
            seeds=tuple(range(8)),
            steps=150,
            start_seed=0,
        ),
        GridPreset(
            "kk-smoke",
            "a short trial of the machinery: 2-people puzzles, one short SFT (120 steps of 32) shared by both "
            "seeds, whose greedy answers are right on some held-out puzzles, so the accuracy columns show numbers; "
            "4 RL steps of 4 prompts x 8, the 100 held-out puzzles, one thread per cell, GRPO and AR + Lopti, "
            "2 seeds (its numbers say nothing about the methods)",
            overrides=(
                "data.train_difficulties=[2]",
                "data.eval_difficulties=[2]",
                "sft.steps=120",
                "sft.batch_size=32",
                "sft.warmup_steps=10",
                "data.eval_count=100",
                "rollout.prompts_per_step=4",
                "train.eval_every=0",
                "train.save_every=2",
                "train.threads=1",
            ),
            methods=("grpo", "ar_lopti"),
            seeds=(0, 1),
            steps=4,
            start_seed=0,
        ),
        *(arith_2x2_preset(name) for name in ARITH_2X2_CONDITIONS),
        *(step_control_preset(name) for name in STEP_CONTROL_CONDITIONS),
        GridPreset(
            "smollm2-kk",
            "a real pretrained model: SmolLM2-135M-Instruct from its K&K chain-of-thought warm start "
            "(scripts/smollm2_paired.sh builds it; --model names it), 3-people puzzles in the Qwen chat format, "
            "2 prompts x 8 responses of at most 400 tokens, lr 1e-6, T = 0.7, 50 RL steps, evaluated every 25 "
            "steps on 100 validation puzzles (greedy and sampled, example by example); GRPO against + AR + Lopti, "
            "3 seed pairs",
            overrides=(
                "data.template=qwen-instruct",
                "data.max_prompt_tokens=320",
                "data.eval_set=validation",
                "data.eval_count=100",
                "rollout.max_new_tokens=400",
                "rollout.engine=fast",
                "rollout.prompts_per_step=2",
                "rollout.temperature=0.7",
                "optim.lr=1e-6",
                "optim.micro_batch_size=2",
                "optim.group_by_length=true",
                "train.eval_every=25",
                "train.save_every=1",
                "train.keep_checkpoints=2",
            ),
            methods=("grpo", "ar_lopti"),
            seeds=(0, 1, 2),
            steps=50,
            model="the SmolLM2-135M-Instruct K&K warm start (scripts/smollm2_paired.sh)",
        ),
    )
}


def grid_preset(name: str) -> GridPreset:
    if name not in GRID_PRESETS:
        raise ValueError(
            f"--preset: unknown grid preset {name!r}; valid: {', '.join(GRID_PRESETS)}"
            f"{did_you_mean(name, GRID_PRESETS)}"
        )
    return GRID_PRESETS[name]


@dataclass(frozen=True)
class Cell:
    """One run of the grid: a row trained from seed ``seed``'s start policy."""

    method: GridMethod
    seed: int

    @property
    def name(self) -> str:
        return f"{self.method.key}-seed{self.seed}"


@dataclass(frozen=True)
class GridPlan:
    """A grid as run: the preset, its rows and seeds, the RL steps, the extra overrides."""

    preset: GridPreset
    methods: tuple[GridMethod, ...]
    seeds: tuple[int, ...]
    steps: int
    overrides: tuple[str, ...] = field(default=())

    @property
    def cells(self) -> list[Cell]:
        """Seed-major order: a seed's rows run one after another, so a partial grid has whole seeds."""
        return [Cell(method, seed) for seed in self.seeds for method in self.methods]

    def row(self, key: str) -> GridMethod | None:
        return next((m for m in self.methods if m.key == key), None)


def make_plan(
    preset: GridPreset,
    *,
    methods: list[str] | None = None,
    seeds: list[int] | None = None,
    steps: int | None = None,
    overrides: list[str] | None = None,
) -> GridPlan:
    """The grid of ``preset`` with the command line's choices (each None: the preset's)."""
    keys = list(methods) if methods else list(preset.methods)
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise ValueError(f"--methods: {duplicates[0]!r} is listed twice")
    compared_with = dict(preset.baselines)
    rows = tuple(
        dataclasses.replace(row, baseline=compared_with[row.key]) if row.key in compared_with else row
        for row in (grid_method(k) for k in keys)
    )
    for row in rows:
        get_method(row.preset)  # every preset exists before any work starts
    chosen_seeds = tuple(seeds) if seeds is not None else preset.seeds
    if not chosen_seeds or len(set(chosen_seeds)) != len(chosen_seeds) or min(chosen_seeds) < 0:
        raise ValueError(f"--seeds: expected distinct non-negative integers, got {list(chosen_seeds)}")
    chosen_steps = preset.steps if steps is None else steps
    most = next(f.metadata["high"] for f in dataclasses.fields(TrainConfig) if f.name == "steps")  # train.steps' bound
    if not 1 <= chosen_steps <= most:
        raise ValueError(f"--steps: must be in [1, {most}], got {chosen_steps}")
    return GridPlan(preset, rows, chosen_seeds, chosen_steps, tuple(overrides or ()))
