"""The `qbatch run` progress bar's fields (orchestrator.runner.progress_fields): the best single observation
and the model's recommendation are two fields, never one that changes meaning when the first fit arrives."""

from __future__ import annotations

from orchestrator.runner import progress_fields


def _summary(observed=None, predicted=None):
    return {"done": 3, "evals_per_s": 1.5, "utilization": 0.875, "inflight": 2, "failed": 1,
            "best_observed": None if observed is None else {"params": {"x": 0.1}, "value": observed},
            "best_predicted": None if predicted is None else {"params": {"x": 0.2}, "value": predicted}}


def test_before_any_result_both_are_dashes():
    f = progress_fields(_summary())
    assert f == {
        "best_y": "-",
        "recommendation": "-",
        "evals_s": "1.50",
        "util": "0.88",
        "running": 2,
        "failed": 1,
    }


def test_before_the_first_fit_only_the_observation_is_shown():
    f = progress_fields(_summary(observed=4.3761))
    assert (f["best_y"], f["recommendation"]) == ("4.376", "-")


def test_sources_count_the_repeats_once_there_are_any():
    st = {**_summary(), "sources": {"sobol": 10, "model": 20}}
    assert "repeat" not in progress_fields(st) and progress_fields(st)["model"] == 20
    f = progress_fields({**st, "sources": {"sobol": 10, "model": 20, "repeat": 3}})
    assert (f["sobol"], f["model"], f["repeat"]) == (10, 20, 3)


def test_after_a_fit_the_recommendation_stands_beside_the_best_observation():
    # a noisy objective: the model's tau-level at its recommendation is below the luckiest observation,
    # and the bar keeps showing both instead of "best" dropping from 4.6 to 2.3
    f = progress_fields(_summary(observed=4.597, predicted=2.3246))
    assert (f["best_y"], f["recommendation"]) == ("4.597", "2.325")
