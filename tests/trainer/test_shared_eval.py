"""The step-0 evaluation shared between runs (``train.start_eval_cache``): entries per mode and seed, another run's
entry read, a locked entry taken up after the rest, a damaged one refused, and runs that share it logging exactly what
they would have computed alone."""

import json
import threading
import time

import pytest
import torch

from tests.trainer.conftest import replace_section
from tests.trainer.test_loop import without_timing
from tokenbalance.diagnostics.sinks import read_metrics
from tokenbalance.outputs import write_text_atomic
from tokenbalance.run.fingerprints import policy_digest
from tokenbalance.run.lock import RunLock
from tokenbalance.trainer.evaluate import read_outcomes
from tokenbalance.trainer.runner import run_training
from tokenbalance.trainer.shared_eval import RESPONSES_FILE, SharedEvaluation, read_entry

PROMPTS = [[11, 12], [13]]


def counting_generate(calls):
    def generate(mode):
        calls.append(mode)
        return [[1, 2, 3], [4]] if mode == "greedy" else [[5, 6], [7, 8, 9]]

    return generate


def test_each_mode_generated_once_greedy_across_seeds_sampled_per_seed(tmp_path):
    calls = []
    first = SharedEvaluation(tmp_path, "key", seed=0, note=lambda _: None).generations(
        counting_generate(calls), PROMPTS
    )
    assert calls == ["greedy", "sample"]
    again = SharedEvaluation(tmp_path, "key", seed=0, note=lambda _: None).generations(
        counting_generate(calls), PROMPTS
    )
    assert calls == ["greedy", "sample"] and again == first
    SharedEvaluation(tmp_path, "key", seed=1, note=lambda _: None).generations(counting_generate(calls), PROMPTS)
    assert calls == ["greedy", "sample", "sample"]  # greedy read, the seed-1 sample generated
    SharedEvaluation(tmp_path, "other", seed=0, note=lambda _: None).generations(counting_generate(calls), PROMPTS)
    assert calls[3:] == ["greedy", "sample"]  # another key shares nothing
    SharedEvaluation(tmp_path, "key", seed=0, note=lambda _: None).generations(counting_generate(calls), [[11], [13]])
    assert calls[5:] == ["greedy", "sample"]  # nor do other prompts
    # greedy: 3 entries (key, other key, other prompts); sample: 4 (2 seeds, other key, other prompts)
    assert len(list(tmp_path.iterdir())) == 7


def test_an_entry_another_run_is_generating_is_taken_up_after_the_rest(tmp_path):
    shared = SharedEvaluation(tmp_path, "key", seed=0, note=lambda _: None, poll_s=0.01)
    busy = RunLock(shared.entry("greedy", PROMPTS)).acquire()  # another run is generating greedy
    calls = []

    def finish_the_other_run():
        time.sleep(0.2)
        document = {"responses": [[9], [9, 9]]}
        # atomically, as a run writes it: a plain write could be read half-written by the polling run
        write_text_atomic(shared.entry("greedy", PROMPTS) / RESPONSES_FILE, json.dumps(document))
        busy.release()

    other = threading.Thread(target=finish_the_other_run)
    other.start()
    found = shared.generations(counting_generate(calls), PROMPTS)
    other.join()
    assert calls == ["sample"]  # generated while the other run held greedy, which was then read
    assert found == {"greedy": [[9], [9, 9]], "sample": [[5, 6], [7, 8, 9]]}


def test_an_entry_whose_generator_died_is_generated_again(tmp_path):
    shared = SharedEvaluation(tmp_path, "key", seed=0, note=lambda _: None)
    RunLock(shared.entry("greedy", PROMPTS)).acquire().release()  # a run that locked it and ended without a file
    calls = []
    shared.generations(counting_generate(calls), PROMPTS)
    assert calls == ["greedy", "sample"]


def test_a_damaged_entry_is_refused_naming_it(tmp_path):
    entry = tmp_path / "greedy-0123"
    entry.mkdir()
    (entry / RESPONSES_FILE).write_text('{"responses": [[1], ')
    with pytest.raises(ValueError, match=f"{entry / RESPONSES_FILE}: not a shared evaluation"):
        read_entry(entry)
    assert read_entry(tmp_path / "absent") is None


def test_policy_digest_follows_every_weight():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    copy = torch.nn.Linear(3, 2)
    copy.load_state_dict(model.state_dict())
    assert policy_digest(model) == policy_digest(copy)
    with torch.no_grad():
        copy.bias[1] += 2**-20
    assert policy_digest(model) != policy_digest(copy)
    assert policy_digest(model) != policy_digest(model.to(torch.bfloat16))


def test_runs_sharing_the_start_evaluation_log_what_they_would_alone(small_config, tmp_path):
    replace_section(small_config, "train", steps=1)
    alone_method = small_config.train.method
    alone = run_training(small_config, log=lambda *_: None)
    replace_section(small_config, "train", start_eval_cache=str(tmp_path / "shared"))
    small_config.output.run_dir = str(tmp_path / "first")
    first = run_training(small_config, log=lambda *_: None)
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "shared").iterdir()) == ["greedy", "sample"]
    # another method from the same policy and seed reads both modes; the entries are left as they were
    before = {p: (p / RESPONSES_FILE).read_bytes() for p in (tmp_path / "shared").iterdir()}
    replace_section(small_config, "train", method="ar_lopti")
    small_config.output.run_dir = str(tmp_path / "second")
    second = run_training(small_config, log=lambda *_: None)
    assert {p: (p / RESPONSES_FILE).read_bytes() for p in (tmp_path / "shared").iterdir()} == before
    assert "responses read from" in (second / "train.log").read_text()
    evals = [
        [r for r in without_timing(read_metrics(run / "metrics.jsonl")) if r["kind"] == "eval" and r["step"] == 0]
        for run in (alone, first, second)
    ]
    assert evals[0] == evals[1] == evals[2] and len(evals[0]) == 1
    step0 = [{k: v for k, v in read_outcomes(run).items() if k[0] == 0} for run in (alone, first, second)]
    assert step0[0] == step0[1] == step0[2] and len(step0[0]) == 2
    # the shared evaluation changes nothing the run trains on, whether it generated the responses or read them
    replace_section(small_config, "train", method=alone_method)
    small_config.output.run_dir = str(tmp_path / "third")
    third = run_training(small_config, log=lambda *_: None)
    assert "responses generated" not in (third / "train.log").read_text()
    trained = [without_timing(read_metrics(run / "metrics.jsonl")) for run in (alone, first, third)]
    assert trained[0] == trained[1] == trained[2] and len(trained[0]) == 3
