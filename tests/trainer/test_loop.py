"""The RL loop end to end, in process: metrics, learning signal, determinism, resume, presets."""

import json
import math
import re
from pathlib import Path

import pytest

from tests.trainer.conftest import replace_section
from tokenbalance.algorithms.presets import METHOD_PRESETS
from tokenbalance.diagnostics.sinks import read_metrics
from tokenbalance.models import load_policy
from tokenbalance.trainer import loop
from tokenbalance.trainer.evaluate import read_outcomes
from tokenbalance.trainer.runner import run_training

TRAIN_KEYS = {
    "reward/mean",
    "reward/acc",
    "reward/format_ok",
    "response/len_mean",
    "response/truncated_frac",
    "reward/mixed_group_frac",
    "adv/mean",
    "adv_weighted/mean",
    "loss/policy",
    "loss/kl",
    "loss/entropy",
    "loss/total",
    "clip/frac",
    "optim/grad_norm",
    "optim/steps",
    "timing/rollout_s",
    "timing/update_s",
    "throughput/tokens_per_s",
    "lopti/low_token_frac",
}
EVAL_KEYS = {
    "eval/greedy/acc",
    "eval/greedy/acc_2",
    "eval/greedy/acc_3",
    "eval/sample/acc",
    "eval/sample/reward",
    "eval/greedy/response_len",
    "eval/greedy/format_error",
}


DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def undocumented(records) -> set[str]:
    """Logged keys that docs/metrics.md does not list (pass/<name>/ and eval modes generalised)."""
    documented = set(re.findall(r"`([a-z_]+/[a-z0-9_/<>]+)`", DOCS.read_text()))
    missing = set()
    for record in records:
        for key in record:
            if key in ("step", "kind"):
                continue
            name = re.sub(r"^pass/[a-z_]+/", "", key)
            name = re.sub(r"^eval/(greedy|sample)/", "eval/<mode>/", name)
            name = re.sub(r"acc_\d+$", "acc_<d>", name)
            name = re.sub(r"/bucket\d+", "/bucket<b>", name)  # diag/*: probability bucket index
            name = re.sub(r"/layer\d+$", "/layer<i>", name)  # diag/grad_norm/*: decoder layer index
            if name not in documented:
                missing.add(key)
    return missing


def without_timing(records):
    return [{k: v for k, v in r.items() if not k.startswith(("timing/", "throughput/"))} for r in records]


def test_run_logs_documented_metrics_and_changes_the_policy(small_config, tiny_policy_dir):
    run_dir = run_training(small_config, log=lambda *_: None)
    records = read_metrics(run_dir / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in train] == [1, 2] and [r["step"] for r in evals] == [0, 2]
    assert TRAIN_KEYS <= set(train[0]) and EVAL_KEYS <= set(evals[0])
    assert undocumented(records) == set()
    assert all(math.isfinite(r["loss/total"]) for r in train)
    assert train[0]["optim/steps"] == 4  # 8 responses / mini-batch 4 = 2 steps, times 2 Lopti passes
    state = json.loads((run_dir / "run_state.json").read_text())
    assert state["status"] == "completed"
    assert 50 < state["peak_rss_mb"] < 64 * 1024  # torch alone takes tens of MiB; this is a tiny run
    assert (Path(run_dir) / "checkpoints" / "latest").read_text().strip() == "step_000002"
    initial, _ = load_policy(tiny_policy_dir)
    trained, _ = load_policy(run_dir / "checkpoints" / "step_000002" / "model")
    deltas = [(a - b).abs().max().item() for a, b in zip(initial.parameters(), trained.parameters())]
    assert max(deltas) > 1e-4
    saved = (run_dir / "config.yaml").read_text()
    assert "method: ar_lopti" in saved and str(tiny_policy_dir) in saved
    outcomes = read_outcomes(run_dir)  # every evaluation, example by example, agreeing with its accuracy
    assert sorted(outcomes) == [(0, "greedy"), (0, "sample"), (2, "greedy"), (2, "sample")]
    for record in evals:
        for mode in ("greedy", "sample"):
            correct = outcomes[(record["step"], mode)]["correct"]
            assert len(correct) == small_config.data.eval_count * len(small_config.data.eval_difficulties)
            assert correct.count("1") / len(correct) == pytest.approx(record[f"eval/{mode}/acc"])
    assert len({o["examples"] for o in outcomes.values()}) == 1  # the same examples at every evaluation


def test_identical_seeds_give_identical_runs(small_config, tmp_path):
    first = run_training(small_config, log=lambda *_: None)
    small_config.output.run_dir = str(tmp_path / "again")
    second = run_training(small_config, log=lambda *_: None)
    a = without_timing(read_metrics(first / "metrics.jsonl"))
    b = without_timing(read_metrics(second / "metrics.jsonl"))
    assert a == b and len(a) == 4


def interrupted_and_resumed(config, run_dir, monkeypatch):
    """Run ``config`` in ``run_dir``, Ctrl-C at the third step, then ``--resume`` it to the end."""
    config.output.run_dir = str(run_dir)
    real_step = loop.rl_step

    def crash_on_third_step(parts, step):
        if step == 2:
            raise KeyboardInterrupt("simulated crash")
        return real_step(parts, step)

    monkeypatch.setattr(loop, "rl_step", crash_on_third_step)
    with pytest.raises(KeyboardInterrupt):
        run_training(config, log=lambda *_: None)
    assert json.loads((run_dir / "run_state.json").read_text())["status"] == "interrupted"  # Ctrl-C, not a failure
    monkeypatch.setattr(loop, "rl_step", real_step)
    run_training(None, run_dir=run_dir, resume=True, log=lambda *_: None)


def test_resume_equals_uninterrupted(small_config, tmp_path, monkeypatch):
    replace_section(small_config, "train", steps=3)
    reference = run_training(small_config, log=lambda *_: None)
    crashed = tmp_path / "crashed"
    interrupted_and_resumed(small_config, crashed, monkeypatch)
    assert without_timing(read_metrics(crashed / "metrics.jsonl")) == without_timing(
        read_metrics(reference / "metrics.jsonl")
    )


def test_keep_checkpoints_keeps_the_newest_and_the_run_resumes_as_if_all_were_kept(small_config, tmp_path, monkeypatch):
    replace_section(small_config, "train", steps=3)
    reference = run_training(small_config, log=lambda *_: None)
    assert sorted(p.name for p in (reference / "checkpoints").glob("step_*")) == [
        "step_000001",
        "step_000002",
        "step_000003",
    ]
    replace_section(small_config, "train", keep_checkpoints=1)
    pruned = tmp_path / "pruned"
    interrupted_and_resumed(small_config, pruned, monkeypatch)  # stopped at step 3: only step 2 left
    assert sorted(p.name for p in (pruned / "checkpoints").glob("step_*")) == ["step_000003"]
    assert (pruned / "checkpoints" / "latest").read_text().strip() == "step_000003"
    assert without_timing(read_metrics(pruned / "metrics.jsonl")) == without_timing(
        read_metrics(reference / "metrics.jsonl")
    )


def test_hf_engine_trains_like_the_fast_engine(small_config):
    replace_section(small_config, "rollout", engine="hf")
    replace_section(small_config, "train", steps=1)
    records = read_metrics(run_training(small_config, log=lambda *_: None) / "metrics.jsonl")
    (train,) = [r for r in records if r["kind"] == "train"]
    assert math.isfinite(train["loss/total"]) and train["optim/steps"] >= 2
    assert "eval/greedy/acc" in records[-1]


@pytest.mark.parametrize("name", METHOD_PRESETS.names())
def test_every_preset_trains_one_step(small_config, name):
    replace_section(small_config, "train", method=name, steps=1)
    replace_section(small_config, "data", eval_difficulties=(2,))
    run_dir = run_training(small_config, log=lambda *_: None)
    records = read_metrics(run_dir / "metrics.jsonl")
    (train,) = [r for r in records if r["kind"] == "train"]
    assert math.isfinite(train["loss/total"]) and train["optim/steps"] >= 2
    assert undocumented(records) == set()
    method = METHOD_PRESETS.get(name)
    if method.nthr is not None:  # by the stage, not the name (nthr_math_tab2_grpo is the NTHR paper's GRPO)
        assert "nthr/mixed_groups" in train
    if method.tr_grpo is not None:
        assert "tr_grpo/w_mean" in train


def test_prompt_order_is_a_seeded_permutation_per_epoch():
    steps = [loop.prompt_indices(10, 3, step * 4, 4) for step in range(5)]
    first_epoch = steps[0] + steps[1] + steps[2][:2]
    assert sorted(first_epoch) == list(range(10))
    assert steps == [loop.prompt_indices(10, 3, step * 4, 4) for step in range(5)]
    assert steps != [loop.prompt_indices(10, 4, step * 4, 4) for step in range(5)]


def test_undocumented_keys_are_caught():
    assert undocumented(
        [
            {
                "step": 1,
                "kind": "train",
                "loss/policy": 0.0,
                "pass/lopti_low/clip/frac": 0.1,
                "eval/sample/acc_7": 0.5,
                "loss/mystery": 1.0,
            }
        ]
    ) == {"loss/mystery"}


def test_eval_set_validation_is_disjoint_from_the_held_out_puzzles():
    """``data.eval_set=validation`` evaluates another generator range: no puzzle of it is a held-out
    (test) puzzle, so a setting chosen on it is not tuned on what results report."""
    from tokenbalance.config import RunConfig
    from tokenbalance.run.examples import eval_examples

    config = RunConfig()
    config.data.eval_count = 200
    held_out = eval_examples(config.data)
    config.data.eval_set = "validation"
    validation = eval_examples(config.data)
    assert [e.index for e in held_out] == list(range(1000, 1200))
    assert [e.index for e in validation] == list(range(10000, 10200))
    assert not {e.prompt for e in held_out} & {e.prompt for e in validation}
