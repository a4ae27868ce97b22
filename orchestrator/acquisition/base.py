"""The proposer interface: one class, one method, batch in the unit cube (STYLE.md §4.2).

A proposer turns a fitted `Surrogate` into `q` new points. The base class checks the shape (`q x d`)
and that every point is finite and inside `[0, 1]^d`; points should also be new (no repeat of a pending
point, an observed point, or another point of the batch: the built-in proposers see to it), and
`AskTellOptimizer.ask` replaces any repeat a proposer returns (a user's may).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from orchestrator.checks import check_int
from orchestrator.errors import InputDataError, UnsupportedError
from orchestrator.models.base import Surrogate

if TYPE_CHECKING:
    from orchestrator.protocols import CalibratorProtocol

__all__ = ["Proposer", "DUPLICATE_TOL", "check_target_is_f"]

#: two unit-cube points closer than this (max-norm) count as the same point
DUPLICATE_TOL = 1e-6


def check_target_is_f(model: Any, proposer: str) -> None:
    """Refuse `model` for a proposer that optimizes the latent f alone when f is not the run's target.

    The heteroscedastic model's f is the mean; its target, and so its recommendation, is the plug-in quantile
    mu_f + Phi^-1(tau) e^(mu_g) (spec §1.7), which has another argmax unless tau = 0.5. (An exact GP's plug-in
    differs from f by a constant; the quantile and expectile models' f is the target.)
    """
    if (isinstance(model, Surrogate) and model.family == "gaussian" and model.num_outputs_latent == 2
            and float(model.tau) != 0.5):
        raise UnsupportedError(
            f"{proposer} optimizes the model's f, which for {type(model).__name__} is the mean, while the "
            "run's target is its tau-quantile (the plug-in mu_f + Phi^-1(tau) exp(mu_g)): it would ignore "
            "tau. Use proposer 'thompson' (it samples that plug-in quantile) or tau 0.5 (the mean)")


class Proposer(ABC):
    """Proposes a batch of `q` points to evaluate next (`orchestrator.protocols.ProposerProtocol`).

    A model-free proposer (Sobol, random search) sets `requires_model = False`; it then receives
    `model=None` and the caller need not fit a model for it. The hooks below are set from outside: the
    calibrator's by `attach` (orchestrator/calibration/spread.py), `observed_y` and `snap` by the optimizer; a
    subclass that reads one sets its `uses_*` flag.
    """

    #: whether `propose` needs a fitted surrogate
    requires_model: bool = True
    #: whether a batch may repeat a point on purpose (the optimizer then leaves its repeats in place)
    allows_repeats: bool = False
    #: whether `_propose` reads `spread`, the calibrator's spread factor s(x) (`attach` sets it)
    uses_spread: bool = False
    #: whether `_propose` reads `calibrator` (`attach` sets it)
    uses_calibrator: bool = False
    #: whether `_propose` reads `observed_y` (the optimizer sets it before each proposal)
    uses_observed_y: bool = False
    #: s(x), `... x n x d` -> `... x n`, or None for s = 1
    spread: Callable[[Tensor], Tensor] | None = None
    calibrator: CalibratorProtocol | None = None
    #: the outcomes observed so far, in the units the model is fitted to (before its standardization)
    observed_y: Tensor | None = None
    #: rounding onto the search space's grid (`SearchSpace.snap`): the optimizer sets it when the space has
    #: int or choice parameters, and a proposer that searches on the grid compares its candidates where they
    #: will be evaluated
    snap: Callable[[Tensor], Tensor] | None = None

    @abstractmethod
    def _propose(
        self,
        model: Surrogate | None,
        q: int,
        X_pending: Tensor,
        X_observed: Tensor,
        generator: torch.Generator,
    ) -> Tensor:
        """Return `q x d` distinct points in `[0, 1]^d`, none within `DUPLICATE_TOL` of `X_pending` or
        `X_observed`."""

    def check_model(self, model: Surrogate) -> None:
        """Raise `UnsupportedError` (or `ConfigError`) when this proposer cannot use `model`.

        `model` may be unfitted: only what its class fixes (`family`, `num_outputs_latent`) is read, so a
        run checks its model-proposer-calibrator combination before it starts, not at its first model batch.
        The default accepts every model.
        """

    def propose(
        self,
        model: Surrogate | None,
        q: int,
        X_pending: Tensor | None = None,
        X_observed: Tensor | None = None,
        seed: int | None = None,
        dim: int | None = None,
    ) -> Tensor:
        """Propose `q` points.

        Args:
            model: a fitted surrogate (None for a proposer with `requires_model = False`).
            q: batch size, an integer >= 1.
            X_pending: `m x d` points proposed but not yet observed (m may be 0).
            X_observed: `n x d` points already observed.
            seed: makes the batch reproducible: the same seed gives the same batch.
            dim: number of dimensions `d`, needed only when `model` is None.

        Returns:
            `q x d` float64 tensor in the unit cube (cast here), on the device the proposer computed on.
        """
        q = check_int("q", q, 1, error=InputDataError)
        if model is not None:
            Z = model.sparse_parts("f").Z
            d, tk = Z.shape[-1], {"dtype": torch.float64, "device": Z.device}
        elif self.requires_model:
            raise InputDataError(f"{type(self).__name__} needs a fitted model; got None")
        elif dim is not None:
            d, tk = int(dim), {"dtype": torch.float64, "device": torch.device("cpu")}
        else:
            raise InputDataError(f"{type(self).__name__} needs `dim` when no model is given")
        X_pending = _points("X_pending", X_pending, d, tk)
        X_observed = _points("X_observed", X_observed, d, tk)
        gen = torch.Generator(device="cpu")
        gen.manual_seed(int(seed) if seed is not None else int(torch.randint(0, 2**62, (1,)).item()))
        X = self._propose(model, q, X_pending, X_observed, gen)
        if X.shape != (q, d):
            raise RuntimeError(f"{type(self).__name__} returned shape {tuple(X.shape)}; expected ({q}, {d})")
        if not torch.isfinite(X).all() or (X < 0).any() or (X > 1).any():
            raise RuntimeError(f"{type(self).__name__} returned points outside the unit cube")
        return X.to(torch.float64)  # a user's proposer may compute in float32

    def get_state(self) -> dict[str, Any]:
        return {}

    def set_state(self, state: dict[str, Any]) -> None:
        pass


def _points(name: str, X: Tensor | None, d: int, tk: dict[str, Any]) -> Tensor:
    """`X` as an `m x d` tensor of unit-cube points (none: `0 x d`). `InputDataError` naming `name` and the
    first
    bad row otherwise: reshaped, a `3 x 4` array for d = 2 would become six made-up points that steer
    de-duplication, Q-GIBBON's repulsion and the max-value grid."""
    if X is None or X.numel() == 0:
        return torch.empty(0, d, **tk)
    X = torch.as_tensor(X).to(**tk)
    if X.ndim != 2 or X.shape[-1] != d:
        raise InputDataError(f"{name} must be an `m x {d}` tensor of points; got shape {tuple(X.shape)}")
    bad = ~torch.isfinite(X).all(dim=-1) | ((X < 0) | (X > 1)).any(dim=-1)
    if bad.any():
        i = int(bad.nonzero()[0])
        raise InputDataError(f"row {i} of {name} is not a point of the unit cube: {X[i].tolist()}")
    return X


def min_distance(X: Tensor, others: Tensor, bound: float = math.inf) -> Tensor:
    """Max-norm distance from each row of `X` (`n x d`) to its nearest row of `others` (`m x d`); inf if
    m = 0.

    Small inputs are compared pairwise; larger ones through a k-d tree of `others`, in O(n + m) memory
    (pairwise, 1,000 candidates against 20,000 observed points in 16-D took 2.6 s and a 2.6 GB temporary).
    A distance above `bound` may come back as inf: a duplicate test passes its tolerance, and the tree
    search then stops early (0.005 s instead of 0.06 s there). No gradient: the callers test for
    duplicates."""
    n, m = X.shape[0], others.shape[0]
    if m == 0:
        return torch.full(X.shape[:1], math.inf, dtype=X.dtype, device=X.device)
    # a tree costs O(m log m) to build: worth it for many rows
    if n * m <= _PAIRWISE_MAX or n < _TREE_MIN_ROWS:
        rows = max(1, _PAIRWISE_MAX * 16 // (m * X.shape[-1]))  # a bounded temporary (~32 MB)
        return torch.cat([(X[i : i + rows].unsqueeze(-2) - others.unsqueeze(-3)).abs().amax(-1).amin(-1)
                          for i in range(0, n, rows)]).detach()
    from scipy.spatial import cKDTree

    dist, _ = cKDTree(others.detach().cpu().numpy()).query(
        X.detach().cpu().numpy(), k=1, p=math.inf, distance_upper_bound=bound)
    return torch.as_tensor(dist, dtype=X.dtype, device=X.device)


#: pairs compared directly by `min_distance`; above it, a k-d tree when there are `_TREE_MIN_ROWS` rows or
#: more
_PAIRWISE_MAX = 1 << 14
_TREE_MIN_ROWS = 64
