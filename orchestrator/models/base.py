"""The surrogate interface every proposer and calibrator is written against.

A `Surrogate` models the outcome y over the unit cube with up to two latent GPs: f (the quantile,
expectile, or mean) and g (the log-scale of the noise), as in quantile-expectile-bo.md §1.
Inputs `X` are `n x d` float64 tensors in `[0, 1]^d`; outcomes `Y` are raw values to **maximize**
(the sign flip for `direction: minimize` happens at the ask/tell edge). Internally the model
standardizes Y; `posterior_f`/`posterior_g` speak standardized units, `forecast` speaks the
original units of Y.
"""

from __future__ import annotations

import contextlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from orchestrator.models.predictive import Forecast

__all__ = ["FAMILIES", "SparseLatentParts", "Surrogate", "check_training_data", "TKWARGS", "fit_stop",
           "check_fit_stop", "model_device", "on_cpu", "use_device"]

class _TensorKwargs(MutableMapping):
    """`{"dtype": float64, "device": ...}`, spread as `**TKWARGS`: the device is the process's model device
    (`use_device`) unless the calling thread holds `on_cpu`."""

    _local = threading.local()

    def __init__(self, **items: Any) -> None:
        self._items = dict(items)

    def __getitem__(self, key: str) -> Any:
        if key == "device" and getattr(self._local, "cpu", 0):
            return _CPU
        return self._items[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._items[key] = value

    def __delitem__(self, key: str) -> None:
        raise TypeError("TKWARGS keeps its dtype and device")

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return repr(dict(self))


_CPU = torch.device("cpu")
#: dtype and device of the GP algebra (STYLE.md §4.7: float64 through one `tkwargs`)
TKWARGS: MutableMapping[str, Any] = _TensorKwargs(dtype=torch.float64, device=_CPU)


def use_device(device: torch.device) -> None:
    """Make `device` the model stack's device in this process (`orchestrator.device.resolve_device` names
    it)."""
    TKWARGS["device"] = device


def model_device() -> torch.device:
    """The model stack's device in this process."""
    return TKWARGS["device"]


@contextlib.contextmanager
def on_cpu() -> Iterator[None]:
    """While the block runs, `TKWARGS` gives the CPU in this thread (other threads keep the model device): the
    fits that compute with NumPy and LAPACK (`full_variational`) build their tensors there."""
    local = _TensorKwargs._local
    local.cpu = getattr(local, "cpu", 0) + 1
    try:
        yield
    finally:
        local.cpu -= 1

#: likelihood families: quantile (AL), expectile (AG), and Gaussian (HetGP: y ~ N(f, e^{2g}); exact GP: g
#: constant)
FAMILIES = ("asymmetric_laplace", "asymmetric_gaussian", "gaussian")


_FIT_STOP = threading.local()


@contextlib.contextmanager
def fit_stop(event: threading.Event | None) -> Iterator[None]:
    """Fits run in this thread while the block runs stop, raising `FitInterrupted`, once `event` is set (None:
    they run to their end). A model's training loop asks `check_fit_stop` between its steps."""
    before = getattr(_FIT_STOP, "event", None)
    _FIT_STOP.event = event
    try:
        yield
    finally:
        _FIT_STOP.event = before


def check_fit_stop() -> None:
    """Raise `FitInterrupted` if this thread's fit was asked to stop (`fit_stop`)."""
    event = getattr(_FIT_STOP, "event", None)
    if event is not None and event.is_set():
        from orchestrator.errors import FitInterrupted

        raise FitInterrupted("the model fit was stopped before its end; the model in use is kept")


@dataclass
class SparseLatentParts:
    """Everything a pathwise (Matheron) sampler needs about one latent GP (spec §2).

    Prior: latent(x) = `constant_mean` + h(x), h ~ GP(0, k), k = `outputscale` * Matern-5/2 with ARD
    `lengthscale`. Posterior: the inducing values u = h(`Z`) have q(u) = N(`u_mean`, `u_covar`)
    (unwhitened), and h(x) | u follows the prior conditional p(h | u). An exact GP fits this form
    with Z = training inputs and q(u) = the exact posterior of h there.

    Attributes (standardized units, `m` inducing points, `d` dims):
        constant_mean: scalar tensor
        lengthscale: `d` tensor
        outputscale: scalar tensor
        Z: `m x d`
        u_mean: `m`
        u_covar: `m x m`
        nu: Matern smoothness (2.5)
        jitter: the K_ZZ of the formulas is k(Z, Z) + `jitter` * I (the SVGPs add a small jitter to their
            prior covariance at Z; with it the formulas reproduce `posterior_f`/`posterior_g` exactly)
    """

    constant_mean: Tensor
    lengthscale: Tensor
    outputscale: Tensor
    Z: Tensor
    u_mean: Tensor
    u_covar: Tensor
    nu: float = 2.5
    jitter: float = 0.0


def check_training_data(X: Tensor, Y: Tensor) -> None:
    """Raise `InputDataError` naming the first bad row: shapes, NaN/inf, or inputs outside [0, 1]^d."""
    from orchestrator.errors import InputDataError

    if X.ndim != 2:
        raise InputDataError(f"X must be an `n x d` tensor; got shape {tuple(X.shape)}")
    if Y.ndim != 1 or Y.shape[0] != X.shape[0]:
        raise InputDataError(f"Y must be an `n` tensor with n = {X.shape[0]}; got shape {tuple(Y.shape)}")
    bad_x = ~torch.isfinite(X).all(dim=-1)
    if bad_x.any():
        i = int(bad_x.nonzero()[0])
        raise InputDataError(f"row {i} of X is not finite: {X[i].tolist()}")
    bad_y = ~torch.isfinite(Y)
    if bad_y.any():
        i = int(bad_y.nonzero()[0])
        raise InputDataError(f"row {i} of Y is not finite: {Y[i].item()}")
    out = ((X < 0) | (X > 1)).any(dim=-1)
    if out.any():
        i = int(out.nonzero()[0])
        raise InputDataError(f"row {i} of X is outside the unit cube: {X[i].tolist()}")


class Surrogate(ABC):
    """A two-latent (or one-latent) GP model of y over the unit cube.

    Subclasses: `QuantileSVGP` (family asymmetric_laplace), `ExpectileSVGP` (asymmetric_gaussian),
    `HeteroscedasticSVGP` (gaussian, both latents), `ExactGP` (gaussian, g constant).
    """

    #: one of FAMILIES
    family: str
    #: the level whose quantile (or expectile) is optimized; for gaussian families the plug-in quantile level
    tau: float

    @abstractmethod
    def fit(self, X: Tensor, Y: Tensor) -> dict[str, float]:
        """Fit to all data so far (`n x d`, `n`), warm-starting from the previous fit when there is one.

        Returns diagnostics such as {"iterations": ..., "loss": ..., "seconds": ...}.
        Raises `InputDataError` (naming the row) for NaN/inf or out-of-cube data.
        """

    def recommender(self, X: Tensor, Y: Tensor) -> Surrogate:
        """The fitted model whose posterior mean picks the recommendation among the observed inputs `X` (with
        outcomes `Y`, the data of the last fit) after a final fit: this model, unless a subclass fits another
        for it (`TwoLatentSVGPSurrogate.recommender`)."""
        return self

    @property
    @abstractmethod
    def num_outputs_latent(self) -> int:
        """1 for an exact GP (g is a constant), 2 for the two-latent models."""

    @abstractmethod
    def posterior_f(self, X: Tensor, full_cov: bool = True) -> tuple[Tensor, Tensor]:
        """Posterior of f at `... x n x d`, standardized units: mean `... x n` and
        covariance `... x n x n` (or variance `... x n` when `full_cov` is False)."""

    @abstractmethod
    def posterior_g(self, X: Tensor, full_cov: bool = False) -> tuple[Tensor, Tensor]:
        """Posterior of g = log noise scale at `... x n x d`, standardized units (zero variance for an exact
        GP)."""

    @abstractmethod
    def sparse_parts(self, latent: str = "f") -> SparseLatentParts:
        """Pathwise-sampling parts of latent "f" or "g" (see `SparseLatentParts`)."""

    @property
    @abstractmethod
    def outcome_transform(self) -> tuple[float, float]:
        """(mean, std) used to standardize Y: Y_std = (Y - mean) / std."""

    def objective_mean(self, X: Tensor) -> Tensor:
        """Posterior mean of the optimized target at `... x n x d` in standardized units: f itself for the
        quantile/expectile families, the plug-in quantile mu_f + Phi^-1(tau) exp(mu_g) for gaussian ones (spec
        §1.7)."""
        mu_f, _ = self.posterior_f(X, full_cov=False)
        if self.family != "gaussian":
            return mu_f
        mu_g, _ = self.posterior_g(X, full_cov=False)
        z = torch.special.ndtri(torch.tensor(self.tau, dtype=mu_f.dtype, device=mu_f.device))
        return mu_f + z * mu_g.exp()

    def forecast(self, X: Tensor) -> Forecast:
        """Predictive distribution of y (original units) at `n x d` points, one independent marginal per
        point."""
        from orchestrator.models.predictive import Forecast

        mu_f, var_f = self.posterior_f(X, full_cov=False)
        mu_g, var_g = self.posterior_g(X, full_cov=False)
        loc, scale = self.outcome_transform
        return Forecast(
            family=self.family,
            tau=float(self.tau),
            mu_f=loc + scale * mu_f.detach(),
            var_f=scale**2 * var_f.detach(),
            mu_g=mu_g.detach() + torch.log(torch.as_tensor(scale, dtype=mu_g.dtype)),
            var_g=var_g.detach(),
        )

    def predict_quantiles(self, X: Tensor, levels: Tensor | list[float]) -> Tensor:
        """Predictive quantiles of y (original units): `n x k` for `k` levels in (0, 1)."""
        return self.forecast(X).quantile(levels)

    def get_state(self) -> dict[str, Any]:
        """Tensors and plain values only (checkpoints load with `torch.load(weights_only=True)`)."""
        raise NotImplementedError

    def set_state(self, state: dict[str, Any]) -> None:
        raise NotImplementedError
