"""Baseline proposers of the benchmarks (quantile-expectile-bo.md §4.4).

- `SobolProposer` ("sobol") and `RandomProposer` ("random"): model-free space filling and random search.
- `LogNEIProposer` ("qlognei"): BoTorch's qLogNoisyExpectedImprovement on the latent f of a surrogate (the
  usual user's choice with model "exact-gp", an exact GP of the mean), optimized with `optimize_acqf`, the
  q points jointly or by sequential greedy with X_pending (BoTorch's own sequential mode).
- `ReplicatedEIProposer` ("gpr-ei"): the GPR-EI baseline of paper 003 (spec §4.4) on model "gpr-replicates":
  analytic EI (in log space) with incumbent eta = the best posterior mean at the observed unique inputs
  (Plumlee & Tuo 2014), maximized over the cube; the batch is that ONE point replicated q times, so the
  model can estimate the empirical quantile there. It is the only proposer whose batch repeats a point. With
  pending points (streaming runs) it maximizes qLogEI of the point jointly with them instead.

The BoTorch acquisitions see any qbatch `Surrogate` through `SurrogateModel`, a BoTorch `Model` whose
posterior is the surrogate's (differentiable) posterior of f in standardized units.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from orchestrator.acquisition.base import DUPLICATE_TOL, Proposer, check_target_is_f, min_distance
from orchestrator.checks import check_bool, check_int
from orchestrator.limits import MAX_MC_SAMPLES, MAX_RAW_SAMPLES, MAX_RESTARTS, check_at_most
from orchestrator.models.base import Surrogate

__all__ = [
    "SobolProposer", "RandomProposer", "LogNEIProposer", "ReplicatedEIProposer", "SurrogateModel",
    "expected_improvement",
]

#: quasi-MC samples of GPR-EI's joint EI with pending points (streaming runs only)
PENDING_MC_SAMPLES = 256
#: random draws tried to replace a Sobol/random point that repeats a pending or observed one
_REPLACE_TRIES = 100


def _check_int(owner: str, key: str, value: Any, lo: int, hi: int | None = None) -> int:
    value = check_int(f"{owner}.{key}", value, lo)
    return value if hi is None else check_at_most(f"{owner}.{key}", value, hi)


def _replace_taken(X: Tensor, taken: Tensor, generator: torch.Generator) -> Tensor:
    """Swap rows of `X` within `DUPLICATE_TOL` of `taken` or of an earlier row for fresh uniform points."""
    out = X.clone()
    for i in range(out.shape[0]):
        others = torch.cat([taken, out[:i]])
        for _ in range(_REPLACE_TRIES):
            if float(min_distance(out[i : i + 1], others, bound=2 * DUPLICATE_TOL)[0]) > DUPLICATE_TOL:
                break
            out[i] = torch.rand(out.shape[1], generator=generator, dtype=out.dtype).to(out.device)
    return out


class SobolProposer(Proposer):
    """Space filling by scrambled Sobol points (model-free).

    With an integer `seed` the proposer continues ONE sequence: a proposal skips as many points as are
    already observed or pending, so successive batches are consecutive blocks of the same sequence (with
    `seed` equal to the `AskTellOptimizer`'s seed, the initial design and the later batches are one
    sequence). With `seed=None` each batch is the first `q` points of a sequence scrambled by the proposal's
    own seed. Either way the same inputs and seed give the same batch.

    Args:
        seed: scrambling seed of the one continued sequence, or None (scramble per proposal).
    """

    requires_model = False

    def __init__(self, seed: int | None = None) -> None:
        # bounded as torch's generators take it: a larger seed would pass here and break the run at its first
        # batch
        self.seed = check_int("sobol.seed", seed, 0, 2**63, hi_open=True, optional=True,
                              must="an integer in [0, 2**63) or null")

    def _propose(self, model: Surrogate | None, q: int, X_pending: Tensor, X_observed: Tensor,
                 generator: torch.Generator) -> Tensor:
        d = X_pending.shape[-1]
        if self.seed is None:
            scramble_seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
            engine = torch.quasirandom.SobolEngine(d, scramble=True, seed=scramble_seed)
        else:
            engine = torch.quasirandom.SobolEngine(d, scramble=True, seed=self.seed)
            skip = X_pending.shape[0] + X_observed.shape[0]
            if skip:
                engine.fast_forward(skip)
        X = engine.draw(q, dtype=torch.float64).to(X_pending.device)
        return _replace_taken(X, torch.cat([X_pending, X_observed]), generator)

    def get_state(self) -> dict[str, Any]:
        return {"seed": self.seed}

    def set_state(self, state: dict[str, Any]) -> None:
        self.seed = None if state["seed"] is None else int(state["seed"])


class RandomProposer(Proposer):
    """Random search: `q` independent uniform points in the unit cube (model-free)."""

    requires_model = False

    def _propose(self, model: Surrogate | None, q: int, X_pending: Tensor, X_observed: Tensor,
                 generator: torch.Generator) -> Tensor:
        d = X_pending.shape[-1]
        X = torch.rand(q, d, generator=generator, dtype=torch.float64).to(X_pending.device)
        return _replace_taken(X, torch.cat([X_pending, X_observed]), generator)


def _surrogate_model_class() -> type:
    """Build the BoTorch `Model` adapter lazily (BoTorch is imported only when a BoTorch baseline is used)."""
    from botorch.models.model import Model
    from botorch.posteriors.gpytorch import GPyTorchPosterior
    from gpytorch.distributions import MultivariateNormal

    class _SurrogateModel(Model):
        """A qbatch `Surrogate` seen by BoTorch: one output, the posterior of latent f (standardized units).

        Args:
            surrogate: a fitted surrogate; its `posterior_f` must be differentiable in `X`.
        """

        def __init__(self, surrogate: Surrogate) -> None:
            super().__init__()
            self.surrogate = surrogate
            self._supports_cache_root = False

        @property
        def num_outputs(self) -> int:
            return 1

        @property
        def batch_shape(self) -> torch.Size:
            return torch.Size([])

        def posterior(
            self,
            X: Tensor,
            output_indices: list[int] | None = None,
            observation_noise: bool | Tensor = False,
            posterior_transform: Any = None,
            **kwargs: Any,
        ) -> GPyTorchPosterior:
            """Posterior of f at `batch x n x d` (noise-free; `observation_noise` is ignored)."""
            mean, cov = self.surrogate.posterior_f(X, full_cov=True)
            n = cov.shape[-1]
            cov = 0.5 * (cov + cov.transpose(-1, -2)) + 1e-9 * torch.eye(
                n, dtype=cov.dtype, device=cov.device
            )
            post = GPyTorchPosterior(MultivariateNormal(mean, cov))
            if posterior_transform is not None:
                return posterior_transform(post)
            return post

    return _SurrogateModel


_MODEL_CLASS: type | None = None


def SurrogateModel(surrogate: Surrogate) -> Any:
    """Wrap a fitted `Surrogate` as a single-output BoTorch `Model` (posterior of f, standardized units)."""
    global _MODEL_CLASS
    if _MODEL_CLASS is None:
        _MODEL_CLASS = _surrogate_model_class()
    return _MODEL_CLASS(surrogate)


class _BoTorchProposer(Proposer):
    """Shared `optimize_acqf` settings of the BoTorch baselines."""

    _name = "botorch"

    def __init__(self, num_restarts: int = 10, raw_samples: int = 512, maxiter: int = 200) -> None:
        self.num_restarts = _check_int(self._name, "num_restarts", num_restarts, 1, MAX_RESTARTS)
        self.raw_samples = _check_int(self._name, "raw_samples", raw_samples, 1, MAX_RAW_SAMPLES)
        self.maxiter = _check_int(self._name, "maxiter", maxiter, 1)

    def _optimize(
        self, acqf: Any, d: int, q: int, generator: torch.Generator, sequential: bool = False,
        device: torch.device | None = None,
    ) -> Tensor:
        from botorch.optim import optimize_acqf

        tk = {"dtype": torch.float64, "device": device}  # the model's device, where the proposer's inputs are
        bounds = torch.stack([torch.zeros(d, **tk), torch.ones(d, **tk)])
        # optimize_acqf draws its raw samples from torch's global generator: seed it from ours, then restore
        state = torch.random.get_rng_state()
        torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))
        try:
            X, _ = optimize_acqf(
                acqf, bounds=bounds, q=q, num_restarts=self.num_restarts, raw_samples=self.raw_samples,
                sequential=sequential, options={"maxiter": self.maxiter},
            )
        finally:
            torch.random.set_rng_state(state)
        return X.detach().clamp(0.0, 1.0)


class LogNEIProposer(_BoTorchProposer):
    """BoTorch qLogNoisyExpectedImprovement on the surrogate's latent f (with model "exact-gp": the mean).

    Observed inputs are the baseline (pruned to those that may be the best, BoTorch's default); pending
    points are passed as `X_pending`. `sequential=True` builds the batch greedily, one point at a time with
    the earlier ones pending (BoTorch's `optimize_acqf(sequential=True)`); `False` optimizes the `q x d`
    batch jointly (costly for large q).

    Args:
        num_restarts: L-BFGS-B starts of `optimize_acqf`.
        raw_samples: raw candidates scored to pick the starts.
        mc_samples: quasi-MC samples of the posterior (SobolQMCNormalSampler).
        sequential: greedy sequential (default) or joint optimization of the batch.
        maxiter: L-BFGS-B iterations per start.
    """

    _name = "qlognei"

    def __init__(
        self, num_restarts: int = 10, raw_samples: int = 512, mc_samples: int = 256, sequential: bool = True,
        maxiter: int = 200,
    ) -> None:
        super().__init__(num_restarts, raw_samples, maxiter)
        self.mc_samples = _check_int(self._name, "mc_samples", mc_samples, 1, MAX_MC_SAMPLES)
        self.sequential = check_bool("qlognei.sequential", sequential)

    def check_model(self, model: Surrogate) -> None:
        check_target_is_f(model, "qLogNEI")

    def _propose(self, model: Surrogate | None, q: int, X_pending: Tensor, X_observed: Tensor,
                 generator: torch.Generator) -> Tensor:
        from botorch.acquisition.logei import qLogNoisyExpectedImprovement
        from botorch.sampling import SobolQMCNormalSampler

        d = X_pending.shape[-1]
        X_base = X_observed if X_observed.shape[0] else model.sparse_parts("f").Z
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        state = torch.random.get_rng_state()
        torch.manual_seed(seed)  # pruning of the baseline samples from the global generator
        try:
            acqf = qLogNoisyExpectedImprovement(
                SurrogateModel(model), X_baseline=X_base.detach(),
                sampler=SobolQMCNormalSampler(torch.Size([self.mc_samples]), seed=seed),
                X_pending=X_pending.detach() if X_pending.shape[0] else None, cache_root=False,
                prune_baseline=True,
            )
        finally:
            torch.random.set_rng_state(state)
        X = self._optimize(acqf, d, q, generator, sequential=self.sequential and q > 1,
                           device=X_pending.device)
        return _replace_taken(X, torch.cat([X_pending, X_observed]), generator)

    def get_state(self) -> dict[str, Any]:
        return {
            "num_restarts": self.num_restarts,
            "raw_samples": self.raw_samples,
            "mc_samples": self.mc_samples,
            "sequential": self.sequential,
            "maxiter": self.maxiter,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self.__init__(**state)


class ReplicatedEIProposer(_BoTorchProposer):
    """GPR-EI (spec §4.4): one EI-optimal point, replicated q times.

    EI(x) = E[max(f(x) - eta, 0)] under the posterior of f (for model "gpr-replicates", the GP of the
    empirical tau-quantiles), with incumbent eta = the largest posterior mean of f at the observed unique
    inputs. EI is maximized in log space (BoTorch's `LogExpectedImprovement`, the same argmax, no vanishing
    gradients) over the cube with `optimize_acqf`. The returned batch is `q` copies of that point: the
    replicates give the model its empirical quantile and bootstrap variance there. The point may repeat an
    observed input (EI then asks for more replicates of it). The paper's protocol is synchronous, one
    replicated point per batch, and has no pending points. With pending points (streaming runs) the point
    maximizes BoTorch's `qLogExpectedImprovement` of x jointly with the distinct pending points, with
    `X_pending` (quasi-MC, `PENDING_MC_SAMPLES`): the improvement x adds to what is already being evaluated.
    Ignoring them would propose the same point at every ask until the next refit.

    Args:
        num_restarts: L-BFGS-B starts.
        raw_samples: raw candidates scored to pick the starts.
        maxiter: L-BFGS-B iterations per start.
    """

    _name = "gpr-ei"
    #: the batch repeats one point on purpose: callers must not de-duplicate it
    allows_repeats = True

    def check_model(self, model: Surrogate) -> None:
        check_target_is_f(model, "GPR-EI")

    def _propose(self, model: Surrogate | None, q: int, X_pending: Tensor, X_observed: Tensor,
                 generator: torch.Generator) -> Tensor:
        from botorch.acquisition.analytic import LogExpectedImprovement

        d = X_pending.shape[-1]
        X_base = X_observed if X_observed.shape[0] else model.sparse_parts("f").Z
        with torch.no_grad():
            mu, _ = model.posterior_f(X_base, full_cov=False)
        eta = float(mu.max())
        self.last_incumbent = eta
        if X_pending.shape[0]:
            from botorch.acquisition.logei import qLogExpectedImprovement
            from botorch.sampling import SobolQMCNormalSampler

            seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
            acqf = qLogExpectedImprovement(
                SurrogateModel(model), best_f=eta, X_pending=torch.unique(X_pending.detach(), dim=0),
                sampler=SobolQMCNormalSampler(torch.Size([PENDING_MC_SAMPLES]), seed=seed),
            )
        else:
            acqf = LogExpectedImprovement(SurrogateModel(model), best_f=eta)
        x = self._optimize(acqf, d, 1, generator, device=X_pending.device)
        return x.reshape(1, d).expand(q, d).clone()

    def get_state(self) -> dict[str, Any]:
        return {"num_restarts": self.num_restarts, "raw_samples": self.raw_samples, "maxiter": self.maxiter}

    def set_state(self, state: dict[str, Any]) -> None:
        self.__init__(**state)


def expected_improvement(mean: Tensor, std: Tensor, best_f: float) -> Tensor:
    """Closed-form EI, (mu - eta) Phi(z) + sigma phi(z), z = (mu - eta)/sigma (the test oracle of
    `gpr-ei`)."""
    z = (mean - best_f) / std
    normal = torch.distributions.Normal(torch.zeros_like(z), torch.ones_like(z))
    return (mean - best_f) * normal.cdf(z) + std * normal.log_prob(z).exp()

