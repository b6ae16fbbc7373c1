"""What a verl grid would cost: GPU-hours per cell, estimated from the settings (no measurement).

Tokens per RL step at the scripts' caps x FLOPs per token (2N rollout, 2N old and 2N reference
log-probs, 6N per update pass) x the cell's steps, divided by an assumed
:data:`ASSUMED_UTILISATION` of :data:`PEAK_FLOPS` per GPU: an upper bound on tokens, and a
utilisation no GPU run has measured. Imports no verl; printed before the grid is written. The
numbers and what they leave out: docs/scale.md ("The paper's grid on a cluster").
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenbalance.tasks.kk.records import default_slice

# examples/verl/common.sh (tests/ablate/test_verl_cost.py reads the script and checks each)
PROMPTS_PER_STEP = 64
SAMPLES_PER_PROMPT = 8
MAX_PROMPT_TOKENS = 400
MAX_RESPONSE_TOKENS = 4096
EPOCHS = 5
GPUS_PER_CELL = 4
TRAIN_PEOPLE = range(3, 8)  # merge_34567ppl: the published train split of each people count
# parameters of the models behind --verl-models (their model cards: Qwen2.5-3B-Instruct 3.09B,
# Qwen2.5-7B-Instruct-1M 7.61B, embeddings included)
MODEL_PARAMETERS = {"3b": 3.09e9, "7b": 7.61e9}
PEAK_FLOPS = 312e12  # A100 80 GB, dense bf16 (H100 SXM: 989e12)
ASSUMED_UTILISATION = 0.20
ROLLOUT_AND_LOGPROB_PASSES = 3  # generation, old-policy log-probs, reference log-probs: 2N each


def train_prompts() -> int:
    return sum(default_slice(people, "train")[1] for people in TRAIN_PEOPLE)


def steps_per_cell() -> int:
    return EPOCHS * (train_prompts() // PROMPTS_PER_STEP)


def tokens_per_step() -> int:
    return PROMPTS_PER_STEP * SAMPLES_PER_PROMPT * (MAX_PROMPT_TOKENS + MAX_RESPONSE_TOKENS)


def flops_per_token(parameters: float, update_passes: int) -> float:
    """2N per forward-only pass (rollout, old and reference log-probs) + 6N per update pass."""
    return 2 * parameters * ROLLOUT_AND_LOGPROB_PASSES + 6 * parameters * update_passes


@dataclass(frozen=True)
class CellCost:
    """The estimate for one cell: ``model``, its actor ``update_passes`` (2 for Lopti)."""

    model: str
    update_passes: int

    @property
    def flops(self) -> float:
        return flops_per_token(MODEL_PARAMETERS[self.model], self.update_passes) * tokens_per_step() * steps_per_cell()

    @property
    def gpu_hours(self) -> float:
        return self.flops / (PEAK_FLOPS * ASSUMED_UTILISATION) / 3600

    @property
    def wall_hours(self) -> float:
        """On one node of :data:`GPUS_PER_CELL` GPUs, as the AR-Lopti scripts run a cell."""
        return self.gpu_hours / GPUS_PER_CELL


def assumptions() -> list[str]:
    """The lines that say what the estimate is made of."""
    return [
        "cost: an ESTIMATE from the settings, not a measurement (src/tokenbalance/ablate/verl/cost.py):",
        f"  tokens per RL step: {PROMPTS_PER_STEP} prompts x {SAMPLES_PER_PROMPT} samples x ({MAX_PROMPT_TOKENS} + "
        f"{MAX_RESPONSE_TOKENS}) tokens = {tokens_per_step():,} (the scripts' length caps: an upper bound; "
        "shorter responses cost less in proportion)",
        "  FLOPs per token: 2N rollout + 2N old log-probs + 2N reference log-probs + 6N per update pass "
        "(Lopti: 2 passes), N = parameters ("
        + ", ".join(f"{m}: {n / 1e9:.2f}B" for m, n in MODEL_PARAMETERS.items())
        + "); attention's quadratic term left out",
        f"  steps per cell: {steps_per_cell()} ({EPOCHS} epochs x {train_prompts():,} prompts // {PROMPTS_PER_STEP})",
        f"  throughput: {ASSUMED_UTILISATION:.0%} (assumed, not measured) of {PEAK_FLOPS / 1e12:.0f} TFLOP/s per GPU "
        f"(A100 dense bf16 peak; an H100 at the same utilisation: about a third of the hours); "
        f"{GPUS_PER_CELL} GPUs per cell",
    ]


def cost_table(costs: list[CellCost]) -> list[str]:
    """One line per (model, update passes): cells, GPU-hours and wall hours per cell, GPU-hours; then the total."""
    groups: dict[CellCost, int] = {}
    for cost in costs:
        groups[cost] = groups.get(cost, 0) + 1
    lines = [
        f"  {'model':<6}{'passes':>7}{'cells':>7}{'GPU-h/cell':>12}{'h/cell on ' + str(GPUS_PER_CELL):>13}{'GPU-h':>10}"
    ]
    for cost, count in groups.items():
        lines.append(
            f"  {cost.model:<6}{cost.update_passes:>7}{count:>7}{cost.gpu_hours:>12,.0f}{cost.wall_hours:>13,.0f}"
            f"{cost.gpu_hours * count:>10,.0f}"
        )
    total = sum(cost.gpu_hours for cost in costs)
    lines.append(
        f"  total: {len(costs)} cells, {total:,.0f} GPU-hours = {total / GPUS_PER_CELL:,.0f} hours of one "
        f"{GPUS_PER_CELL}-GPU node (cells in sequence: {total / GPUS_PER_CELL / 24:,.0f} days)"
    )
    return lines
