"""Batch Thompson sampling: q pathwise posterior samples maximized together (quantile-expectile-bo.md §2).

Each batch element b draws a Matheron path f_b of the optimized latent (`rff.MatheronPaths`, spec §2
steps 1-4) and proposes x_b = argmax f_b (step 5). All q paths are maximized in ONE vectorised
multi-start search: a shared scrambled-Sobol candidate set (trieste's max(5000, 1000·d) points) is
scored for every path with two matrix products, each path's best candidates start BoTorch's batched
L-BFGS-B (`optimize.maximize_lbfgsb`), and each path keeps its best local optimum.

Beyond the paper (which has no de-duplication): the batch never repeats a pending point, an observed
point, or itself (max-norm distance below `DUPLICATE_TOL`). A path whose best point is taken moves to
its next-best local optimum, then to its best raw candidates, then to fresh random points: no point is
dropped. Families: quantile/expectile SVGPs sample f; a two-latent gaussian model (HetGP-TS) maximizes
the path quantile f̃ + Φ⁻¹(τ)·exp(g̃) (spec §2, last bullet); an exact GP (one latent) samples f with
Z = its training inputs. An optional `spread` s(x) (set by the calibrator) rescales every path around
the posterior mean of the target: μ(x) + s(x)·(path(x) − μ(x)).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from scipy.spatial import cKDTree
from torch import Tensor

from orchestrator.acquisition.base import DUPLICATE_TOL, Proposer, min_distance
from orchestrator.acquisition.optimize import (
    DEFAULT_CHUNK_BYTES,
    METHODS,
    chunk_rows,
    maximize_lbfgsb,
    top_k_shared,
)
from orchestrator.acquisition.rff import MatheronPaths
from orchestrator.checks import check_bool, check_float, check_int
from orchestrator.errors import ConfigError, InputDataError
from orchestrator.limits import MAX_FEATURES, MAX_RAW_SAMPLES, MAX_RESTARTS, check_at_most
from orchestrator.models.base import Surrogate

__all__ = ["ThompsonSampling", "TargetPaths", "default_raw_samples", "default_num_restarts"]

#: raw candidates kept per path beyond its restarts, as fallbacks when its optima are already taken
EXTRA_CANDIDATES = 32
#: max-norm distance below which two candidates of one path count as the same local optimum (restarts that
#: converged to one optimum land within L-BFGS-B's tolerance of each other, well below this)
SAME_OPTIMUM_TOL = 1e-4
#: largest factor by which `default_raw_samples` makes up for starts per path below 10·d
MAX_RAW_FACTOR = 4
#: cap on (paths x restarts) L-BFGS-B problems for the default number of restarts
MAX_DEFAULT_PROBLEMS = 4096
#: share of the observed inputs, best first by the posterior mean of the target, that local candidates perturb
#: (BoTorch's `sample_points_around_best`: its `best_pct`)
LOCAL_BEST_FRACTION = 0.05
#: standard deviation of the local candidates' perturbations in the unit cube (BoTorch's `subset_sigma`)
LOCAL_SIGMA = 0.1


def default_raw_samples(d: int, restarts: int | None = None) -> int:
    """trieste v0.10's candidate count max(5000, 1000·d) (spec §2 step 5), times the factor (at most
    `MAX_RAW_FACTOR`) by which `restarts` per path fall short of its 10·d starts.

    With few starts per path (large batches) a path's best raw candidates decide which basin it searches:
    at q = 500 in 6-D (8 starts) 26% of the points ended more than 1e-3 below their path's maximum with
    6,000 candidates and 16% with 24,000, for 20% more time (scoring candidates is cheap beside L-BFGS-B).
    """
    base = max(5000, 1000 * d)
    if restarts is None or restarts >= 10 * d:
        return base
    return base * min(MAX_RAW_FACTOR, math.ceil(10 * d / max(restarts, 1)))


def default_num_restarts(d: int, q: int) -> int:
    """trieste's 10·d starts per path, shrunk so that q·restarts <= `MAX_DEFAULT_PROBLEMS`, at least 2."""
    return max(2, min(10 * d, MAX_DEFAULT_PROBLEMS // q))


def _positive_int_or_none(name: str, value: Any, none_ok: bool = True) -> int | None:
    return check_int(f"ThompsonSampling `{name}`", value, 1, optional=none_ok,
                     must="an integer >= 1 or None" if none_ok else None)


class TargetPaths:
    """The q target paths of one batch: f paths, or HetGP path quantiles f̃ + Φ⁻¹(τ)e^{g̃}, optionally spread.

    Args:
        model: the fitted surrogate (its `sparse_parts`, `family`, `num_outputs_latent`, `tau`).
        q: number of paths.
        num_features: L random Fourier features per latent.
        generator: the source of randomness (f's paths are drawn first, then g's).
        spread: optional s(x), see `ThompsonSampling`.
        shared_features: one set of random features for all q paths (spec A3, the authors' choice), or a set
            per path.
    """

    def __init__(
        self,
        model: Surrogate,
        q: int,
        num_features: int,
        generator: torch.Generator,
        spread: Callable[[Tensor], Tensor] | None,
        shared_features: bool = True,
    ) -> None:
        self.f = MatheronPaths(model.sparse_parts("f"), q, num_features, generator=generator,
                               shared_features=shared_features)
        self.g: MatheronPaths | None = None
        if model.family == "gaussian" and model.num_outputs_latent == 2:
            self.g = MatheronPaths(model.sparse_parts("g"), q, num_features, generator=generator,
                                   shared_features=shared_features)
            self.z = float(torch.special.ndtri(torch.tensor(float(model.tau), dtype=torch.float64)))
        self.spread = spread
        # widest row of `shared`'s intermediates, for chunk sizing: `n x L` features, or `q x n x L` per path
        self.width = max(num_features if shared_features else q * num_features, self.f.m, q)

    def _mean(self, X: Tensor) -> Tensor:
        mu = self.f.mean(X)
        if self.g is not None:
            mu = mu + self.z * self.g.mean(X).exp()
        return mu

    def _apply_spread(self, X: Tensor, paths: Tensor, batch_last: bool) -> Tensor:
        if self.spread is None:
            return paths
        s = self.spread(X)
        if s.shape != X.shape[:-1]:
            raise InputDataError(
                f"spread must map `... x n x d` to `... x n`; got shape {tuple(s.shape)} for X of shape "
                f"{tuple(X.shape)}"
            )
        mu = self._mean(X)
        if batch_last:  # paths are `n x q`, X is `n x d`
            s, mu = s.unsqueeze(-1), mu.unsqueeze(-1)
        # written as path + (s - 1)(path - mu) so that s = 1 returns the path bit for bit
        return paths + (s - 1) * (paths - mu)

    def shared(self, X: Tensor, path_index: Tensor | None = None) -> Tensor:
        """All q targets (or those of `path_index`, `k` long) at shared points `X` (`n x d`): `n x q` (`n x
        k`)."""
        t = self.f.evaluate_shared(X, path_index)
        if self.g is not None:
            t = t + self.z * self.g.evaluate_shared(X, path_index).exp()
        return self._apply_spread(X, t, batch_last=True)

    def at(self, X: Tensor, path_index: Tensor) -> Tensor:
        """Target of path `path_index[i]` at `X[i]` (`k x d`): `k` (differentiable)."""
        Xn = X.unsqueeze(-2)
        t = self.f(Xn, path_index)
        if self.g is not None:
            t = t + self.z * self.g(Xn, path_index).exp()
        return self._apply_spread(Xn, t, batch_last=False).squeeze(-1)


class ThompsonSampling(Proposer):
    """Batch Thompson sampling with pathwise posterior samples (spec §2), all q paths maximized together.

    Args:
        num_features: L random Fourier features per path (spec: 1000).
        raw_samples: shared scrambled-Sobol candidates scored for every path; None = `default_raw_samples`
            (max(5000, 1000·d), more when the starts per path are fewer than 10·d).
        num_restarts: L-BFGS-B starts per path (its best raw candidates); None = `default_num_restarts`.
        maxiter: L-BFGS-B iterations per start.
        spread: optional callable s(X), `... x n x d` -> `... x n` (positive), used by the calibrator: each
            path becomes μ(x) + s(x)·(path(x) − μ(x)), μ = posterior mean of the target. Make it torch-
            differentiable (or piecewise constant) so L-BFGS-B sees its gradient. Not part of the state.
        method: "batched" (independent L-BFGS-B per start) or "joint" (one summed SciPy problem).
        chunk_bytes: memory budget of one chunk of candidate scoring (bounds memory at q = 1000); the
            L-BFGS-B evaluations, which keep autograd intermediates, get four times it.
        shared_features: the q paths of a batch share their random frequencies and phases (spec A3: the
            authors' code, and the default), or each path draws its own (`False`): exact paths marginally over
            the features, so the batch's paths do not share the RFF kernel error; scoring the candidates then
            costs about q times as much.
        local_fraction: share of the raw candidates drawn around the best observed inputs (the top
            `LOCAL_BEST_FRACTION` by the posterior mean of the target, at least one) instead of from the Sobol
            set: BoTorch's `sample_perturbed_subset_dims` (Gaussian steps of `LOCAL_SIGMA`, a subset of the
            dimensions when d > 20), as BoTorch's `optimize_acqf` seeds its starts around the best points. In
            many dimensions a space-filling set leaves the region of the best points with few candidates, so
            the paths' maxima there go unfound. 0 (the spec's all-Sobol set) turns it off.

    Raises:
        ConfigError: naming the option that is out of range.
    """

    uses_spread = True
    #: the options `get_state` saves and `set_state` takes (`spread` belongs to the calibrator)
    STATE_KEYS = ("num_features", "raw_samples", "num_restarts", "maxiter", "method", "chunk_bytes",
                  "shared_features", "local_fraction")

    def __init__(
        self,
        num_features: int = 1000,
        raw_samples: int | None = None,
        num_restarts: int | None = None,
        maxiter: int = 200,
        spread: Callable[[Tensor], Tensor] | None = None,
        method: str = "batched",
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        shared_features: bool = True,
        local_fraction: float = 0.0,
    ) -> None:
        self.set_state(
            {
                "local_fraction": local_fraction,
                "num_features": num_features,
                "raw_samples": raw_samples,
                "num_restarts": num_restarts,
                "maxiter": maxiter,
                "method": method,
                "chunk_bytes": chunk_bytes,
                "shared_features": shared_features,
            }
        )
        if spread is not None and not callable(spread):
            raise ConfigError(f"ThompsonSampling `spread` must be a callable or None; got {spread!r}")
        self.spread = spread
        #: rounding onto the search space's grid (`SearchSpace.snap`; the optimizer sets it for int and choice
        #: parameters): each path's candidates are compared with the taken points where they will be evaluated
        self.snap: Callable[[Tensor], Tensor] | None = None

    def get_state(self) -> dict[str, Any]:
        """The options (plain values); `spread` is owned and restored by the calibrator."""
        return {k: getattr(self, k) for k in self.STATE_KEYS}

    def set_state(self, state: dict[str, Any]) -> None:
        valid = set(self.STATE_KEYS)
        unknown = set(state) - valid
        if unknown:
            raise ConfigError(f"unknown ThompsonSampling option(s) {sorted(unknown)}; valid: {sorted(valid)}")
        for name in ("num_features", "maxiter", "chunk_bytes"):
            setattr(
                self,
                name,
                _positive_int_or_none(name, state.get(name, getattr(self, name, None)), none_ok=False),
            )
        for name in ("raw_samples", "num_restarts"):
            setattr(self, name, _positive_int_or_none(name, state.get(name, getattr(self, name, None))))
        for name, high in (("num_features", MAX_FEATURES), ("raw_samples", MAX_RAW_SAMPLES),
                           ("num_restarts", MAX_RESTARTS)):
            check_at_most(f"ThompsonSampling `{name}`", getattr(self, name), high)
        method = state.get("method", getattr(self, "method", "batched"))
        if method not in METHODS:
            raise ConfigError(f"ThompsonSampling `method` must be one of {METHODS}; got {method!r}")
        self.method = method
        shared = state.get("shared_features", getattr(self, "shared_features", True))
        self.shared_features = check_bool("ThompsonSampling `shared_features`", shared)
        local = state.get("local_fraction", getattr(self, "local_fraction", 0.0))
        self.local_fraction = check_float("ThompsonSampling `local_fraction`", local, 0.0, 1.0, hi_open=True)

    def sample_paths(self, model: Surrogate, q: int, generator: torch.Generator) -> TargetPaths:
        """The q target paths `_propose` maximizes (its first use of `generator`; tests reuse it)."""
        return TargetPaths(model, q, self.num_features, generator, self.spread, self.shared_features)

    def _propose(
        self, model: Surrogate, q: int, X_pending: Tensor, X_observed: Tensor, generator: torch.Generator
    ) -> Tensor:
        target = self.sample_paths(model, q, generator)
        Z = target.f.Z
        d, tk = Z.shape[-1], {"dtype": Z.dtype, "device": Z.device}
        restarts = self.num_restarts or default_num_restarts(d, q)
        n_raw = self.raw_samples or default_raw_samples(d, restarts)
        restarts = min(restarts, n_raw)
        sobol_seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        X_raw = torch.quasirandom.SobolEngine(d, scramble=True, seed=sobol_seed).draw(n_raw).to(**tk)
        n_local = int(self.local_fraction * n_raw)
        if n_local and X_observed.shape[0]:
            X_raw[:n_local] = self._local_candidates(model, X_observed.to(**tk), n_local, generator)

        # 1. score the shared candidates for every path (chunked matrix products), keep the best per path
        keep = min(restarts + EXTRA_CANDIDATES, n_raw)
        raw_val, raw_idx = top_k_shared(
            target.shared, X_raw, keep, width=target.width, chunk_bytes=self.chunk_bytes
        )

        # 2. one batched L-BFGS-B over all (path, start) problems
        starts = X_raw[raw_idx[:, :restarts]].reshape(q * restarts, d)
        problem_path = torch.arange(q, device=Z.device).repeat_interleave(restarts)
        X_opt, v_opt = maximize_lbfgsb(
            lambda X, idx: target.at(X, problem_path[idx]),
            starts,
            maxiter=self.maxiter,
            method=self.method,
            chunk_bytes=4 * self.chunk_bytes,  # the optimizer's default ratio to the scoring chunk (autograd)
            width=max(self.num_features, target.f.m),
        )

        # 3. each path's candidates, best first: its local optima, then its best raw candidates
        cand = torch.cat([X_opt.reshape(q, restarts, d), X_raw[raw_idx]], dim=1)
        val = torch.cat([v_opt.reshape(q, restarts), raw_val], dim=1)
        order = val.argsort(dim=1, descending=True)
        cand = cand.gather(1, order.unsqueeze(-1).expand_as(cand))
        if self.snap is not None:
            # on the grid: a path whose best point rounds onto a taken cell moves on to its next candidate
            # here, instead of the optimizer replacing it by a random cell (which it otherwise does to 445 of
            # 500 points on a 1,024-cell int grid). Its fallback points stay off the grid, so the selection
            # still ends when the grid is used up; the optimizer then snaps them and keeps repeats only where
            # no cell is free.
            cand = self.snap(cand.reshape(-1, d)).to(**tk).reshape(cand.shape)
        forbidden = torch.cat([X_pending.to(**tk), X_observed.to(**tk)])
        return self._select_distinct(target, cand, forbidden, X_raw, generator)

    def _local_candidates(
        self, model: Surrogate, X_observed: Tensor, n: int, generator: torch.Generator
    ) -> Tensor:
        """`n` candidates around the best observed inputs by the posterior mean of the target
        (`local_fraction`)."""
        from botorch.optim.initializers import sample_perturbed_subset_dims

        with torch.no_grad():
            mean = model.objective_mean(X_observed).reshape(-1)
        k = max(1, math.ceil(LOCAL_BEST_FRACTION * X_observed.shape[0]))
        best = X_observed[mean.topk(min(k, mean.numel())).indices]
        bounds = torch.stack([torch.zeros_like(best[0]), torch.ones_like(best[0])])
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        # BoTorch draws from torch's RNG
        with torch.random.fork_rng(devices=[best.device] if best.is_cuda else []):
            torch.manual_seed(seed)
            return sample_perturbed_subset_dims(best, bounds, n, sigma=LOCAL_SIGMA)

    def _select_distinct(
        self, target: TargetPaths, cand: Tensor, forbidden: Tensor, X_raw: Tensor, generator: torch.Generator
    ) -> Tensor:
        """Each path's best candidate that repeats neither `forbidden` nor an earlier path's choice.

        Args:
            cand: `q x C x d` candidates of each path, best first.
            forbidden: `m x d` pending and observed points.
        """
        q, C, d = cand.shape
        # candidates of one path closer than SAME_OPTIMUM_TOL are restarts that reached the same optimum:
        # rejecting one rejects them all, so a path moves to its next DISTINCT optimum
        same = torch.zeros(q, C, C, dtype=torch.bool, device=cand.device)
        step = max(1, 2**22 // (C * C * d))
        for s in range(0, q, step):
            c = cand[s : s + step]
            same[s : s + step] = (c.unsqueeze(-2) - c.unsqueeze(-3)).abs().amax(-1) < SAME_OPTIMUM_TOL
        blocked = _near(cand.reshape(-1, d), forbidden).reshape(q, C)
        rejected = (same & blocked.unsqueeze(-2)).any(-1)
        ptr = _first_free(rejected)  # C = none left
        chosen = torch.empty(q, d, dtype=cand.dtype, device=cand.device)
        fixed = torch.zeros(q, dtype=torch.bool, device=cand.device)  # chosen by the fallback
        rows = torch.arange(q, device=cand.device)
        while True:
            ok = (ptr < C) & ~fixed
            chosen[ok] = cand[rows[ok], ptr[ok]]
            need = rows[(ptr >= C) & ~fixed]
            if need.numel():  # rare: all of these paths' candidates are taken
                settled = ((ptr < C) | fixed).clone()
                settled[need] = False
                chosen[need] = self._fallback(
                    target, need, torch.cat([forbidden, chosen[settled]]), X_raw, generator
                )
                fixed[need] = True
            # within-batch duplicates: the later path of each close pair moves on
            pairs = cKDTree(chosen.cpu().numpy()).query_pairs(
                r=2 * DUPLICATE_TOL, p=float("inf"), output_type="ndarray"
            )
            losers = sorted(
                {max(i, j) for i, j in pairs.tolist() if (chosen[i] - chosen[j]).abs().max() < DUPLICATE_TOL}
            )
            if not losers:
                return chosen
            for j in losers:
                if fixed[j]:
                    fixed[j] = False  # its fallback point was taken meanwhile: draw it again
                    continue
                rejected[j] |= same[j, ptr[j]]
                ptr[j] = _first_free(rejected[j : j + 1])[0]

    def _fallback(
        self, target: TargetPaths, paths: Tensor, others: Tensor, X_raw: Tensor, generator: torch.Generator
    ) -> Tensor:
        """For each of `paths` (`k` long) in turn: its best raw candidate (then fresh uniform point) that
        repeats none of `others` nor the points picked for the paths before it. Returns `k x d`."""
        with torch.no_grad():
            step = max(1, chunk_rows(target.width, self.chunk_bytes))
            vals = torch.cat([target.shared(c, paths) for c in X_raw.split(step)])  # `N x k`
        order = vals.argsort(dim=0, descending=True)
        picked = []
        for col in range(paths.numel()):
            taken = torch.cat([others, *[p.unsqueeze(0) for p in picked]])
            pool = X_raw[order[:, col]]
            while True:
                ok = ~_near(pool, taken)
                if ok.any():
                    picked.append(pool[ok.nonzero()[0, 0]])
                    break
                fresh = torch.rand(X_raw.shape, generator=generator, dtype=X_raw.dtype).to(X_raw.device)
                with torch.no_grad():
                    fresh_vals = torch.cat(
                        [target.shared(c, paths[col : col + 1]) for c in fresh.split(step)]
                    )
                pool = fresh[fresh_vals[:, 0].argsort(descending=True)]
        return torch.stack(picked)


def _first_free(rejected: Tensor) -> Tensor:
    """Index of the first False per row of a `q x C` mask (C where a row is all True)."""
    free = ~rejected
    C = rejected.shape[-1]
    return torch.where(
        free.any(-1), free.to(torch.int8).argmax(-1), torch.full(free.shape[:-1], C, device=free.device)
    )


def _near(X: Tensor, others: Tensor) -> Tensor:
    """`n` mask: rows of `X` (`n x d`) within max-norm `DUPLICATE_TOL` of a row of `others` (`m x d`)."""
    return min_distance(X, others, bound=2 * DUPLICATE_TOL) < DUPLICATE_TOL
