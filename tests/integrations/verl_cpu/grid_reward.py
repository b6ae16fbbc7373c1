"""The test reward of the verl grid end to end: the varying reward of :mod:`.reward`, an accuracy
extra for the report, and a one-shot pause that lets the test kill a cell at a known step.

* ``score``: the share of the response's characters that are letters of the solution (:mod:`.reward`);
* ``correct``: its square, a stand-in for the K&K reward's 0/1 accuracy extra of the same name, the
  variable the verl report reads (:data:`tokenbalance.ablate.verl.results.ACCURACY_VARIABLE`). It
  differs from the score, so the test sees which one the table took;
* the pause: when ``GRID_TEST_PAUSE_AFTER`` names a file that exists (a cell's checkpoint tracker),
  the first call that finds it creates ``GRID_TEST_PAUSED`` (exclusively: once per test) and sleeps
  until the process is killed. A cell whose step-1 checkpoint exists so stops inside step 2, before
  logging it; every later call, in any cell or sitting, scores normally.
"""

from __future__ import annotations

import os
import time
from typing import Any

from tests.integrations.verl_cpu.reward import compute_score as letter_share


def _pause_once() -> None:
    trigger, marker = os.environ.get("GRID_TEST_PAUSE_AFTER"), os.environ.get("GRID_TEST_PAUSED")
    if not trigger or not marker or not os.path.exists(trigger):
        return
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    while True:
        time.sleep(1)


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info=None, **_: Any) -> dict:
    _pause_once()
    share = letter_share(data_source, solution_str, ground_truth, extra_info)
    return {"score": share, "correct": share * share}
