"""Spread factor s_t / s_t(x) of the SVGP proposers: learned from one-step-ahead interval
misses, clipped, local where asked, wired by `attach`."""

from __future__ import annotations

import math

import pytest
import torch

from orchestrator.calibration import (
    SPREAD_MAX,
    SPREAD_MIN,
    SpreadTracker,
    attach,
    build_calibrator,
    interval_coverage,
)
from orchestrator.calibration.spread import scaled_forecast
from orchestrator.errors import ConfigError, InputDataError, UnsupportedError
from orchestrator.models.predictive import Forecast


def _fc(mu: float, var_f: float, sigma: float = 1e-3) -> Forecast:
    return Forecast(
        "asymmetric_laplace",
        0.3,
        torch.tensor([mu]),
        torch.tensor([var_f]),
        torch.tensor([math.log(sigma)]),
        0.0,
    )


def test_global_spread_learns_the_missing_width() -> None:
    g = torch.Generator().manual_seed(0)
    cal = build_calibrator("online", spread_eta=0.05)
    X = torch.rand(1, 2, dtype=torch.float64)
    us, T = [], 800
    for _ in range(T):
        fc = _fc(0.0, 1.0)
        y = 3.0 * torch.randn(1, generator=g, dtype=torch.float64)  # truth 3x wider than the f-posterior
        us.append(scaled_forecast(fc, cal.spread(X)[0]).cdf(y))
        cal.update(fc, y)
    s = cal.spread(torch.rand(4, 3, 2, dtype=torch.float64))
    assert s.shape == (4, 3) and torch.allclose(s, s[0, 0])
    assert 2.3 < float(s[0, 0]) < 3.8
    cov = interval_coverage(torch.cat(us))[0.8]
    assert abs(cov - 0.8) < 0.04


def test_spread_is_clipped() -> None:
    tr = SpreadTracker(eta=1.0)
    for _ in range(50):
        tr.update(_fc(0.0, 1e-2), torch.tensor(5.0))  # always missed, even at s = 10
    assert float(tr(torch.zeros(1, 1))) == pytest.approx(SPREAD_MAX)
    for _ in range(500):
        tr.update(_fc(0.0, 1.0), torch.tensor(0.0))  # always covered
    assert float(tr(torch.zeros(1, 1))) == pytest.approx(SPREAD_MIN)


def test_noise_dominated_forecasts_leave_the_spread_alone() -> None:
    """When the noise dominates the predictive of y, s barely moves the interval: the step is weighted by
    r = s^2 var_f / Var[y], so a noise model that is a little too wide no longer walks s to its lower clip
    (the unweighted ACI step would: it is checked here too, so the test can fail both ways)."""
    g = torch.Generator().manual_seed(3)
    fc = _fc(0.0, 0.01, sigma=1.0)  # Var[y] ~ var_f + c_v sigma^2, c_v ~ 4 here: r ~ 0.003
    # draws of the forecast's own shape with their levels squeezed into [0.2, 0.8]: always covered
    ys = fc.quantile(0.2 + 0.6 * torch.rand(2000, generator=g, dtype=torch.float64)).reshape(-1)
    assert ys.shape == (2000,)
    tr = SpreadTracker(eta=0.1)
    for y in ys[:1000]:
        tr.update(fc, y.reshape(1))
    assert 0.9 < float(tr(torch.zeros(1, 1))) < 1.1
    assert SpreadTracker.sensitivity(fc, 1.0) < 0.01 and SpreadTracker.sensitivity(_fc(0.0, 1.0), 1.0) > 0.99
    unweighted = SpreadTracker(eta=0.1)
    unweighted.sensitivity = lambda forecast, s: 1.0  # the plain ACI step
    for y in ys[1000:]:
        unweighted.update(fc, y.reshape(1))
    assert float(unweighted(torch.zeros(1, 1))) == pytest.approx(SPREAD_MIN)


def test_local_spread_separates_regions() -> None:
    g = torch.Generator().manual_seed(2)
    cal = build_calibrator("online", spread="local", spread_eta=0.1, spread_lengthscale=0.15)
    for _ in range(600):
        x = torch.rand(1, 1, generator=g, dtype=torch.float64)
        wide = 4.0 if x.item() < 0.5 else 1.0  # over-confident on the left only
        y = wide * torch.randn(1, generator=g, dtype=torch.float64)
        cal.update(_fc(0.0, 1.0), y, X=x)
    s = cal.spread(torch.tensor([[[0.2], [0.8]]], dtype=torch.float64))
    assert s.shape == (1, 2)
    assert float(s[0, 0]) > 2.0 * float(s[0, 1])
    with pytest.raises(InputDataError, match="localized and needs the points X"):
        cal.update(_fc(0.0, 1.0), torch.tensor([0.0]))


def test_state_round_trip_local(tmp_path) -> None:
    g = torch.Generator().manual_seed(3)
    cal = build_calibrator("online", spread="local")
    for _ in range(15):
        cal.update(
            _fc(0.0, 1.0),
            2 * torch.randn(1, generator=g, dtype=torch.float64),
            X=torch.rand(1, 2, generator=g, dtype=torch.float64),
        )
    torch.save(cal.get_state(), tmp_path / "s.pt")
    fresh = build_calibrator("online", spread="local")
    fresh.set_state(torch.load(tmp_path / "s.pt", weights_only=True))
    Xq = torch.rand(7, 2, generator=g, dtype=torch.float64)
    torch.testing.assert_close(fresh.spread(Xq), cal.spread(Xq))


class _SpreadProposer:
    """A proposer shape with the Thompson/Q-GIBBON hook (the real ones are tested once they land)."""

    uses_spread = True
    spread = None


class _AcquisitionProposer:
    """A proposer shape with the `calibrated` proposer's hook (the calibrator inside its acquisition)."""

    uses_calibrator = True
    calibrator = None


def test_attach_and_options() -> None:
    p = _SpreadProposer()
    cal = build_calibrator("online")
    assert attach(cal, p) is p and p.spread == cal.spread
    attach(build_calibrator("none"), p)
    assert p.spread is None
    # options the proposer never reads are refused (accepted, they would change nothing)
    with pytest.raises(UnsupportedError, match="with `spread: off` calibrator 'online' does nothing"):
        attach(build_calibrator("online", spread="off"), p)
    with pytest.raises(UnsupportedError, match=r"`calibrator.options` \['eta', 'levels'\] act only inside "
                                               r".*'calibrated'"):
        attach(build_calibrator("online", eta=0.5, levels=[0.2, 0.8]), p)
    with pytest.raises(UnsupportedError, match=r"\['alpha'\] act only inside"):
        attach(build_calibrator("locbo", alpha=0.2, spread_eta=0.2), p)
    attach(build_calibrator("locbo", spread="local", spread_eta=0.2), p)  # spread options: read by p
    acq = _AcquisitionProposer()
    with pytest.raises(UnsupportedError, match=r"\['spread', 'spread_eta'\] set the spread factor"):
        attach(build_calibrator("online", spread="local", spread_eta=0.2), acq)
    attach(build_calibrator("online", eta=0.5, spread="off"), acq)  # its own options: read by acq
    assert acq.calibrator.eta == 0.5
    assert torch.all(build_calibrator("none").spread(torch.rand(3, 2)) == 1)
    with pytest.raises(UnsupportedError, match="no `spread` or `calibrator` hook"):
        attach(cal, object())
    with pytest.raises(ConfigError, match="calibrator.options.spread` must be one of"):
        build_calibrator("online", spread="sideways")
    with pytest.raises(ConfigError, match="calibrator.options.spread_max"):
        build_calibrator("online", spread_max=0.5)
    with pytest.raises(ConfigError, match="need `spread` other than 'off'"):
        build_calibrator("online", spread="off", spread_eta=0.1)


def test_thompson_batch_spreads_out_when_calibrated() -> None:
    """An over-confident model (posterior std 10x too small): one-step-ahead misses drive s up to about 10,
    and the Thompson batch, whose paths become mu + s (path - mu), spreads out over the cube."""
    from orchestrator.acquisition.thompson import ThompsonSampling
    from tests.orchestrator.acquisition.proposer_contract import PartsSurrogate, random_parts

    parts = random_parts(2, m=30, seed=0)
    parts.outputscale = parts.outputscale * 1e-2  # same posterior mean, std / 10
    parts.u_covar = parts.u_covar * 1e-2
    model = PartsSurrogate(parts, family="asymmetric_laplace", tau=0.5, log_scale=math.log(1e-3))
    g = torch.Generator().manual_seed(5)
    cal = build_calibrator("online", spread_eta=0.5)
    for _ in range(40):
        x = torch.rand(1, 2, generator=g, dtype=torch.float64)
        fc = model.forecast(x)
        # the truth is 10x wider
        y = fc.mu_f + 10 * fc.var_f.sqrt() * torch.randn(1, generator=g, dtype=torch.float64)
        cal.update(fc, y, X=x)
    assert float(cal.spread(torch.zeros(1, 2, dtype=torch.float64))) > 5.0

    def batch(calibrated: bool) -> torch.Tensor:
        ts = ThompsonSampling(num_features=256, raw_samples=512, num_restarts=4, maxiter=50)
        if calibrated:
            attach(cal, ts)
        return ts.propose(model, 8, seed=11)

    def mean_pairwise(X: torch.Tensor) -> float:
        return float(torch.pdist(X).mean())

    plain, calibrated = batch(False), batch(True)
    print(f"mean pairwise distance: plain {mean_pairwise(plain):.3f}, calibrated "
          f"{mean_pairwise(calibrated):.3f}")
    assert not torch.allclose(plain, calibrated)
    assert mean_pairwise(calibrated) > 3 * mean_pairwise(plain)


def test_a_state_saved_with_other_options_is_refused():
    """`set_state` does not silently replace the options a calibrator was built with (alpha 0.05 -> 0.2,
    spread local -> global, eta 0.5 -> 0.1 with 23 levels): it names the options that differ, as a model
    checkpoint of other options is refused. The same options restore, learned state included."""
    from orchestrator.errors import QbatchError

    T = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    fc = Forecast("gaussian", 0.5, T([0.0]), T([0.0]), T([0.0]), 0.0)
    for name, saved, other, keys in (
        ("locbo", {"alpha": 0.2, "kappa": 3.0}, {"alpha": 0.05}, r"\['alpha', 'kappa'\]"),
        ("online", {"eta": 0.1}, {"eta": 0.5, "levels": [0.2, 0.8]}, r"\['levels', 'eta'\]"),
        ("online", {"spread": "local"}, {"spread": "global"}, r"spread factor: .*\['spread'\]"),
        ("online", {"spread_eta": 0.5}, {}, r"spread factor: .*\['spread_eta'\] \(spread_eta=0.5\)"),
        ("online", {"spread": "off"}, {}, r"saved without a spread factor"),
    ):
        cal = build_calibrator(name, **saved)
        cal.update(fc, T([1.5]), T([[0.3, 0.3]]))
        state = cal.get_state()
        with pytest.raises(QbatchError, match=keys):
            build_calibrator(name, **other).set_state(state)
        again = build_calibrator(name, **saved)
        again.set_state(state)
        assert again.num_updates == 1


def test_the_decay_rule_applies_to_the_local_term_only():
    """Global mode never reads spread_lambda_reg, so it does not refuse it."""
    build_calibrator("online", spread="global", spread_lambda_reg=20.0, spread_eta=0.1)
    with pytest.raises(ConfigError, match=r"spread_lambda_reg` x `calibrator.options.spread_eta` must be < "
                                          r"1"):
        build_calibrator("online", spread="local", spread_lambda_reg=20.0, spread_eta=0.1)
