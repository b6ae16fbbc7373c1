"""What a verl grid would cost: GPU-hours and checkpoint disk per cell, estimated from the settings.

Per RL step, FLOPs per phase (rollout 2N, old and reference log-probs 2N each, each actor update
pass 6N + 2N recomputed: verl's gradient checkpointing is on) x tokens at the scripts' caps, each
phase at its own assumed MFU (:data:`ASSUMED_MFU`, no GPU run has measured one); then the
validations and the work a resume repeats. Disk: fp32 weights + Adam state per kept checkpoint.
Imports no verl; printed before the grid is written. What is left out: docs/scale.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tokenbalance.tasks.kk.records import default_slice

# examples/verl/common.sh (tests/ablate/test_verl_cost.py reads the script and checks each)
PROMPTS_PER_STEP = 64
SAMPLES_PER_PROMPT = 8
MAX_PROMPT_TOKENS = 400
MAX_RESPONSE_TOKENS = 4096
EPOCHS = 5
GPUS_PER_CELL = 4
TEST_FREQ = 20  # trainer.test_freq, with val_before_train: a validation before step 1 too
SAVE_FREQ = 20  # trainer.save_freq
KEEP_CHECKPOINTS = 1  # trainer.max_actor_ckpt_to_keep (ours: verl's default keeps every checkpoint)
TRAIN_PEOPLE = range(3, 8)  # merge_34567ppl: the published train split of each people count
VALIDATION_PROMPTS = 5 * 100  # {3..7}ppl/test_new.parquet, one greedy response each
# parameters of the models behind --verl-models (their model cards: Qwen2.5-3B-Instruct 3.09B,
# Qwen2.5-7B-Instruct-1M 7.61B, embeddings included)
MODEL_PARAMETERS = {"3b": 3.09e9, "7b": 7.61e9}
PEAK_FLOPS = 312e12  # A100 80 GB, dense bf16 (H100 SXM: 989e12)
# assumed model-FLOPs utilisation per phase (not measured): decoding is bound by memory and the
# longest response, the log-prob passes are long prefills, the update runs fwd + bwd with offload
ASSUMED_MFU = {"rollout": 0.10, "logprob": 0.40, "update": 0.25}
LOGPROB_PASSES = 2  # old-policy and reference log-probs
UPDATE_FLOPS_PER_PARAMETER = 6 + 2  # forward + backward, + the forward recomputed by gradient checkpointing
# a checkpoint: fp32 weights (4 bytes) + AdamW's two fp32 moments (8 bytes) per parameter
CHECKPOINT_BYTES_PER_PARAMETER = 4 + 8
SLURM_MAX_HOURS = 48  # a common partition limit; a longer cell resumes over several submissions
# a stop before a time limit (ASSUMED, not measured): a checkpoint's write to the node's disk, and the
# launch's exit after the trainer stops (Ray and its workers shutting down)
ASSUMED_SAVE_BYTES_PER_S = 1e9
ASSUMED_EXIT_S = 60


def train_prompts() -> int:
    return sum(default_slice(people, "train")[1] for people in TRAIN_PEOPLE)


def steps_per_cell() -> int:
    return EPOCHS * (train_prompts() // PROMPTS_PER_STEP)


def tokens_per_step() -> int:
    return PROMPTS_PER_STEP * SAMPLES_PER_PROMPT * (MAX_PROMPT_TOKENS + MAX_RESPONSE_TOKENS)


def validations_per_cell() -> int:
    """Before training, every :data:`TEST_FREQ` steps, and at the last step (verl's ``is_last_step``)."""
    steps = steps_per_cell()
    return 1 + steps // TEST_FREQ + (steps % TEST_FREQ != 0)


def phase_seconds(parameters: float, update_passes: int) -> dict[str, float]:
    """GPU-seconds of one RL step per phase, each at its :data:`ASSUMED_MFU` of :data:`PEAK_FLOPS`."""
    tokens = tokens_per_step()
    flops = {
        "rollout": 2 * parameters * tokens,
        "logprob": LOGPROB_PASSES * 2 * parameters * tokens,
        "update": update_passes * UPDATE_FLOPS_PER_PARAMETER * parameters * tokens,
    }
    return {phase: value / (PEAK_FLOPS * ASSUMED_MFU[phase]) for phase, value in flops.items()}


def validation_seconds(parameters: float) -> float:
    """GPU-seconds of one validation: one response per validation prompt, at the rollout's MFU."""
    tokens = VALIDATION_PROMPTS * (MAX_PROMPT_TOKENS + MAX_RESPONSE_TOKENS)
    return 2 * parameters * tokens / (PEAK_FLOPS * ASSUMED_MFU["rollout"])


@dataclass(frozen=True)
class CellCost:
    """The estimate for one cell: ``model``, its actor ``update_passes`` (2 for Lopti)."""

    model: str
    update_passes: int

    @property
    def parameters(self) -> float:
        return MODEL_PARAMETERS[self.model]

    @property
    def step_gpu_seconds(self) -> float:
        return sum(phase_seconds(self.parameters, self.update_passes).values())

    @property
    def first_sitting_gpu_hours(self) -> float:
        """Every step and validation once: the cell run without a stop."""
        seconds = steps_per_cell() * self.step_gpu_seconds + validations_per_cell() * validation_seconds(
            self.parameters
        )
        return seconds / 3600

    @property
    def resumes(self) -> int:
        """The sittings after the first when a Slurm job may run at most :data:`SLURM_MAX_HOURS`."""
        return max(0, math.ceil(self.first_sitting_gpu_hours / GPUS_PER_CELL / SLURM_MAX_HOURS) - 1)

    @property
    def resumed_gpu_hours(self) -> float:
        """What resumes add, per resume: the validation verl runs again at the checkpoint it resumes from,
        and the checkpoint the stop on request saves, with the exit, on every GPU of the node (no completed
        step is repeated: the Slurm script's lead lets the trainer save it; docs/verl.md)."""
        stop = self.checkpoint_bytes / ASSUMED_SAVE_BYTES_PER_S + ASSUMED_EXIT_S
        repeated = validation_seconds(self.parameters) + GPUS_PER_CELL * stop
        return self.resumes * repeated / 3600

    @property
    def gpu_hours(self) -> float:
        return self.first_sitting_gpu_hours + self.resumed_gpu_hours

    @property
    def wall_hours(self) -> float:
        """On one node of :data:`GPUS_PER_CELL` GPUs, as the AR-Lopti scripts run a cell."""
        return self.gpu_hours / GPUS_PER_CELL

    @property
    def checkpoint_bytes(self) -> float:
        return CHECKPOINT_BYTES_PER_PARAMETER * self.parameters

    @property
    def stop_seconds(self) -> float:
        """Wall seconds from a stop request to the launch's end, at worst (verl's fit loop, docs/verl.md
        "Stopping a run with a checkpoint"): the step in progress (the request came as it began), the save
        and the validation that may end it, the requested save, the exit."""
        step_and_validation = (self.step_gpu_seconds + validation_seconds(self.parameters)) / GPUS_PER_CELL
        return step_and_validation + 2 * self.checkpoint_bytes / ASSUMED_SAVE_BYTES_PER_S + ASSUMED_EXIT_S

    @property
    def disk_bytes(self) -> float:
        """The cell's checkpoints at their peak: verl keeps the newest :data:`KEEP_CHECKPOINTS` and, with one
        kept, the previous until the next is saved (two while saving)."""
        return max(KEEP_CHECKPOINTS, 2) * self.checkpoint_bytes


def terabytes(size: float) -> str:
    return f"{size / 1e12:,.2f} TB"


def assumptions() -> list[str]:
    """The lines that say what the estimate is made of."""
    mfu = ", ".join(f"{phase} {share:.0%}" for phase, share in ASSUMED_MFU.items())
    return [
        "cost: an ESTIMATE from the settings, not a measurement (src/tokenbalance/ablate/verl/cost.py):",
        f"  tokens per RL step: {PROMPTS_PER_STEP} prompts x {SAMPLES_PER_PROMPT} samples x ({MAX_PROMPT_TOKENS} + "
        f"{MAX_RESPONSE_TOKENS}) tokens = {tokens_per_step():,} (the scripts' length caps: an upper bound; "
        "shorter responses cost less in proportion)",
        f"  FLOPs per token: rollout 2N, old + reference log-probs {LOGPROB_PASSES} x 2N, each actor update pass "
        f"{UPDATE_FLOPS_PER_PARAMETER}N (6N + 2N recomputed: gradient checkpointing; Lopti: 2 passes), N = "
        "parameters (" + ", ".join(f"{m}: {n / 1e9:.2f}B" for m, n in MODEL_PARAMETERS.items()) + "); "
        "attention's quadratic term left out",
        f"  steps per cell: {steps_per_cell()} ({EPOCHS} epochs x {train_prompts():,} prompts // {PROMPTS_PER_STEP}); "
        f"{validations_per_cell()} validations of {VALIDATION_PROMPTS} prompts (before training, every {TEST_FREQ} "
        "steps, the last step)",
        f"  MFU per phase (ASSUMED, not measured): {mfu} of {PEAK_FLOPS / 1e12:.0f} TFLOP/s per GPU (A100 dense "
        f"bf16 peak; H100s at the same MFU: about a third of the hours); {GPUS_PER_CELL} GPUs per cell",
        f"  resumes: a cell longer than {SLURM_MAX_HOURS} h on its node runs over several Slurm jobs; each resume "
        "adds one validation and one checkpoint save (the stop on request keeps every completed step)",
        f"  disk: a checkpoint is {CHECKPOINT_BYTES_PER_PARAMETER} bytes per parameter (fp32 weights + AdamW's two "
        f"moments); verl keeps the last {KEEP_CHECKPOINTS} (trainer.max_actor_ckpt_to_keep) and the one before while "
        "saving; set CHECKPOINT_ROOT to put them on scratch space (docs/verl.md)",
    ]


def cost_table(costs: list[CellCost]) -> list[str]:
    """One line per (model, update passes): cells, GPU-hours, wall hours and disk per cell, GPU-hours;
    then the totals."""
    groups: dict[CellCost, int] = {}
    for cost in costs:
        groups[cost] = groups.get(cost, 0) + 1
    lines = [
        f"  {'model':<6}{'passes':>7}{'cells':>7}{'GPU-h/cell':>12}{'h/cell on ' + str(GPUS_PER_CELL):>13}"
        f"{'resumes':>9}{'disk/cell':>11}{'GPU-h':>10}"
    ]
    for cost, count in groups.items():
        lines.append(
            f"  {cost.model:<6}{cost.update_passes:>7}{count:>7}{cost.gpu_hours:>12,.0f}{cost.wall_hours:>13,.0f}"
            f"{cost.resumes:>9}{cost.disk_bytes / 1e9:>8,.0f} GB{cost.gpu_hours * count:>10,.0f}"
        )
    total = sum(cost.gpu_hours for cost in costs)
    lines.append(
        f"  total: {len(costs)} cells, {total:,.0f} GPU-hours = {total / GPUS_PER_CELL:,.0f} hours of one "
        f"{GPUS_PER_CELL}-GPU node (cells in sequence: {total / GPUS_PER_CELL / 24:,.0f} days)"
    )
    kept = sum(KEEP_CHECKPOINTS * cost.checkpoint_bytes for cost in costs)
    lines.append(
        f"  checkpoints: {terabytes(sum(cost.disk_bytes for cost in costs))} if every cell runs at once; the "
        f"completed grid keeps {terabytes(kept)} (each cell's last {KEEP_CHECKPOINTS}; remove them once the table "
        "is built)"
    )
    return lines
