"""The test reward of the stop end to end: the varying reward of :mod:`.reward`, and a stop request
made once inside step 2.

When the metrics file verl's logger writes (``VERL_FILE_LOGGER_PATH``) holds step 1, the run is in
step 2 or later: the first call that sees it creates the file ``TOKENBALANCE_STOP_FILE`` names (as a
user's ``touch``), so the trainer saves step 2 at step 3's beginning and stops. ``STOP_TEST_ONCE``
names a marker (created exclusively) so that a resumed run is not stopped again.
"""

from __future__ import annotations

import os
from typing import Any

from tests.integrations.verl_cpu.reward import compute_score as letter_share


def _request_stop_in_step_2() -> None:
    names = ("VERL_FILE_LOGGER_PATH", "TOKENBALANCE_STOP_FILE", "STOP_TEST_ONCE")
    metrics, stop, once = (os.environ.get(name) for name in names)
    if not metrics or not stop or not once or not os.path.exists(metrics):
        return
    with open(metrics) as lines:
        if not any(line.startswith('{"step":1,') for line in lines):  # verl writes orjson, no spaces
            return
    try:
        os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    open(stop, "a").close()


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info=None, **_: Any) -> float:
    _request_stop_in_step_2()
    return letter_share(data_source, solution_str, ground_truth, extra_info)
