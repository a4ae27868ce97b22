"""The one checker of option values (objectives/checks.py), which the orchestrator's option checks and the
objectives' option checks both wrap: the error type is the caller's, and a choice matches only its own
kind."""

from __future__ import annotations

import numpy as np
import pytest

from objectives import checks, options
from objectives.base import ObjectiveError
from orchestrator import checks as orchestrator_checks
from orchestrator.errors import ConfigError


def test_a_choice_matches_only_a_value_of_its_own_kind():
    assert checks.is_among(1, [1, 2]) and checks.is_among("a", ("a", "b"))
    assert not checks.is_among(True, [1, 2])  # True == 1 in Python
    assert not checks.is_among(1, [True, False])
    assert not checks.is_among("1", [1, 2]) and not checks.is_among(1, ["1"])
    # an array's == gives no truth value (or one that is not a string's)
    assert not checks.is_among(np.array([1, 2]), [1]) and not checks.is_among(np.array(["a"]), ["a"])
    assert checks.is_among(np.str_("a"), ["a"]) and checks.is_among(np.int64(2), [1, 2])


def test_every_check_raises_the_error_type_it_is_given():
    for check, args in [(checks.check_int, ("`n`", 0, 1)), (checks.check_float, ("`x`", -1.0, 0.0)),
                        (checks.check_bool, ("`b`", "no")), (checks.check_choice, ("`c`", "z", ["a"]))]:
        with pytest.raises(KeyError):
            check(*args, error=KeyError)
        with pytest.raises(TypeError):  # no default: the owner names its error type
            check(*args)


def test_the_two_wrappers_word_one_check_for_their_owners():
    with pytest.raises(ConfigError, match=r"^`n` must be an integer >= 1; got 0$"):
        orchestrator_checks.check_int("`n`", 0, 1)
    with pytest.raises(ObjectiveError, match=r"^option 'n' must be an integer >= 1; got 0$"):
        options.check_int("n", 0, 1)
    with pytest.raises(ObjectiveError,
                       match=r"^option 'x' must be None or a finite number in \(0, 1\]; got 0$"):
        options.check_float("x", 0, 0.0, 1.0, low_open=True, optional=True)
    # a misspelt string choice is named by both
    with pytest.raises(ConfigError, match=r"got 'adma' \(did you mean 'adam'\?\)"):
        orchestrator_checks.check_choice("`opt`", "adma", ["adam", "sgd"])
    with pytest.raises(ObjectiveError,
                       match=r"option 'opt' must be one of \['adam', 'sgd'\]; got 'adma' \(did"):
        options.check_choice("opt", "adma", ["adam", "sgd"])
    assert orchestrator_checks.check_int.__name__ == "check_int" and orchestrator_checks.check_int.__doc__
