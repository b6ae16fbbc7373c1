"""Progress in a log: when the output is not a terminal, plain lines (step, loss or reward, seconds
per step, elapsed, time left) during the run, and the same lines in ``RUN_DIR/train.log``."""

import io
import re
from pathlib import Path

from tokenbalance.cli import main
from tokenbalance.run.repair import check_new_run_dir
from tokenbalance.run.state import LOG_FILE
from tokenbalance.trainer import runner
from tokenbalance.trainer.progress import Cadence, StepProgress, format_seconds, progress_log

from .conftest import SMALL_RUN

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d  "


def test_plain_lines_appear_during_the_loop_on_a_stream_that_is_not_a_terminal():
    stream = io.StringIO()
    seen_during = []
    with StepProgress(40, enabled=True, description="SFT", stream=stream) as bar:
        for step in range(1, 41):
            bar.advance(step, {"sft/loss": 2.0 / step})
            if step == 10:
                seen_during = stream.getvalue().splitlines()  # before the loop ends, not flushed at exit
    lines = stream.getvalue().splitlines()
    assert all(
        re.match(STAMP + r"SFT step \d+/40  loss \d\.\d{3}  \| \S+ s/step  elapsed \S+  left \S+$", x) for x in lines
    )
    steps = [int(re.search(r"step (\d+)/", line).group(1)) for line in lines]
    assert set(range(2, 41, 2)) <= set(steps)  # every 1/20 of the steps (and every 30 s)
    assert [int(re.search(r"step (\d+)/", x).group(1)) for x in seen_during][:5] == [1, 2, 4, 6, 8]
    assert "loss 0.050" in lines[-1] and lines[-1].endswith("left 0m00s")


def test_an_evaluation_is_a_line_of_its_own():
    stream = io.StringIO()
    bar = StepProgress(4, enabled=True, stream=stream)
    bar.note_eval({"eval/greedy/acc": 0.25, "eval/greedy/reward": -1.5, "eval/sample/acc": 0.125}, 2)
    assert stream.getvalue().split("  ", 1)[1] == (
        "RL eval at step 2: greedy acc 0.250  greedy reward -1.500  sample acc 0.125\n"
    )


def test_a_terminal_gets_the_bar_and_no_plain_lines():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    with StepProgress(3, enabled=True, stream=stream) as bar:
        bar.advance(1, {"reward/mean": 0.5})
    assert not re.search(STAMP, stream.getvalue())


def test_the_log_file_gets_the_lines_even_without_a_console_display(tmp_path):
    log = tmp_path / "train.log"
    stream = io.StringIO()
    with progress_log(log):
        with StepProgress(2, enabled=False, stream=stream) as bar:
            bar.advance(1, {"reward/mean": 0.5, "reward/acc": 0.25})
            bar.advance(2, {"reward/mean": 1.0})
    with StepProgress(2, enabled=False, stream=stream) as bar:  # outside the block: no file
        bar.advance(1, {})
    assert stream.getvalue() == ""
    lines = log.read_text().splitlines()
    assert [line.split("  ", 1)[1].split("  |")[0] for line in lines] == [
        "RL step 1/2  reward +0.50  acc 0.25",
        "RL step 2/2  reward +1.00",
    ]


def test_cadence_is_every_n_steps_or_every_interval():
    steps = Cadence(every_steps=5, every_s=1e9)
    assert [s for s in range(1, 21) if steps.due(s)] == [1, 5, 10, 15, 20]
    timed = Cadence(every_steps=10**9, every_s=0.0)
    assert [timed.due(s) for s in range(3)] == [True, True, True]
    assert format_seconds(3725) == "1h02m" and format_seconds(65) == "1m05s" and format_seconds(None) == "?"


def test_train_writes_progress_lines_to_stderr_and_to_train_log(small_config, capsys):
    small_config.output.progress = True
    run_dir = runner.run_training(small_config, log=lambda *_: None)
    err = capsys.readouterr().err
    lines = [line.split("  ", 1)[1] for line in err.splitlines() if re.match(STAMP, line)]
    assert lines[0].startswith("RL eval at step 0: greedy acc ")
    assert [line.split("  ")[0] for line in lines[1:]] == [
        "RL step 1/2",
        "RL step 2/2",
        "RL eval at step 2: greedy acc 0.000",
    ]
    assert " reward " in lines[1] and " loss " in lines[1] and " s/step  elapsed " in lines[1]
    logged = [line.split("  ", 1)[1] for line in (run_dir / LOG_FILE).read_text().splitlines()]
    assert logged == lines


def test_a_run_directory_holding_only_the_log_of_a_start_that_stopped_early_may_start_a_run(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / LOG_FILE).write_text("2026-01-01 00:00:00  SFT step 1/400  loss 5.000\n")
    check_new_run_dir(run_dir)  # the embedded SFT was stopped before the run began: not refused


def test_eval_prints_plain_lines_when_not_a_terminal(tiny_policy_dir, capsys):
    sets = [arg for item in SMALL_RUN if item != "output.progress=false" for arg in ("--set", item)]
    assert main(["eval", "--model", str(Path(tiny_policy_dir)), *sets]) == 0
    err = capsys.readouterr().err
    # 4 puzzles at each of 2 difficulties, greedy then sampled: 16 responses in batches of 8
    assert [line.split("  ")[1] for line in err.splitlines() if re.match(STAMP, line)] == [
        "eval response 8/16",
        "eval response 16/16",
    ]
