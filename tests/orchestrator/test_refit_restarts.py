"""`AskTellOptimizer.refit_restarts`: the refits that `ask` starts also fit from scratch and keep the lower
loss."""

from __future__ import annotations

import math

import pytest

from orchestrator.ask_tell import AskTellOptimizer

SPACE = {"x": {"type": "float", "low": 0.0, "high": 1.0}, "y": {"type": "float", "low": 0.0, "high": 1.0}}


def _run(restarts: bool) -> list[dict]:
    opt = AskTellOptimizer(SPACE, model="exact-gp", tau=0.5, initial_design=6, seed=3)
    opt.refit_restarts = restarts
    fits: list[dict] = []
    original = opt.fit

    def spy(restart: bool = False, stop=None):
        diag = original(restart=restart, stop=stop)
        fits.append({"restart": restart, **diag})
        return diag

    opt.fit = spy  # type: ignore[method-assign]
    for _ in range(4):
        for t in opt.ask(4):
            opt.tell(t.trial_id, -((t.params["x"] - 0.3) ** 2) - (t.params["y"] - 0.6) ** 2)
    return fits


@pytest.mark.parametrize("restarts", [False, True])
def test_ask_restarts_its_refits_only_when_told(restarts: bool) -> None:
    fits = _run(restarts)
    assert len(fits) >= 2
    assert all(f["restart"] is restarts for f in fits)
    warm_refits = fits[1:]  # the first fit has no model to warm-start from, so nothing to restart
    for f in warm_refits:
        if restarts:
            assert f["restart_kept"] in ("warm", "cold")
            kept = f["loss_cold"] if f["restart_kept"] == "cold" else f["loss_warm"]
            assert math.isfinite(kept) and kept <= max(f["loss_cold"], f["loss_warm"])
        else:
            assert "restart_kept" not in f


def test_a_callers_fit_restarts_and_best_follows_the_kept_fit() -> None:
    """`fit()` called before `best()` also fits from scratch, so the answer does not hang on a warm basin."""
    opt = AskTellOptimizer(SPACE, model="exact-gp", tau=0.5, initial_design=6, seed=3)
    for _ in range(3):
        for t in opt.ask(4):
            opt.tell(t.trial_id, -((t.params["x"] - 0.3) ** 2) - (t.params["y"] - 0.6) ** 2)
    diag = opt.fit()
    assert diag["restart_kept"] in ("warm", "cold")
    assert min(diag["loss_warm"], diag["loss_cold"]) == pytest.approx(
        diag["loss_cold"] if diag["restart_kept"] == "cold" else diag["loss_warm"])
    params, predicted = opt.best()
    assert params == diag["best_params"] and predicted == diag["best_predicted"]
    assert "restart_kept" not in opt.fit(restart=False)
