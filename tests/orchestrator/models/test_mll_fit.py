"""A failed marginal-likelihood fit must not stop a run: the fallback chain of `orchestrator.models.mll_fit`.

BoTorch's `fit_gpytorch_mll` raised `ModelFittingError` on the noisy-Ackley benchmark (a warm start with one
ARD lengthscale collapsed to 1e-7), which aborted the whole benchmark. The failures are injected here (they
depend on BLAS rounding and do not reproduce from saved data), the models are real.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from botorch.exceptions.errors import ModelFittingError
from botorch.fit import fit_gpytorch_mll

from orchestrator.errors import ConfigError
from orchestrator.models import mll_fit
from orchestrator.models.exact_gp import ExactGP
from orchestrator.models.gpr_replicates import ReplicateQuantileGP

TK = {"dtype": torch.float64}


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(3)
    X = torch.rand(40, 2, generator=g, **TK)
    Y = torch.sin(6 * X[:, 0]) + X[:, 1] + 0.1 * torch.randn(40, generator=g, **TK)
    return X, Y


def failing(monkeypatch, fails):
    """Make the fits for which `fails(call_index, kwargs)` is true raise as BoTorch does after its retries."""
    calls = []

    def fit(mll, **kwargs):
        calls.append(kwargs)
        if fails(len(calls) - 1, kwargs):
            raise ModelFittingError("All attempts to fit the model have failed.")
        return fit_gpytorch_mll(mll, **kwargs)

    monkeypatch.setattr(mll_fit, "fit_gpytorch_mll", fit)
    return calls


def test_a_failed_warm_fit_restarts_cold(one_thread, data, monkeypatch):
    X, Y = data
    model = ExactGP()
    assert model.fit(X[:30], Y[:30])["fit_fallback"] == 1  # first fit: no warm start, so the cold step
    calls = failing(monkeypatch, lambda i, kw: i == 0)
    diag = model.fit(X, Y)
    assert diag["fit_fallback"] == 1 and len(calls) == 2 and set(calls[1]) == {"optimizer_kwargs"}
    ls = model.model.covar_module.lengthscale.detach()
    assert torch.isfinite(ls).all()
    mean, var = model.posterior_f(X[:5], full_cov=False)
    assert torch.isfinite(mean).all() and (var > 0).all()


def test_strict_failures_fall_back_to_accepting_optimizer_warnings(one_thread, data, monkeypatch):
    calls = failing(monkeypatch, lambda i, kw: "warning_handler" not in kw)
    diag = ExactGP().fit(*data)
    assert diag["fit_fallback"] == 2 and calls[-1]["max_attempts"] == 1
    assert mll_fit.FIT_STEPS[2] == "cold-lenient"


def test_when_every_fit_fails_the_default_hyperparameters_serve_with_a_warning(one_thread, data, monkeypatch):
    X, Y = data
    model = ExactGP()
    model.fit(X[:30], Y[:30])
    failing(monkeypatch, lambda i, kw: True)
    with pytest.warns(RuntimeWarning, match="exact-gp: every marginal-likelihood fit failed"):
        diag = model.fit(X, Y)
    assert diag["fit_fallback"] == 3
    fresh = ExactGP()._build(X, Y)
    assert torch.allclose(model.model.covar_module.lengthscale, fresh.covar_module.lengthscale)
    mean, var = model.posterior_f(X[:5], full_cov=False)
    assert torch.isfinite(mean).all() and (var > 0).all()
    # the next refit tries again (and here succeeds)
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert model.fit(X, Y)["fit_fallback"] == 0


def test_gpr_replicates_survives_a_failed_warm_fit(one_thread, data, monkeypatch):
    X, Y = data
    Xr = torch.cat([X[:10]] * 4)  # 10 settings x 4 replicates
    Yr = torch.cat([Y[:10] + 0.1 * k for k in range(4)])
    model = ReplicateQuantileGP(tau=0.25)
    model.fit(Xr, Yr)
    calls = failing(monkeypatch, lambda i, kw: i == 0)
    diag = model.fit(Xr, Yr)  # was an InputDataError that stopped the GPR-EI run
    assert diag["fit_fallback"] == 1 and len(calls) == 2
    mean, var = model.posterior_f(Xr[:3], full_cov=False)
    assert torch.isfinite(mean).all()


def test_iterations_are_counted_and_the_cap_holds(one_thread, data):
    """`fit_maxiter` caps each L-BFGS-B attempt, the capped fit is accepted (BoTorch's STOPPED status), and
    the diagnostics count the iterations the optimizer took."""
    X, Y = data
    free = ExactGP().fit(X, Y)
    assert free["fit_fallback"] == 1 and free["iterations"] > 3  # a cold fit of 40 points takes tens
    capped_model = ExactGP(fit_maxiter=3)
    capped = capped_model.fit(X, Y)
    assert capped["fit_fallback"] == 1 and capped["iterations"] == 3
    assert capped["loss"] > free["loss"]  # stopped before the optimum
    mean, var = capped_model.posterior_f(X[:5], full_cov=False)
    assert torch.isfinite(mean).all() and (var > 0).all()
    rep = ReplicateQuantileGP(tau=0.25, fit_maxiter=2).fit(torch.cat([X[:10]] * 4), torch.cat([Y[:10]] * 4))
    assert rep["iterations"] == 2 and rep["fit_fallback"] == 1


def test_iterations_of_failed_attempts_count_too(one_thread, data, monkeypatch):
    X, Y = data
    model = ExactGP(fit_maxiter=4)
    model.fit(X[:30], Y[:30])

    def fit(mll, **kwargs):  # a warm attempt that runs its iterations and then fails, as BoTorch's retries do
        fit_gpytorch_mll(mll, **kwargs)
        if "warning_handler" not in kwargs and len(seen) == 0:
            seen.append(1)
            raise ModelFittingError("All attempts to fit the model have failed.")
        return mll

    seen: list[int] = []
    monkeypatch.setattr(mll_fit, "fit_gpytorch_mll", fit)
    diag = model.fit(X, Y)
    assert diag["fit_fallback"] == 1 and diag["iterations"] == 8


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "100"])
def test_bad_fit_maxiter_is_refused_by_name(bad):
    for cls in (ExactGP, ReplicateQuantileGP):
        with pytest.raises(ConfigError, match="fit_maxiter"):
            cls(fit_maxiter=bad)
