"""Reusable contract tests every proposer must pass (STYLE.md §4.12), plus a fixed sparse-GP surrogate.

Usage, in a proposer's test module::

    from tests.orchestrator.acquisition.proposer_contract import ProposerContract

    class TestMyProposerContract(ProposerContract):
        def make_proposer(self) -> Proposer:
            return MyProposer(cheap_options...)

        # optional: def make_model(self, d: int) -> Surrogate  (default: `PartsSurrogate.random(d)`)
        # optional: class attributes `dims`, `q_values`, `n_observed`

pytest collects the `test_contract_*` methods on the subclass (the mixin itself has no `Test` prefix,
so it is never collected alone). Checked: `q x d` output, inside `[0, 1]^d`, dtype of the model kept
(also when pending points arrive as float32), pending and observed points never repeated — even when
they are exactly the points the proposer would otherwise pick — no duplicates within a batch,
same seed -> same batch, and a bad q raises an `InputDataError` naming the value.

`PartsSurrogate` is a `Surrogate` whose posterior is a given `SparseLatentParts` per latent, with
`posterior_f`/`posterior_g` computed from the formulas of quantile-expectile-bo.md §1.4
(μ = c + A a, Σ = k(x, x') − A (K_ZZ − S) A'ᵀ, A = k(x, Z) K_ZZ⁻¹) by dense solves.
"""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch
from gpytorch.kernels import MaternKernel, ScaleKernel
from torch import Tensor

from orchestrator.acquisition.base import DUPLICATE_TOL, Proposer, min_distance
from orchestrator.errors import InputDataError, UnsupportedError
from orchestrator.models.base import SparseLatentParts, Surrogate

__all__ = ["ProposerContract", "ProposerTestCase", "PartsSurrogate", "random_parts", "parts_kernel"]

TK = {"dtype": torch.float64}


def parts_kernel(parts: SparseLatentParts) -> ScaleKernel:
    """GPyTorch `ScaleKernel(MaternKernel)` with the hyperparameters of `parts` (no gradients)."""
    k = ScaleKernel(MaternKernel(nu=parts.nu, ard_num_dims=parts.Z.shape[-1])).to(dtype=parts.Z.dtype)
    k.base_kernel.lengthscale = parts.lengthscale.reshape(1, -1)
    k.outputscale = parts.outputscale
    k.requires_grad_(False)
    return k


def random_parts(
    d: int,
    m: int = 16,
    seed: int = 0,
    mean: float = 0.0,
    lengthscale: float | Tensor = 0.3,
    outputscale: float = 1.0,
    noise: float = 0.05,
    Z: Tensor | None = None,
    nu: float = 2.5,
) -> SparseLatentParts:
    """A posterior-like q(u): the exact GP posterior of h at Z given noisy observations h(Z) + N(0, `noise`).

    u_mean is that posterior's mean for one prior draw of the observations; u_covar = K - K (K + noise I)^-1
    K.
    """
    g = torch.Generator().manual_seed(seed)
    Z = torch.rand(m, d, generator=g, **TK) if Z is None else Z.to(**TK)
    m = Z.shape[0]
    ls = torch.as_tensor(lengthscale, **TK).expand(d).clone()
    parts = SparseLatentParts(
        constant_mean=torch.tensor(float(mean), **TK),
        lengthscale=ls,
        outputscale=torch.tensor(float(outputscale), **TK),
        Z=Z,
        u_mean=torch.zeros(m, **TK),
        u_covar=torch.eye(m, **TK),
        nu=nu,
        jitter=1e-8,
    )
    with torch.no_grad():
        K = parts_kernel(parts)(Z, Z).to_dense() + parts.jitter * torch.eye(m, **TK)
        y = torch.linalg.cholesky(K + noise * torch.eye(m, **TK)) @ torch.randn(m, generator=g, **TK)
        G = torch.linalg.solve(K + noise * torch.eye(m, **TK), K)
        parts.u_mean = G.mT @ y
        S = K - K @ G
        parts.u_covar = 0.5 * (S + S.mT)
    return parts


class PartsSurrogate(Surrogate):
    """A fixed (already "fitted") surrogate whose latents are given `SparseLatentParts`.

    Args:
        parts_f: the f latent.
        parts_g: the g latent (None: g is the constant `log_scale`, as for an exact GP).
        family: one of `FAMILIES`.
        tau: the optimized level.
        log_scale: the constant g when `parts_g` is None.
    """

    def __init__(
        self,
        parts_f: SparseLatentParts,
        parts_g: SparseLatentParts | None = None,
        family: str = "asymmetric_laplace",
        tau: float = 0.5,
        log_scale: float = math.log(0.1),
    ) -> None:
        self.family, self.tau = family, tau
        self._parts = {"f": parts_f, "g": parts_g}
        self._log_scale = log_scale

    @classmethod
    def random(cls, d: int, m: int = 16, seed: int = 0, **kwargs: Any) -> PartsSurrogate:
        """A one-latent-f surrogate from `random_parts(d, m, seed)`; kwargs go to the constructor."""
        return cls(random_parts(d, m, seed), **kwargs)

    def fit(self, X: Tensor, Y: Tensor) -> dict[str, float]:
        raise UnsupportedError("PartsSurrogate is a fixed posterior built from SparseLatentParts; it is not "
                               "fitted")

    @property
    def num_outputs_latent(self) -> int:
        return 1 if self._parts["g"] is None else 2

    @staticmethod
    def _posterior(parts: SparseLatentParts, X: Tensor, full_cov: bool) -> tuple[Tensor, Tensor]:
        k = parts_kernel(parts)
        m = parts.Z.shape[0]
        K = k(parts.Z, parts.Z).to_dense() + parts.jitter * torch.eye(m, dtype=X.dtype)
        Kxz = k(X, parts.Z).to_dense()
        A = torch.linalg.solve(K, Kxz.mT).mT  # `... x n x m`
        mean = parts.constant_mean + A @ parts.u_mean
        cov = k(X, X).to_dense() - A @ (K - parts.u_covar) @ A.mT
        return mean, (cov if full_cov else cov.diagonal(dim1=-2, dim2=-1).clamp_min(0.0))

    def posterior_f(self, X: Tensor, full_cov: bool = True) -> tuple[Tensor, Tensor]:
        return self._posterior(self._parts["f"], X, full_cov)

    def posterior_g(self, X: Tensor, full_cov: bool = False) -> tuple[Tensor, Tensor]:
        if self._parts["g"] is not None:
            return self._posterior(self._parts["g"], X, full_cov)
        mean = torch.full(X.shape[:-1], self._log_scale, dtype=X.dtype)
        n = X.shape[-2]
        return mean, (torch.zeros(*X.shape[:-2], n, n, dtype=X.dtype) if full_cov else torch.zeros_like(mean))

    def sparse_parts(self, latent: str = "f") -> SparseLatentParts:
        parts = self._parts.get(latent)
        if parts is None:
            raise UnsupportedError(f"latent {latent!r} has no sparse parts in this surrogate")
        return parts

    @property
    def outcome_transform(self) -> tuple[float, float]:
        return (0.0, 1.0)


class ProposerContract:
    """Mixin of contract tests; subclass it as `Test...` and implement `make_proposer` (see module
    docstring)."""

    #: dimensions to try
    dims: tuple[int, ...] = (2, 5)
    #: batch sizes to try
    q_values: tuple[int, ...] = (1, 6)
    #: observed points handed to the proposer
    n_observed: int = 10

    def make_proposer(self) -> Proposer:  # pragma: no cover - must be overridden
        raise NotImplementedError("a ProposerContract subclass must implement make_proposer()")

    def make_model(self, d: int) -> Surrogate:
        """The surrogate the contract runs against (override for a real fitted model)."""
        return PartsSurrogate.random(d, m=12, seed=d)

    def _observed(self, d: int) -> Tensor:
        return torch.rand(self.n_observed, d, generator=torch.Generator().manual_seed(99), **TK)

    @staticmethod
    def _model_dtype(model: Surrogate) -> torch.dtype:
        return model.sparse_parts("f").Z.dtype

    def test_contract_shape_bounds_dtype_distinct(self) -> None:
        for d in self.dims:
            model = self.make_model(d)
            for q in self.q_values:
                X_obs = self._observed(d)
                X = self.make_proposer().propose(model, q, X_observed=X_obs, seed=1)
                assert X.shape == (q, d), f"d={d}, q={q}: shape {tuple(X.shape)}"
                assert X.dtype == self._model_dtype(model)
                assert torch.isfinite(X).all() and (X >= 0).all() and (X <= 1).all()
                if q > 1:
                    dist = (X.unsqueeze(-2) - X.unsqueeze(-3)).abs().amax(-1)
                    dist.fill_diagonal_(float("inf"))
                    assert dist.min() >= DUPLICATE_TOL, f"d={d}, q={q}: duplicate points in the batch"
                assert (min_distance(X, X_obs) >= DUPLICATE_TOL).all()

    def test_contract_same_seed_same_batch(self) -> None:
        d, q = self.dims[0], max(self.q_values)
        model = self.make_model(d)
        A = self.make_proposer().propose(model, q, X_observed=self._observed(d), seed=7)
        B = self.make_proposer().propose(model, q, X_observed=self._observed(d), seed=7)
        C = self.make_proposer().propose(model, q, X_observed=self._observed(d), seed=8)
        assert torch.equal(A, B), "the same seed gave different batches"
        assert not torch.equal(A, C), "different seeds gave the same batch"

    def test_contract_pending_and_observed_never_repeated(self) -> None:
        """Hand back the exact batch the proposer makes for a seed as pending / observed points: with the
        same seed the proposer must move every point away from them (it cannot just drop them)."""
        d, q = self.dims[0], max(self.q_values)
        model = self.make_model(d)
        base = self.make_proposer().propose(model, q, seed=3)
        for role in ("X_pending", "X_observed"):
            X = self.make_proposer().propose(model, q, seed=3, **{role: base})
            assert X.shape == (q, d)
            assert (min_distance(X, base) >= DUPLICATE_TOL).all(), f"{role} repeated"
        # both at once, pending handed over as float32: the output keeps the model's dtype
        X = self.make_proposer().propose(
            model, q, X_pending=base[: q // 2 + 1].float(), X_observed=base, seed=3
        )
        assert X.dtype == self._model_dtype(model)
        assert (min_distance(X, base) >= DUPLICATE_TOL).all()

    @pytest.mark.parametrize("bad_q", [0, -3, 2.5, True, "4"])
    def test_contract_bad_q_raises_naming_value(self, bad_q: Any) -> None:
        model = self.make_model(self.dims[0])
        with pytest.raises(InputDataError, match=re.escape(f"q must be an integer >= 1; got {bad_q!r}")):
            self.make_proposer().propose(model, bad_q)

    def test_contract_bad_pending_or_observed_points_raise_naming_them(self) -> None:
        """A `3 x 4` X_pending for d = 2 is refused, not read as six made-up points (`reshape(-1, d)`)."""
        d = self.dims[0]
        model = self.make_model(d)
        for role in ("X_pending", "X_observed"):
            for bad, match in ((torch.rand(3, d + 2, dtype=torch.float64), rf"{role} must be an `m x {d}` "
                                                                           r"tensor"),
                               (torch.rand(2, 3, d, dtype=torch.float64), rf"{role} must be an `m x {d}` "
                                                                          r"tensor"),
                               (torch.full((2, d), 1.5, dtype=torch.float64), rf"row 0 of {role} is not a "
                                                                              r"point"),
                               (torch.full((2, d), math.nan, dtype=torch.float64), rf"row 0 of {role} is not "
                                                                                   r"a point")):
                with pytest.raises(InputDataError, match=match):
                    self.make_proposer().propose(model, 2, seed=1, dim=d, **{role: bad})
        # no points, in any empty shape, are none
        assert self.make_proposer().propose(model, 2, seed=1, dim=d, X_pending=torch.empty(0)).shape == (2, d)

    def test_contract_state_round_trip(self) -> None:
        proposer = self.make_proposer()
        state = proposer.get_state()
        other = self.make_proposer()
        other.set_state(state)
        assert other.get_state() == state


#: the name STYLE.md §4.12 uses
ProposerTestCase = ProposerContract


def count_replaced(monkeypatch: Any) -> list[int]:
    """Patch `AskTellOptimizer._dedupe` to record, per `ask`, how many proposed points it replaced (a point
    that repeated a taken one, after snapping onto the space's grid); returns the list it appends to."""
    import orchestrator.ask_tell as AT

    replaced: list[int] = []
    dedupe = AT.AskTellOptimizer._dedupe

    def counting(self: Any, X: Tensor, *args: Any) -> Tensor:
        out = dedupe(self, X, *args)
        replaced.append(int(((out - X).abs().amax(-1) > 1e-9).sum()))
        return out

    monkeypatch.setattr(AT.AskTellOptimizer, "_dedupe", counting)
    return replaced
