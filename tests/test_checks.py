"""The shared scalar checks (tokenbalance.checks): one range rule and one message format for the
config, the algorithms, the tasks and the models."""

import math

import pytest

from tokenbalance.algorithms import _checks
from tokenbalance.checks import check_choice, check_range
from tokenbalance.options import _check_field


@pytest.mark.parametrize(
    "args, kwargs",
    [
        (("x", 0.5, 0.0, 1.0), {}),
        (("x", 1.0, 0.0, 1.0), {}),
        (("x", 0, 0, None), {"integer": True}),
        (("x", -5), {"integer": True}),
        (("x", 1e300, 0.0), {"low_open": True}),
        (("x", -3.0, None, 0.0), {"high_open": False}),
    ],
)
def test_values_inside_pass(args, kwargs):
    check_range(*args, **kwargs)


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        (("lr", 0.0, 0.0, 1.0), {"low_open": True}, r"lr: must be in \(0.0, 1.0\], got 0.0"),
        (("eta", 1.0, 0.0, 1.0), {"high_open": True}, r"eta: must be in \[0.0, 1.0\), got 1.0"),
        (("eta", math.nan, 0.0, 1.0), {}, r"eta: must be in \[0.0, 1.0\], got nan"),
        (("c", math.inf, 1.0, math.inf), {}, r"c: must be in \[1.0, inf\], got inf"),
        (("steps", "many", 0, None), {}, r"steps: must be in \[0, inf\], got 'many'"),
        (("flag", True, 0, 1), {}, r"flag: must be in \[0, 1\], got True"),
        (("count", 0, 1), {"integer": True}, r"count: must be an integer in \[1, inf\], got 0"),
        (("count", 2.0, 1), {"integer": True}, r"count: must be an integer in \[1, inf\], got 2.0"),
        (("level", 7, 1, 5), {"integer": True}, r"level: must be an integer in \[1, 5\], got 7"),
        (("top", 2, None, 1), {}, r"top: must be in \[-inf, 1\], got 2"),
        (("seed", "x"), {"integer": True}, r"seed: must be an integer, got 'x'"),
        (("w", math.nan), {}, r"w: must be a finite number, got nan"),
    ],
)
def test_values_outside_name_the_argument_value_and_range(args, kwargs, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        check_range(*args, **kwargs)


def test_one_function_behind_the_config_the_algorithms_and_choices():
    assert _checks.in_range is check_range and _checks.choice is check_choice
    meta = {"low": 0.0, "high": 1.0, "low_open": True}
    with pytest.raises(ValueError) as from_config:
        _check_field("optim.lr", 1.5, meta)
    with pytest.raises(ValueError) as direct:
        check_range("optim.lr", 1.5, 0.0, 1.0, low_open=True)
    assert str(from_config.value) == str(direct.value) == "optim.lr: must be in (0.0, 1.0], got 1.5"
    with pytest.raises(ValueError, match=r"^mode: unknown value 'x'; valid: 'a', 'b'$"):
        check_choice("mode", "x", ("a", "b"))
    check_choice("mode", "a", ["a", "b"])
