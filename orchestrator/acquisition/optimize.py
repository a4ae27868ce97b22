"""Vectorised multi-start maximization of many functions at once in the unit cube.

Used by Thompson sampling (quantile-expectile-bo.md §2 step 5): q sample paths are maximized
together, first by scoring one shared random (scrambled Sobol) candidate set in memory-bounded
chunks (`top_k_shared`), then by box-constrained L-BFGS-B from the best starts of every path
(`maximize_lbfgsb`). Every (path, start) pair is its own problem: with BoTorch's batched L-BFGS-B
(`botorch.optim.batched_lbfgs_b`) each problem keeps its own curvature memory, line search and
stopping test while all function evaluations are one vectorised call; the fallback is the trick of
BoTorch's `gen_candidates_scipy`: one `scipy.optimize.minimize` on the sum over problems, whose
gradient separates.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch
from scipy.optimize import minimize
from threadpoolctl import threadpool_limits
from torch import Tensor

from orchestrator.checks import check_int
from orchestrator.errors import InputDataError

__all__ = ["top_k_shared", "maximize_lbfgsb", "chunk_rows", "METHODS"]

logger = logging.getLogger(__name__)

#: L-BFGS-B drivers: independent problems (BoTorch's batched port of SciPy's L-BFGS-B) or one summed problem
METHODS = ("batched", "joint")

#: default memory for one chunk of intermediate `rows x width` float64 matrices (bytes)
DEFAULT_CHUNK_BYTES = 64 * 2**20


def chunk_rows(width: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES, itemsize: int = 8) -> int:
    """Rows per chunk so that a `rows x width` matrix of `itemsize`-byte numbers fits in `chunk_bytes` (>=
    1)."""
    return max(1, int(chunk_bytes // (max(1, width) * itemsize)))


def top_k_shared(
    score: Callable[[Tensor], Tensor],
    X: Tensor,
    k: int,
    width: int,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> tuple[Tensor, Tensor]:
    """Best `k` of the shared candidates `X` for every function, scored chunk by chunk.

    Args:
        score: maps `c x d` candidates to `c x q` values (column j = function j).
        X: `N x d` candidates shared by all functions.
        k: how many of the best candidates to keep per function (clipped to N).
        width: the largest row width of `score`'s intermediates (e.g. max(L, m, q)), for chunk sizing.
        chunk_bytes: memory budget of one chunk's `c x width` intermediates.

    Returns:
        (`q x k` values in decreasing order, `q x k` long indices into `X`).
    """
    N = X.shape[0]
    k = min(int(k), N)
    step = chunk_rows(width, chunk_bytes)
    best_v: Tensor | None = None
    best_i: Tensor | None = None
    with torch.no_grad():
        for start in range(0, N, step):
            vals = score(X[start : start + step]).mT  # `q x c`
            idx = torch.arange(start, start + vals.shape[-1], device=X.device).expand_as(vals)
            if best_v is not None:
                vals = torch.cat([best_v, vals], dim=-1)
                idx = torch.cat([best_i, idx], dim=-1)
            kk = min(k, vals.shape[-1])
            best_v, pos = vals.topk(kk, dim=-1)
            best_i = idx.gather(-1, pos)
    assert best_v is not None and best_i is not None
    return best_v, best_i


def maximize_lbfgsb(
    fun: Callable[[Tensor, Tensor], Tensor],
    X0: Tensor,
    maxiter: int = 200,
    method: str = "batched",
    chunk_bytes: int = 4 * DEFAULT_CHUNK_BYTES,
    width: int = 1,
) -> tuple[Tensor, Tensor]:
    """Maximize `p` independent problems in `[0, 1]^d` by L-BFGS-B, all evaluations vectorised.

    Args:
        fun: `fun(X, idx)` returns the `k` values of problems `idx` (`k` long) at `X` (`k x d`);
            differentiable in `X` (row i's value depends only on row i).
        X0: `p x d` starting points (clamped into the cube).
        maxiter: L-BFGS-B iterations per problem.
        method: "batched" (independent L-BFGS-B per problem, BoTorch's batched port; falls back to
            "joint" where it is unavailable) or "joint" (one SciPy problem on the sum).
        chunk_bytes: memory budget of one evaluation chunk (evaluations of many problems are chunked).
        width: the largest row width of `fun`'s intermediates (e.g. max(L, m)), for chunk sizing.

    Returns:
        (`p x d` final points inside the cube, `p` values there); a problem never ends worse than its start.

    Raises:
        InputDataError: for an unknown `method` or a non-positive `maxiter`.
    """
    if method not in METHODS:
        raise InputDataError(f"method must be one of {METHODS}; got {method!r}")
    maxiter = check_int("maxiter", maxiter, 1, error=InputDataError)
    p, d = X0.shape
    tk = {"dtype": X0.dtype, "device": X0.device}
    X0 = X0.detach().clamp(0.0, 1.0)
    step = chunk_rows(width, chunk_bytes)

    def value_and_grad(x: np.ndarray, idx: Tensor) -> tuple[np.ndarray, np.ndarray]:
        X = torch.from_numpy(np.ascontiguousarray(x)).to(**tk).reshape(-1, d)
        vals, grads = [], []
        for s in range(0, X.shape[0], step):
            Xc = X[s : s + step].detach().requires_grad_(True)
            v = fun(Xc, idx[s : s + step])
            (g,) = torch.autograd.grad(v.sum(), Xc)
            vals.append(v.detach())
            grads.append(g)
        v = torch.cat(vals)
        g = torch.cat(grads)
        if not torch.isfinite(v).all() or not torch.isfinite(g).all():
            raise FloatingPointError("a function value or gradient is not finite during L-BFGS-B")
        return (-v).cpu().numpy().astype(np.float64), (-g).cpu().numpy().astype(np.float64)

    all_idx = torch.arange(p, device=X0.device)
    x0 = X0.cpu().numpy().astype(np.float64)
    X_final: np.ndarray | None = None
    if method == "batched":
        try:
            from botorch.generation.gen import get_reasons_against_fast_path
            from botorch.optim.batched_lbfgs_b import fmin_l_bfgs_b_batched

            reasons = get_reasons_against_fast_path("L-BFGS-B", True, {"maxiter": maxiter}, None)
        except ImportError as exc:  # pragma: no cover - depends on the BoTorch version
            reasons = [f"BoTorch's batched L-BFGS-B is not importable ({exc})"]
        if reasons:  # pragma: no cover - depends on the SciPy/BoTorch versions
            logger.info("batched L-BFGS-B unavailable (%s); using the joint problem", "; ".join(reasons))
            method = "joint"
        else:

            def batched(x: np.ndarray, batch_indices: list[int]) -> tuple[np.ndarray, np.ndarray]:
                idx = torch.as_tensor(batch_indices, dtype=torch.long, device=X0.device)
                return value_and_grad(x, idx)

            # one BLAS thread for SciPy's L-BFGS-B kernels, as BoTorch does: its many tiny BLAS calls
            # otherwise stall on thread hand-offs (20x slower on a loaded 2-core machine)
            with threadpool_limits(limits=1, user_api="blas"):
                X_final, _, _ = fmin_l_bfgs_b_batched(
                    batched,
                    x0.reshape(p, d),
                    bounds=[(0.0, 1.0)] * d,
                    maxiter=maxiter,
                    pass_batch_indices=True,
                )
    if method == "joint":

        def joint(x: np.ndarray) -> tuple[float, np.ndarray]:
            f, g = value_and_grad(x, all_idx)
            return float(f.sum()), g.reshape(-1)

        with threadpool_limits(limits=1, user_api="blas"):
            res = minimize(
                joint, x0.reshape(-1), jac=True, method="L-BFGS-B", bounds=[(0.0, 1.0)] * (p * d),
                options={"maxiter": maxiter},
            )
        X_final = res.x
    assert X_final is not None
    X = torch.from_numpy(np.asarray(X_final).reshape(p, d)).to(**tk).clamp(0.0, 1.0)
    with torch.no_grad():
        v = torch.cat([fun(X[s : s + step], all_idx[s : s + step]) for s in range(0, p, step)])
        v0 = torch.cat([fun(X0[s : s + step], all_idx[s : s + step]) for s in range(0, p, step)])
    worse = v < v0
    X = torch.where(worse.unsqueeze(-1), X0, X)
    v = torch.where(worse, v0, v)
    return X, v
