"""The ask/tell optimizer's design phase (orchestrator/ask_tell/): the Sobol design continues across asks
(the scrambled sequence seeded by the optimizer's seed, each point with its index in it), the default
design size `max(2 d + 2, 5)`, at least 2 results before a fit, the best observed value in the user's
direction, and per-trial seeds `crc32(f"{seed}:{trial_id}") & 0x7FFFFFFF`."""

from __future__ import annotations

import zlib

import pytest
import torch

from orchestrator.ask_tell import AskTellOptimizer, trial_seed
from orchestrator.errors import InputDataError

SPACE3 = {
    "a": {"type": "float", "low": -1.0, "high": 1.0},
    "b": {"type": "float", "low": 0.0, "high": 2.0},
    "c": {"type": "float", "low": 10.0, "high": 20.0},
}
SPACE1 = {"x": {"type": "float", "low": 0.0, "high": 1.0}}


def _crc_seed(seed: int, trial_id: str) -> int:
    return zlib.crc32(f"{seed}:{trial_id}".encode()) & 0x7FFFFFFF


# ---------------------------------------------------------------------------------------- Sobol design
@pytest.mark.parametrize("seed", [0, 7])
def test_two_asks_continue_one_sobol_sequence(seed):
    opt = AskTellOptimizer(SPACE3, initial_design=20, seed=seed)
    first, second = opt.ask(4), opt.ask(4)
    X = torch.stack([t.x for t in first + second])
    expected = torch.quasirandom.SobolEngine(3, scramble=True, seed=seed).draw(8, dtype=torch.float64)
    assert torch.allclose(X, expected, rtol=0, atol=1e-12)
    assert len({tuple(r) for r in X.tolist()}) == 8
    # the params are the affine images of those points
    lows, widths = torch.tensor([-1.0, 0.0, 10.0]), torch.tensor([2.0, 2.0, 10.0])
    for t, u in zip(first + second, expected):
        want = (lows + u * widths).tolist()
        assert [t.params[k] for k in ("a", "b", "c")] == pytest.approx(want, abs=1e-12)
        assert t.source == "sobol"


def test_sobol_indices_count_across_asks():
    opt = AskTellOptimizer(SPACE3, initial_design=20, seed=0)
    first = opt.ask(3)
    assert [t.info["sobol_index"] for t in first] == [0, 1, 2]
    second = opt.ask(2)
    assert [t.info["sobol_index"] for t in second] == [3, 4]
    assert [t.trial_id for t in first + second] == ["0-0", "0-1", "0-2", "1-0", "1-1"]
    # the recorded copies carry the same indices
    assert opt.trial("1-1").info["sobol_index"] == 4


# ---------------------------------------------------------------------------------------- design size
def test_default_initial_design_is_max_of_2d_plus_2_and_5():
    assert AskTellOptimizer(SPACE3).initial_design == 8  # 2 * 3 + 2
    assert AskTellOptimizer(SPACE1).initial_design == 5  # max(4, 5)
    four = {f"x{i}": {"type": "float", "low": 0.0, "high": 1.0} for i in range(4)}
    assert AskTellOptimizer(four).initial_design == 10


def test_fit_with_one_result_is_refused():
    opt = AskTellOptimizer(SPACE1, initial_design=1, seed=0)
    (t,) = opt.ask(1)
    opt.tell(t.trial_id, 0.5)
    with pytest.raises(InputDataError, match="at least 2 completed results; have 1"):
        opt.fit()


def test_one_result_is_not_enough_to_fit_even_with_a_design_of_one():
    opt = AskTellOptimizer(SPACE1, initial_design=1, seed=0)
    (t,) = opt.ask(1)
    opt.tell(t.trial_id, 0.5)
    assert opt.num_completed == 1
    assert not opt.can_fit()
    assert not opt.uses_model()


# ---------------------------------------------------------------------------------------- best observed
@pytest.mark.parametrize("direction,value,index", [("maximize", 5.0, 1), ("minimize", 1.0, 0)])
def test_best_observed_follows_the_direction(direction, value, index):
    opt = AskTellOptimizer(SPACE1, initial_design=5, direction=direction, seed=0)
    trials = opt.ask(3)
    for t, y in zip(trials, [1.0, 5.0, 3.0]):
        opt.tell(t.trial_id, y)
    params, best = opt.best_observed()
    assert best == value
    assert params == trials[index].params


def test_best_observed_is_none_without_results():
    assert AskTellOptimizer(SPACE1, seed=0).best_observed() is None


# ---------------------------------------------------------------------------------------- trial seeds
def test_trial_seed_is_crc32_of_seed_and_id():
    assert trial_seed(0, "0-0") == zlib.crc32(b"0:0-0") & 0x7FFFFFFF
    assert trial_seed(1, "0-0") == zlib.crc32(b"1:0-0") & 0x7FFFFFFF
    assert trial_seed(0, "0-0") != trial_seed(1, "0-0")
    assert trial_seed(12345, "3-7") == zlib.crc32(b"12345:3-7") & 0x7FFFFFFF


@pytest.mark.parametrize("seed", [0, 1, 99])
def test_asked_trials_carry_the_seeded_evaluation_seed(seed):
    trials = AskTellOptimizer(SPACE1, seed=seed).ask(2)
    assert [t.seed for t in trials] == [_crc_seed(seed, "0-0"), _crc_seed(seed, "0-1")]
    assert all(0 <= t.seed < 2**31 for t in trials)
