"""The typed seams between the ask/tell optimizer and its three components: surrogate, proposer, calibrator.

`AskTellOptimizer` (orchestrator/ask_tell/), the central actor (orchestrator/actor/) and `attach`
(orchestrator/calibration/spread.py) are written against these Protocols: a component needs what is listed
here and nothing else. Every built-in component subclasses its base class, which gives each member below its
default: `Surrogate` (orchestrator/models/base.py), `Proposer` (orchestrator/acquisition/base.py),
`Calibrator` (orchestrator/calibration/base.py). A capability that some components have and others lack is a
member that each of them declares (`ProposerProtocol.uses_spread`, `CalibratorProtocol.acquisition_only`,
...), not an attribute that is there or not; only the ELBO of the variational surrogates is a Protocol of its
own (`VariationalSurrogate`), since its method exists on those models alone.

The module imports no torch at run time: the annotations name `Tensor`, `Forecast` and `SparseLatentParts`
for type checkers only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from torch import Tensor

    from orchestrator.models.base import SparseLatentParts
    from orchestrator.models.predictive import Forecast

__all__ = ["CalibratorProtocol", "ProposerProtocol", "SurrogateProtocol", "VariationalSurrogate"]


@runtime_checkable
class SurrogateProtocol(Protocol):
    """A model of y over the unit cube with the latents f (target) and g (log noise scale), spec §1.

    Inputs are `n x d` float64 tensors in `[0, 1]^d`; `posterior_f`/`posterior_g`/`objective_mean` speak
    standardized units, `forecast` the units of the Y given to `fit` (see orchestrator/models/base.py).
    """

    #: likelihood family: "asymmetric_laplace", "asymmetric_gaussian" or "gaussian" (`models.base.FAMILIES`)
    family: str
    #: the quantile (or expectile) level the model targets
    tau: float

    @property
    def num_outputs_latent(self) -> int:
        """1 for an exact GP (g is a constant), 2 for the two-latent models."""

    @property
    def outcome_transform(self) -> tuple[float, float]:
        """(mean, std) used to standardize Y."""

    def fit(self, X: Tensor, Y: Tensor) -> dict[str, float]:
        """Fit to all data so far (`n x d`, `n`); returns diagnostics."""

    def posterior_f(self, X: Tensor, full_cov: bool = True) -> tuple[Tensor, Tensor]:
        """Mean `... x n` and covariance `... x n x n` (variance `... x n` without `full_cov`) of f."""

    def posterior_g(self, X: Tensor, full_cov: bool = False) -> tuple[Tensor, Tensor]:
        """Mean and variance of g, the log noise scale, at `... x n x d`."""

    def sparse_parts(self, latent: str = "f") -> SparseLatentParts:
        """Pathwise-sampling parts of latent "f" or "g"."""

    def objective_mean(self, X: Tensor) -> Tensor:
        """Posterior mean of the optimized target at `... x n x d`, standardized units."""

    def forecast(self, X: Tensor) -> Forecast:
        """Predictive distribution of y at `n x d` points, one marginal per point."""

    def get_state(self) -> dict[str, Any]:
        """Tensors and plain values only; `NotImplementedError` for a model without state (it refits cold)."""

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore from `get_state`."""


@runtime_checkable
class VariationalSurrogate(Protocol):
    """A surrogate fitted by maximizing an ELBO (the SVGPs): `AskTellOptimizer.fit(restart=True)` compares its
    warm and cold fits by the full-data bound, where the fit itself reports a minibatch average."""

    def elbo(self, X: Tensor, Y: Tensor) -> float:
        """Full-data ELBO per datum of the fitted model on raw data (`n x d`, `n`)."""


@runtime_checkable
class CalibratorProtocol(Protocol):
    """What the optimizer feeds one-step-ahead results and what the proposers read (calibrated-bo.md §1.5)."""

    #: config name (`calibrator.type`)
    name: str
    #: whether `update` needs the unit-cube point of each result
    needs_x: bool
    #: whether results without a recorded forecast (the initial design, user points) must reach `observe`
    needs_every_result: bool
    #: whether it acts only inside the acquisition of proposer 'calibrated' (`attach` refuses it elsewhere)
    acquisition_only: bool
    #: the calibrator's own options the config set, and its spread options (`attach` refuses unread ones)
    given_options: tuple[str, ...]
    given_spread_options: tuple[str, ...]
    #: the `SpreadTracker` behind `spread` (orchestrator/calibration/spread.py), or None for s(x) = 1
    spread_tracker: Any
    #: results learned from
    num_updates: int

    def update(
        self, forecast: Forecast, y: Tensor | float | Sequence[float], X: Tensor | None = None
    ) -> None:
        """Learn from completed results: the forecast recorded at proposal and the observed y."""

    def observe(self, y: Tensor | Sequence[float], X: Tensor) -> None:
        """Results that carry no forecast, for `needs_every_result` calibrators."""

    def map_levels(self, p: Tensor) -> Tensor:
        """Nominal levels -> levels R(p) of the base forecast to use."""

    def unmap_levels(self, u: Tensor) -> Tensor:
        """Inverse map R^{-1}: base PIT values -> calibrated PIT values."""

    def sigma_scale(self) -> float:
        """Global scale of the sigma-rescaling route (calibrated-bo.md §1.6 (a2))."""

    def spread(self, X: Tensor) -> Tensor:
        """Spread factor s(x) at `... x n x d` -> `... x n`."""

    def get_state(self) -> dict[str, Any]:
        """Plain values and tensors only."""

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore from `get_state`."""


@runtime_checkable
class ProposerProtocol(Protocol):
    """Turns a fitted surrogate into `q` new points of the unit cube (STYLE.md §4.2).

    The hooks (`spread`, `calibrator`, `observed_y`, `snap`) are set by the optimizer and `attach`; a proposer
    reads those its `uses_*` flags name (`snap` is set on every proposer of a space with a grid, and read by
    those that search on it).
    """

    #: whether `propose` needs a fitted surrogate (Sobol and random search do not)
    requires_model: bool
    #: whether the batch may repeat a point on purpose (GPR-EI's replicates): the optimizer then keeps repeats
    allows_repeats: bool
    #: whether it reads `spread`, the calibrator's spread factor s(x) (Thompson sampling, Q-GIBBON)
    uses_spread: bool
    #: whether it reads `calibrator` inside its acquisition (proposer 'calibrated')
    uses_calibrator: bool
    #: whether it reads `observed_y`, the outcomes observed so far (LOCBO's incumbent)
    uses_observed_y: bool
    spread: Callable[[Tensor], Tensor] | None
    calibrator: CalibratorProtocol | None
    #: the observed outcomes in the model's units (before its standardization), set before each proposal
    observed_y: Tensor | None
    #: rounding onto the search space's grid (`SearchSpace.snap`) for int and choice parameters
    snap: Callable[[Tensor], Tensor] | None

    def propose(
        self,
        model: SurrogateProtocol | None,
        q: int,
        X_pending: Tensor | None = None,
        X_observed: Tensor | None = None,
        seed: int | None = None,
        dim: int | None = None,
    ) -> Tensor:
        """`q x d` float64 points in the unit cube."""

    def check_model(self, model: SurrogateProtocol) -> None:
        """Raise `UnsupportedError` (or `ConfigError`) when this proposer cannot use `model` (maybe
        unfitted)."""

    def get_state(self) -> dict[str, Any]:
        """Plain values only."""

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore from `get_state`."""
