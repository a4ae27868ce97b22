"""Laser (FEL) simulator (quantile-expectile-bo.md §4.3): fitted to the LCLS data it reproduces the measured
energies and the skew of the repeated shots; exact quantiles match draws; the synthetic default needs no
file."""

from __future__ import annotations

import time

import numpy as np
import pytest
from scipy import stats

from objectives.base import ObjectiveError
from objectives.laser import ENERGY_COLUMN, QUAD_BOX, LaserSimulator


@pytest.fixture(scope="module")
def fitted(lcls_csv) -> LaserSimulator:
    return LaserSimulator.from_csv(lcls_csv)


@pytest.fixture(scope="module")
def synthetic() -> LaserSimulator:
    return LaserSimulator()


def test_mean_energy_correlates_with_the_measurements(fitted):
    X, y = fitted.initial_data()
    assert X.shape == (len(y), 16) and len(y) > 4000 - 10
    assert fitted.names == list(QUAD_BOX)
    corr = np.corrcoef(fitted.mean_array(X), y)[0, 1]
    print(f"correlation of simulated mean and measured pulse energy over {len(y)} rows: {corr:.3f}")
    assert corr > 0.5
    # the simulated mean is the mean of the simulated draws
    rng = np.random.default_rng(0)
    draws = fitted.sample_array(X[:20], rng, size=20_000)
    xi, omega, alpha = fitted.sn_params(X[:20])
    np.testing.assert_allclose(
        draws.mean(axis=0), fitted.mean_array(X[:20]), atol=5 * omega.max() / np.sqrt(20_000)
    )


def test_simulated_noise_is_skewed_where_the_repeats_are(fitted):
    X, y = fitted.initial_data()
    _, inverse, counts = np.unique(np.round(X, 4), axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    rng = np.random.default_rng(1)
    agree, total, pairs = 0, 0, []
    for g in np.flatnonzero(counts >= 8):
        rows = np.flatnonzero(inverse == g)
        data_skew = stats.skew(y[rows])
        sim_skew = stats.skew(fitted.sample_array(X[rows].mean(axis=0)[None], rng, size=5000)[:, 0])
        pairs.append((round(float(data_skew), 2), round(float(sim_skew), 2)))
        if abs(data_skew) > 0.5:
            total += 1
            agree += np.sign(sim_skew) == np.sign(data_skew) and abs(sim_skew) > 0.2
    print(f"(data skew, simulated skew) at groups with >= 8 shots: {pairs}; sign agreement {agree}/{total}")
    assert total >= 3
    assert agree >= 0.75 * total


def test_fitted_quantile_and_optimum(fitted):
    X, _ = fitted.initial_data()
    x = X[123]
    rng = np.random.default_rng(2)
    draws = fitted.sample_array(x[None], rng, size=20_000)[:, 0]
    for tau in (0.1, 0.5, 0.9):
        q = fitted.quantile(fitted.params_of(x), tau)
        dens = stats.gaussian_kde(draws)(q)[0]
        assert abs(np.quantile(draws, tau) - q) < 4.5 * np.sqrt(tau * (1 - tau) / 20_000) / dens
    x_opt, v_opt = fitted.optimum(0.9)
    assert fitted.quantile_array(X, 0.9).max() <= v_opt + 1e-9
    assert fitted.quantile(x_opt, 0.9) == pytest.approx(v_opt)


def test_synthetic_default_needs_no_file_and_its_quantile_is_exact(synthetic):
    assert (
        synthetic.csv_path is None and len(synthetic.space) == 16 and list(synthetic.space) == list(QUAD_BOX)
    )
    X, y = synthetic.initial_data(n_synthetic=200)
    assert X.shape == (200, 16) and np.all(np.isfinite(y))
    xi, omega, alpha = synthetic.sn_params(X)
    assert omega.std() > 0.02 and alpha.min() < -1 and alpha.max() > 1  # input-dependent scale and skew
    rng = np.random.default_rng(3)
    pts = X[[np.argmin(alpha), np.argmax(alpha)]]
    draws = synthetic.sample_array(pts, rng, size=20_000)
    assert stats.skew(draws[:, 0]) < -0.2 and stats.skew(draws[:, 1]) > 0.2
    for tau in (0.1, 0.9):
        exact = synthetic.quantile_array(pts, tau)
        for j in range(2):
            dens = stats.gaussian_kde(draws[:, j])(exact[j])[0]
            assert (
                abs(np.quantile(draws[:, j], tau) - exact[j]) < 4.5 * np.sqrt(tau * (1 - tau) / 20_000) / dens
            )
    # evaluate() draws from the same distribution
    p = synthetic.params_of(pts[0])
    ev = np.array([synthetic(p, seed=s) for s in range(2000)])
    assert stats.ks_2samp(ev, draws[:, 0]).pvalue > 1e-3


def test_synthetic_optimum_beats_random_settings(synthetic):
    x_opt, v_opt = synthetic.optimum(0.5)
    X, _ = synthetic.initial_data(n_synthetic=5000)
    assert synthetic.quantile_array(X, 0.5).max() <= v_opt
    assert synthetic.optimum(0.5) is synthetic.optimum(0.5)


def test_noise_lengthscale_bound_smooths_only_the_noise_fields(fitted, lcls_csv):
    """`noise_lengthscale_min` bounds the log-omega and alpha GPs' lengthscales; the energy field is
    untouched."""
    default_ls = [getattr(fitted._fields, f).kernel.k2.length_scale for f in ("log_omega", "alpha_raw")]
    assert min(default_ls) < 0.3  # maximum likelihood puts a bump at each replicate group
    smooth = LaserSimulator.from_csv(lcls_csv, noise_lengthscale_min=0.3)
    for f in ("log_omega", "alpha_raw"):
        assert getattr(smooth._fields, f).kernel.k2.length_scale >= 0.3 - 1e-12
    X, _ = fitted.initial_data()
    np.testing.assert_allclose(smooth.mean_array(X[:200]), fitted.mean_array(X[:200]), rtol=1e-12)
    # the smoother skewness field varies less over the measured settings than the default's bumps
    assert np.std(smooth.sn_params(X)[2]) < np.std(fitted.sn_params(X)[2])
    for bad in (0, -1.0, float("nan"), "0.3", True):
        with pytest.raises(ObjectiveError, match="noise_lengthscale_min"):
            LaserSimulator(noise_lengthscale_min=bad)


def test_bad_csv_errors_name_the_problem(tmp_path):
    with pytest.raises(ObjectiveError, match="not a file"):
        LaserSimulator(csv_path=tmp_path / "missing.csv")
    cols = list(QUAD_BOX)
    rng = np.random.default_rng(0)
    rows = rng.random((30, 16))
    f = tmp_path / "no_energy.csv"
    f.write_text(",".join(cols) + "\n" + "\n".join(",".join(map(str, r)) for r in rows))
    with pytest.raises(ObjectiveError, match=ENERGY_COLUMN):
        LaserSimulator(csv_path=f)
    f2 = tmp_path / "bad_row.csv"
    lines = [",".join(cols + [ENERGY_COLUMN])] + [",".join(map(str, list(r) + [3.0])) for r in rows]
    lines[6] = lines[6].replace(lines[6].split(",")[2], "oops", 1)
    f2.write_text("\n".join(lines))
    with pytest.raises(ObjectiveError, match=r"data row 5 \(line 7\).*QUAD:LI21:271:BCTRL.*oops"):
        LaserSimulator(csv_path=f2)
    lines.insert(2, "")  # blank lines are skipped, but the message names the file's own line number
    lines.insert(3, "")
    f2.write_text("\n".join(lines))
    with pytest.raises(ObjectiveError, match=r"data row 5 \(line 9\).*QUAD:LI21:271:BCTRL.*oops"):
        LaserSimulator(csv_path=f2)


def test_small_csv_builds_with_gaussian_fallback(tmp_path):
    """A CSV with no replicate groups still gives a working simulator (noise from the energy GP's noise)."""
    cols = list(QUAD_BOX)
    rng = np.random.default_rng(0)
    Z = rng.random((60, 16))
    y = 3.0 + Z[:, 0] - Z[:, 1] + 0.05 * rng.standard_normal(60)
    f = tmp_path / "small.csv"
    f.write_text(
        "\n".join(
            [",".join(cols + [ENERGY_COLUMN])] + [",".join(map(str, list(z) + [v])) for z, v in zip(Z, y)]
        )
    )
    sim = LaserSimulator(csv_path=f)
    assert len(sim.groups["alpha"]) == 0
    xi, omega, alpha = sim.sn_params(Z[:5])
    assert np.all(alpha == 0) and np.all(omega > 0)
    assert np.corrcoef(sim.mean_array(Z), y)[0, 1] > 0.9


def test_simulators_pickle(synthetic, fitted):
    import pickle

    for sim in (synthetic, fitted):
        clone = pickle.loads(pickle.dumps(sim))
        p = sim.params_of(sim.initial_data()[0][7])
        assert clone(p, seed=3) == sim(p, seed=3)
        assert clone.quantile(p, 0.2) == sim.quantile(p, 0.2)


def test_measurement_time_delays_but_does_not_change_the_value():
    from objectives.laser import LaserSimulator

    slow = LaserSimulator(measurement_s=0.2)
    fast = LaserSimulator()
    params = {n: float((lo + hi) / 2) for n, (lo, hi) in zip(fast.names, fast.bounds)}
    t0 = time.perf_counter()
    v = slow.evaluate(params, seed=7)
    assert time.perf_counter() - t0 >= 0.2
    assert v == fast.evaluate(params, seed=7)
    for bad in (-1.0, float("nan"), "1", True):
        with pytest.raises(ObjectiveError, match="measurement_s"):
            LaserSimulator(measurement_s=bad)


@pytest.mark.parametrize(
    "kw,name",
    [
        ({"model_seed": -1}, "model_seed"),
        ({"model_seed": "a"}, "model_seed"),
        ({"model_seed": 1.7}, "model_seed"),
        ({"energy_range": ("lo", 6)}, "energy_range"),
        ({"energy_range": None}, "energy_range"),
        ({"energy_range": (6.0, 0.2)}, "energy_range"),
    ],
)
def test_bad_options_name_the_option(kw, name):
    """These gave bare numpy/int() errors that did not say which option was wrong, or (1.7) were truncated."""
    with pytest.raises(ObjectiveError, match=name):
        LaserSimulator(**kw)


def test_measurement_options_without_a_csv_are_refused():
    """energy_range, n_gp_max, min_repeats and noise_lengthscale_min shape the fit to the measurements;
    without csv_path they are refused, not taken and ignored (the same value coming back whatever they
    are)."""
    with pytest.raises(ObjectiveError, match=r"option\(s\) \['min_repeats', 'energy_range'\] apply to a "
                                             r"simulator fitted to measurements \(option 'csv_path'\)"):
        LaserSimulator(energy_range=[0.2, 0.3], min_repeats=99)
    LaserSimulator(energy_range=(0.2, 6), n_gp_max=400)  # the defaults, restated, are fine
