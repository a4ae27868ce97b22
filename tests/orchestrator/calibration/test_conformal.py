"""Full conformal Bayes sets of paper 004 (conformal-bo.md): closed-form conditioning equals BoTorch's,
exchangeable coverage >= 1 - alpha for a misspecified GP whose credible intervals fall short, mixture weights,
density-ratio start at 1, schedule and state."""

from __future__ import annotations

import math

import pytest
import torch

from orchestrator.calibration import build_calibrator
from orchestrator.calibration.conformal import (
    DensityRatioEstimator,
    ExactGPParts,
    candidate_labels,
    conformal_interval,
    conformal_masks,
    conformal_weights,
)
from orchestrator.errors import ConfigError, UnsupportedError


def _gp(X: torch.Tensor, y: torch.Tensor, lengthscale: float, noise: float):
    from botorch.models import SingleTaskGP
    from gpytorch.kernels import MaternKernel, ScaleKernel

    gp = SingleTaskGP(
        X, y.unsqueeze(-1), covar_module=ScaleKernel(MaternKernel(nu=2.5)), outcome_transform=None
    )
    gp.covar_module.base_kernel.lengthscale = lengthscale
    gp.covar_module.outputscale = 1.0
    gp.likelihood.noise = noise
    gp.eval()
    return gp


def test_conditioning_matches_botorch() -> None:
    g = torch.Generator().manual_seed(0)
    X = torch.rand(8, 2, generator=g, dtype=torch.float64)
    y = torch.randn(8, generator=g, dtype=torch.float64)
    gp = _gp(X, y, 0.3, 0.05)
    parts = ExactGPParts.from_model(gp)
    x = torch.rand(3, 2, generator=g, dtype=torch.float64)
    yh = torch.tensor([0.3, -1.0, 2.0], dtype=torch.float64)
    base, slope, v, (mu, var_f) = parts.augmented(x)
    assert v.shape == (3, 9)  # the n + 1 residual variances per query
    with torch.no_grad():
        post = gp.posterior(x.unsqueeze(-2))
        torch.testing.assert_close(mu, post.mean.reshape(-1))
        torch.testing.assert_close(var_f, post.variance.reshape(-1))
        for i in range(3):
            cond = gp.condition_on_observations(x[i : i + 1], yh[i : i + 1].reshape(1, 1))
            Xa = torch.cat([X, x[i : i + 1]])
            pa = cond.posterior(Xa)
            ya = torch.cat([y, yh[i : i + 1]])
            resid = base[i] + slope[i] * (yh[i] - parts.mean)
            torch.testing.assert_close(resid, ya - pa.mean.reshape(-1))
            torch.testing.assert_close(v[i], pa.variance.reshape(-1) + 0.05)


def test_exchangeable_coverage_beats_misspecified_credible_interval() -> None:
    """IID data, GP with noise 10x too small: the 1 - alpha credible interval under-covers, the conformal set
    covers >= 1 - alpha (marginally, up to Monte-Carlo error) (checklist item 2)."""
    g = torch.Generator().manual_seed(1)
    alpha, reps, n = 0.2, 60, 12
    conf_hits, cred_hits = 0, 0
    for _ in range(reps):
        X = torch.rand(n + 1, 1, generator=g, dtype=torch.float64)
        y = torch.sin(6 * X[:, 0]) + 0.3 * torch.randn(n + 1, generator=g, dtype=torch.float64)
        gp = _gp(X[:n], y[:n], 0.2, 0.009)
        parts = ExactGPParts.from_model(gp)
        lo, hi = conformal_interval(parts, X[n:], alpha, k=200)
        conf_hits += int(lo.item() <= y[n].item() <= hi.item())
        _, _, _, (mu, var_f) = parts.augmented(X[n:])
        z = 1.2816 * math.sqrt(var_f.item() + 0.009)
        cred_hits += int(abs(y[n].item() - mu.item()) <= z)
    conf, cred = conf_hits / reps, cred_hits / reps
    print(f"conformal coverage {conf:.3f}, credible coverage {cred:.3f}")
    assert cred < 0.65
    assert conf >= 1 - alpha - 0.08  # Monte-Carlo error of 60 repeats: sd ~0.05


def test_masks_and_weights() -> None:
    g = torch.Generator().manual_seed(2)
    X = torch.rand(10, 1, generator=g, dtype=torch.float64)
    y = torch.randn(10, generator=g, dtype=torch.float64)
    parts = ExactGPParts.from_model(_gp(X, y, 0.3, 0.1))
    x = torch.rand(4, 1, generator=g, dtype=torch.float64)
    _, _, _, (mu, var_f) = parts.augmented(x)
    labels, logp = candidate_labels(mu, var_f + parts.noise_var, 64)
    w = torch.full((4, 11), 1 / 11, dtype=torch.float64)
    hard = conformal_masks(parts, x, labels, w, 0.2, None)
    soft = conformal_masks(parts, x, labels, w, 0.2, 1e-6)
    assert ((soft > 0.5) == (hard > 0.5)).float().mean() > 0.97  # tau -> 0 matches the hard masks
    assert hard[:, 32].all()  # the centre is accepted
    far = mu.unsqueeze(-1) + (var_f + parts.noise_var).sqrt().unsqueeze(-1) * torch.tensor(
        [-30.0, 0.0, 30.0], dtype=torch.float64
    )
    torch.testing.assert_close(
        conformal_masks(parts, x, far, w, 0.2, None), torch.tensor([[0.0, 1.0, 0.0]] * 4, dtype=torch.float64)
    )
    assert not conformal_masks(parts, x, labels, w, 1.0, None).any()  # alpha = 1: empty set
    # wide enough to reach outside the set
    labels, logp = candidate_labels(mu, 4 * (var_f + parts.noise_var), 64)
    hard = conformal_masks(parts, x, labels, w, 0.2, None)
    assert (hard.sum(-1) < 64).all() and (hard.sum(-1) > 0).all()
    om = conformal_weights(hard, logp, 0.2)
    torch.testing.assert_close(om.sum(-1), torch.ones(4, dtype=torch.float64))
    inside = (om * hard).sum(-1)
    torch.testing.assert_close(inside, torch.full((4,), 0.8, dtype=torch.float64))
    all_in = conformal_weights(torch.ones_like(hard), logp, 0.2)
    torch.testing.assert_close(all_in.sum(-1), torch.ones(4, dtype=torch.float64))
    # inside the set, weights are flat in the label (uniform on C_alpha)
    row = om[0][hard[0] > 0.5]
    dy = torch.diff(labels[0][hard[0] > 0.5])
    assert torch.allclose(row / torch.cat([dy, dy[-1:]]), (row / torch.cat([dy, dy[-1:]]))[0], rtol=0.2)


def test_density_ratio_starts_at_one_and_learns() -> None:
    g = torch.Generator().manual_seed(3)
    est = DensityRatioEstimator(2)
    Xt = 0.5 * torch.rand(40, 2, generator=g, dtype=torch.float64)
    assert torch.allclose(est(Xt), torch.ones(40, dtype=torch.float64))
    Xq = 0.5 + 0.5 * torch.rand(40, 2, generator=g, dtype=torch.float64)
    est.fit(Xt, Xq, steps=60, lr=3e-2)
    assert est(Xq).mean() > 3 * est(Xt).mean()


def test_density_ratio_is_reproducible_and_leaves_the_global_generator_alone() -> None:
    """Its initialization comes from its seed, not the global generator (conformal EI runs differed between
    processes with the same seed before), and building or fitting it does not reseed the caller."""
    g = torch.Generator().manual_seed(4)
    Xt = torch.rand(30, 3, generator=g, dtype=torch.float64)
    Xq = torch.rand(30, 3, generator=g, dtype=torch.float64) ** 2

    def fitted(seed: int) -> torch.Tensor:
        est = DensityRatioEstimator(3, seed=seed)
        est.fit(Xt, Xq, steps=20, lr=1e-2)
        return est(Xq).detach()

    torch.manual_seed(123)
    a = fitted(7)
    after = torch.rand(3)
    torch.manual_seed(999)  # a different global state must not matter
    b = fitted(7)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.allclose(a, fitted(8))
    torch.manual_seed(123)
    torch.testing.assert_close(torch.rand(3), after)  # the caller's stream went on as if nothing happened


def test_calibrator_schedule_and_state(tmp_path) -> None:
    cal = build_calibrator("conformal")
    assert cal.alpha(27) == pytest.approx(1 / math.sqrt(27))
    assert cal.alpha(10_000) == pytest.approx(0.05)
    assert build_calibrator("conformal", alpha=0.3).alpha(100) == 0.3
    torch.save(cal.get_state(), tmp_path / "c.pt")
    from orchestrator.errors import QbatchError

    # the state no longer overrides them
    with pytest.raises(QbatchError, match=r"other options \['alpha_fixed'\]"):
        build_calibrator("conformal", alpha=0.3).set_state(torch.load(tmp_path / "c.pt", weights_only=True))
    fresh = build_calibrator("conformal")
    fresh.set_state(torch.load(tmp_path / "c.pt", weights_only=True))
    assert fresh.alpha(27) == pytest.approx(1 / math.sqrt(27))
    with pytest.raises(ConfigError, match="calibrator.options.alpha"):
        build_calibrator("conformal", alpha=0.0)
    with pytest.raises(ConfigError, match="calibrator.options.num_labels"):
        build_calibrator("conformal", num_labels=0)


def test_a_botorch_gp_with_an_outcome_transform_is_refused():
    """Its posterior is in the data's units, its training targets in standardized ones: conformal scores
    mixing them would be wrong by the transform's scale. It must be built without a transform."""
    from botorch.models import SingleTaskGP

    X = torch.rand(8, 1, dtype=torch.float64)
    gp = SingleTaskGP(X, 100 + 50 * torch.sin(6 * X))
    with pytest.raises(UnsupportedError, match="outcome_transform=None"):
        ExactGPParts.from_model(gp)


def test_interval_is_unbounded_where_the_set_reaches_the_label_grids_end() -> None:
    """With an over-confident GP (noise 0.01 against a true 0.64) the mask accepts labels past the mu -+ 6 sd
    grid: an accepted grid end gives an infinite end, so every accepted label lies inside (an interval cut at
    the grid misses 82 accepted true labels of 400, covering 0.615 < 1 - alpha)."""
    from orchestrator.calibration.conformal import _matern52, conformal_masks

    g = torch.Generator().manual_seed(0)
    ls, os_ = torch.tensor([0.3], dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)
    n, alpha, outside, accepted = 15, 0.2, 0, 0
    for _ in range(60):
        X = torch.rand(n + 1, 1, generator=g, dtype=torch.float64)
        y = torch.sin(8 * X[:, 0]) * 1.5 + 0.8 * torch.randn(n + 1, generator=g, dtype=torch.float64)
        parts = ExactGPParts(X[:n], y[:n], 0.0, lambda A, B: _matern52(A, B, ls, os_), 0.01)
        lo, hi = conformal_interval(parts, X[n:], alpha, k=128)
        w = torch.full((1, n + 1), 1.0 / (n + 1), dtype=torch.float64)
        if conformal_masks(parts, X[n:], y[n:].reshape(1, 1), w, alpha, None)[0, 0] > 0.5:
            accepted += 1
            outside += int(not (float(lo) <= float(y[n]) <= float(hi)))
    assert accepted >= 40 and outside == 0
