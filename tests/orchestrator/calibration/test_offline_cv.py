"""Offline CV recalibration of paper 001 (calibrated-bo.md §1.2–1.3): LOO and time-series splits, isotonic /
GP / online regressors, sigma-rescaling, with an over-confident GP and with the real ExactGP."""

from __future__ import annotations

import re

import pytest
import torch

from orchestrator.calibration import build_calibrator, calibration_score
from orchestrator.calibration.offline_cv import OfflineCVCalibrator, cv_forecasts
from orchestrator.errors import ConfigError, InputDataError, QbatchError
from tests.orchestrator.acquisition.test_calibrated import FixedGP

TK = {"dtype": torch.float64}


def _data(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 1, generator=g, **TK)
    return X, torch.sin(6 * X[:, 0]) + 0.3 * torch.randn(n, generator=g, **TK)


def overconfident() -> FixedGP:
    return FixedGP(lengthscale=0.15, noise=0.01)  # standardized noise variance ~10x too small


def test_splits() -> None:
    X, Y = _data(10)
    fc, y, idx = cv_forecasts(overconfident, X, Y, "time-series", 4)
    assert idx.tolist() == [6, 7, 8, 9] and len(fc) == 4
    torch.testing.assert_close(y, Y[6:])
    fc, _, idx = cv_forecasts(overconfident, X, Y, "loo")
    assert idx.tolist() == list(range(10))
    with pytest.raises(InputDataError, match="at least 3 observations"):
        cv_forecasts(overconfident, X[:2], Y[:2], "loo")


@pytest.mark.parametrize("regressor", ["isotonic", "gp"])
def test_recalibration_improves_out_of_fold_calibration(regressor: str) -> None:
    X, Y = _data(30)
    cal = build_calibrator("offline-cv", model_factory=overconfident, regressor=regressor, spread="off")
    cal.fit(X, Y)
    u = cal.pits
    before = calibration_score(u)
    after = calibration_score(cal.unmap_levels(u))
    assert before > 0.3  # over-confident: PITs pile up at 0 and 1
    assert after < 0.4 * before, (before, after)
    p = torch.linspace(0.0, 1.0, 101, **TK)
    r = cal.map_levels(p)
    assert torch.all(r[1:] >= r[:-1] - 1e-12)
    assert cal.sigma_scale() > 1.5


def test_online_replay_widens() -> None:
    """Paper 000's Alg. 4: the online recalibrator replayed over time-series PITs. Its last iterate moves in
    steps of eta, so with 30 PITs it is checked for direction only: the central 80% interval widens."""
    X, Y = _data(30)
    cal = build_calibrator(
        "offline-cv", model_factory=overconfident, regressor="online", splits="time-series", spread="off"
    )
    cal.fit(X, Y)
    lo, hi = cal.map_levels(torch.tensor([0.1, 0.9], **TK)).tolist()
    assert lo < 0.05 and hi > 0.95


def test_sigma_mode_and_lazy_refit_via_updates() -> None:
    X, Y = _data(24, seed=1)
    cal = build_calibrator(
        "offline-cv", model_factory=overconfident, mode="sigma", splits="time-series", refit_every=5
    )
    for i in range(24):
        model = overconfident()
        if i >= 3:
            model.fit(X[:i], Y[:i])
            cal.update(model.forecast(X[i : i + 1]), Y[i : i + 1], X=X[i : i + 1])
        else:
            cal._update_one(None, Y[i], X[i])  # initial design: data only
    s = cal.sigma_scale()
    assert 1.8 < s < 6.0
    p = torch.tensor([0.1, 0.9], **TK)
    torch.testing.assert_close(
        torch.special.ndtri(cal.map_levels(p)), s * torch.special.ndtri(p), rtol=1e-3, atol=1e-3
    )


def test_with_exact_gp_and_state(tmp_path) -> None:
    X, Y = _data(9, seed=2)
    cal = build_calibrator("offline-cv", splits="time-series", n_splits=2)  # default factory: ExactGP
    cal.fit(X, Y)
    assert cal.pits.numel() == 2
    torch.save(cal.get_state(), tmp_path / "o.pt")
    fresh = build_calibrator("offline-cv", splits="time-series", n_splits=2)
    fresh.set_state(torch.load(tmp_path / "o.pt", weights_only=True))
    p = torch.linspace(0.05, 0.95, 7, **TK)
    torch.testing.assert_close(fresh.map_levels(p), cal.map_levels(p), atol=1e-5, rtol=1e-5)
    # a calibrator built with other options refuses the state, naming them: restored silently, it would
    # rebuild the map its own way (a sigma-mode state in a GP-regressor calibrator)
    other = build_calibrator("offline-cv", splits="time-series", n_splits=2, regressor="gp", mode="sigma")
    with pytest.raises(QbatchError, match=r"other options \['regressor', 'mode'\] \(regressor='isotonic', "
                                          r"mode='quantile'\)"):
        other.set_state(torch.load(tmp_path / "o.pt", weights_only=True))
    old_state = {k: v for k, v in cal.get_state().items() if k not in OfflineCVCalibrator.option_keys}
    fresh.set_state(old_state)  # a checkpoint written before the options were saved still restores
    torch.testing.assert_close(fresh.map_levels(p), cal.map_levels(p), atol=1e-5, rtol=1e-5)
    with pytest.raises(ConfigError, match="calibrator.options.regressor"):
        build_calibrator("offline-cv", regressor="mlp")
    # wrong types are named, not tracebacks from dict() and the model table
    for bad in ([["num_inducing", 16]], "abc", 5):
        with pytest.raises(ConfigError, match=r"`calibrator.options.model_options` must be a mapping of "
                                              r"option names to values; got " + re.escape(repr(bad))):
            build_calibrator("offline-cv", model_options=bad)
    with pytest.raises(ConfigError, match=r"`calibrator.options.model` must be a model name \(a string\); "
                                          r"got \['exact-gp'\]"):
        build_calibrator("offline-cv", model=["exact-gp"])
    with pytest.raises(ConfigError, match="calibrator.options.splits"):
        build_calibrator("offline-cv", splits="kfold")
    # leave-one-out holds out every point: n_splits is refused there, not silently ignored
    with pytest.raises(ConfigError, match=r"`calibrator.options.n_splits` is read only with splits "
                                          r"'time-series'; got n_splits 3 with splits 'loo'"):
        build_calibrator("offline-cv", n_splits=3)


def test_fold_cache_reuses_time_series_folds() -> None:
    """The cache is exact for time-series folds (a prefix's fit is reused, so one new fit per appended
    result); with fixed hyperparameters it equals the uncached forecasts. LOO folds are not cached (each
    starts from the full-data fit instead: `test_a_restored_loo_calibrator_maps_as_the_original`)."""
    X, Y = _data(14, seed=3)
    calls = []

    def factory() -> FixedGP:
        calls.append(1)
        return overconfident()

    for splits, n_splits in (("time-series", 5),):
        cache: dict = {}
        cv_forecasts(factory, X[:13], Y[:13], splits, n_splits, cache)
        calls.clear()
        fc, y, idx = cv_forecasts(factory, X, Y, splits, n_splits, cache)
        ref, y_ref, idx_ref = cv_forecasts(overconfident, X, Y, splits, n_splits)
        assert idx.tolist() == idx_ref.tolist()
        torch.testing.assert_close(fc.mean(), ref.mean())
        torch.testing.assert_close(fc.variance(), ref.variance())
        torch.testing.assert_close(y, y_ref)
        # only the fold that tests the new point is fitted
        assert len(calls) == 1, (splits, len(calls))
        assert sorted(cache) == idx.tolist()  # folds that left the split set are dropped
    # a changed prefix is refitted, not reused
    cache = {}
    cv_forecasts(factory, X, Y, "time-series", 5, cache)
    calls.clear()
    Y2 = Y.clone()
    Y2[0] += 1.0
    fc, _, _ = cv_forecasts(factory, X, Y2, "time-series", 5, cache)
    assert len(calls) == 5
    torch.testing.assert_close(fc.mean(), cv_forecasts(overconfident, X, Y2, "time-series", 5)[0].mean())


def test_a_restored_loo_calibrator_maps_as_the_original(tmp_path) -> None:
    """Each LOO fold starts from a cold fit to all the data, so a restored calibrator's map, and the
    proposals, match the original's (folds refitted warm from their own previous fits, which the state does
    not keep,
    diverge: sigma scale 2.12 against 1.87 one batch after the restore)."""
    X, Y = _data(16, seed=4)
    a = build_calibrator("offline-cv", splits="loo", refit_every=2, min_points=6)
    for i in range(10):
        a.observe(Y[i : i + 1], X[i : i + 1])
    torch.save(a.get_state(), tmp_path / "a.pt")
    b = build_calibrator("offline-cv", splits="loo", refit_every=2, min_points=6)
    b.set_state(torch.load(tmp_path / "a.pt", weights_only=True))
    p = torch.linspace(0.05, 0.95, 7, **TK)
    for i in range(10, 16):
        a.observe(Y[i : i + 1], X[i : i + 1])
        b.observe(Y[i : i + 1], X[i : i + 1])
        torch.testing.assert_close(b.pits, a.pits, rtol=0, atol=1e-12)
        torch.testing.assert_close(b.map_levels(p), a.map_levels(p), rtol=0, atol=1e-12)
        assert b.sigma_scale() == a.sigma_scale()


def test_the_initial_design_reaches_the_recalibrator_through_ask_tell() -> None:
    """calibrated-bo.md §1.3-1.4: CALIBRATE(M, D) runs over all of D and R is built right after the initial
    design. Sobol results carry no forecast, yet they reach the calibrator too, so R is not the identity
    through the design and its folds are not fitted on BO points alone."""
    import math

    from orchestrator.ask_tell import AskTellOptimizer

    opt = AskTellOptimizer(
        {"x": {"type": "float", "low": 0.0, "high": 1.0}},
        model="exact-gp",
        proposer="calibrated",
        calibrator="offline-cv",
        initial_design=6,
        seed=0,
        calibrator_options={"spread": "off"},
        proposer_options={"num_restarts": 2, "raw_samples": 32, "maxiter": 20},
    )
    for rnd in range(4):
        for t in opt.ask(3):
            opt.tell(t.trial_id, math.sin(6 * t.params["x"]))
        opt.flush_calibration()
        cal = opt.calibrator
        X, Y = opt.observations()
        assert cal.X.shape[0] == X.shape[0] == 3 * (rnd + 1)  # every result, in ask order
        assert torch.equal(cal.Y, Y) and torch.equal(cal.X, X)
        assert cal._map is not None  # recalibrated from the design on (min_points = 3)
    state = cal.get_state()
    again = AskTellOptimizer({"x": {"type": "float", "low": 0.0, "high": 1.0}}, model="exact-gp",
                             proposer="calibrated", calibrator="offline-cv", initial_design=6, seed=0,
                             calibrator_options={"spread": "off"})
    again.set_state(opt.get_state())
    assert torch.equal(again.calibrator.Y, cal.Y) and state["Y"] is not None


def test_a_batch_of_results_is_one_recalibration() -> None:
    """`update` with a batch of k results refits the LOO folds once, not k times (each per-point refit was
    thrown away by the next one), and ends on the map of a refit over all of the data."""
    X, Y = _data(20, seed=4)
    fits = []

    class Counting(FixedGP):
        def fit(self, X, Y, *args, **kwargs):  # noqa: N803
            fits.append(X.shape[0])
            return super().fit(X, Y, *args, **kwargs)

    def factory() -> FixedGP:
        return Counting(lengthscale=0.15, noise=0.01)

    cal = build_calibrator("offline-cv", model_factory=factory, splits="loo", spread="off")
    cal.fit(X[:12], Y[:12])
    fits.clear()
    model = overconfident()
    model.fit(X[:12], Y[:12])
    cal.update(model.forecast(X[12:]), Y[12:], X=X[12:])
    # one LOO refit over the 20 points: the full-data fit its folds start from, then the 20 folds
    # (per point: 8 x 1 + 13 + 14 + ... + 20 = 140 fits)
    assert fits == [20] + [19] * 20
    assert cal.num_updates == 8 and cal.Y.numel() == 20
    ref = build_calibrator("offline-cv", model_factory=overconfident, splits="loo", spread="off")
    ref.fit(X, Y)
    p = torch.linspace(0.05, 0.95, 7, **TK)
    torch.testing.assert_close(cal.map_levels(p), ref.map_levels(p))
    with pytest.raises(InputDataError, match="needs the point x"):
        cal.update(model.forecast(X[:2]), Y[:2])


def test_sigma_mode_with_equal_outcomes_is_the_identity_and_eta_is_checked_when_built() -> None:
    """With every outcome equal (a plateaued objective) the out-of-fold residuals are 0: no error means no
    rescaling, not a sigma map divided by 0 and a NaN acquisition. A bad `eta` is refused by the config,
    naming the key, not at the first recalibration."""
    X = torch.linspace(0, 1, 6, dtype=torch.float64).reshape(-1, 1)
    cal = build_calibrator("offline-cv", mode="sigma", splits="loo", spread="off")
    cal.fit(X, torch.full((6,), 3.0, dtype=torch.float64))
    assert cal.sigma_scale() == 1.0
    levels = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
    assert torch.allclose(torch.as_tensor(cal.map_levels(levels), dtype=torch.float64), levels)
    for eta in (-1, 0, float("nan"), "abc", True):
        with pytest.raises(ConfigError, match=r"`calibrator.options.eta` is out of range"):
            build_calibrator("offline-cv", eta=eta)


def test_the_folds_refit_the_runs_own_model_by_default() -> None:
    """calibrated-bo.md §1.3: each fold refits "the same model class as M". In a run the default fold model is
    the run's, with its options and tau (a heteroscedastic run's map is not learned on exact-GP folds);
    `model: exact-gp` still chooses the cheaper stand-in."""
    from orchestrator.ask_tell import AskTellOptimizer
    from orchestrator.models.exact_gp import ExactGP
    from orchestrator.models.het_svgp import HeteroscedasticSVGP

    space = {"x": {"type": "float", "low": 0.0, "high": 1.0}}
    opt = AskTellOptimizer(space, model="heteroscedastic", proposer="calibrated", calibrator="offline-cv",
                           model_options={"num_inducing": 7})
    fold = opt.calibrator.model_factory()
    assert isinstance(fold, HeteroscedasticSVGP) and fold.options.num_inducing == 7 and fold.tau == 0.5
    opt = AskTellOptimizer(space, model="heteroscedastic", proposer="calibrated", calibrator="offline-cv",
                           calibrator_options={"model": "exact-gp"})
    assert isinstance(opt.calibrator.model_factory(), ExactGP)


def test_fold_model_options_without_a_model_keep_the_exact_gp_default() -> None:
    """`model_options` alone are the default fold model's (the exact GP's), not merged into the run's
    heteroscedastic model and refused."""
    from orchestrator.ask_tell import AskTellOptimizer
    from orchestrator.models.exact_gp import ExactGP

    opt = AskTellOptimizer({"x": {"type": "float", "low": 0.0, "high": 1.0}}, model="heteroscedastic",
                           proposer="calibrated", calibrator="offline-cv",
                           calibrator_options={"model_options": {"warm_start": False}})
    fold = opt.calibrator.model_factory()
    assert isinstance(fold, ExactGP) and fold.warm_start is False


def test_the_gp_regressor_leaves_uniform_pits_near_the_identity() -> None:
    """Away from the PITs the GP regressor does not fall back to the mean of p-hat (~0.46), where the running
    maximum would hold R from u = 1e-4 to the median: for a calibrated model, ~46% of the mass at -inf."""
    import numpy as np

    from orchestrator.calibration.offline_cv import _GRID

    for seed in range(3):
        u = np.random.default_rng(seed).uniform(size=200)
        R = build_calibrator("offline-cv", regressor="gp", spread="off")._fit_regressor(u)
        assert np.all(np.diff(R) >= 0) and np.max(np.abs(R - _GRID)) < 0.1
