"""Tests of the baseline proposers: Sobol, random, BoTorch qLogNEI and GPR-EI (spec §4.4)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from orchestrator.acquisition import PROPOSERS, build_proposer
from orchestrator.acquisition.base import Proposer, min_distance
from orchestrator.acquisition.baselines import (
    LogNEIProposer,
    RandomProposer,
    ReplicatedEIProposer,
    SobolProposer,
    expected_improvement,
)
from orchestrator.errors import ConfigError, InputDataError
from orchestrator.models.base import SparseLatentParts
from orchestrator.models.gpr_replicates import ReplicateQuantileGP
from tests.orchestrator.acquisition.proposer_contract import PartsSurrogate, ProposerContract

TK = {"dtype": torch.float64}


pytestmark = pytest.mark.usefixtures("one_thread")


class TestSobolContract(ProposerContract):
    def make_proposer(self) -> Proposer:
        return SobolProposer()


class TestRandomContract(ProposerContract):
    def make_proposer(self) -> Proposer:
        return RandomProposer()


class TestLogNEIContract(ProposerContract):
    dims = (2,)
    q_values = (1, 2)
    n_observed = 6

    def make_proposer(self) -> Proposer:
        return LogNEIProposer(num_restarts=2, raw_samples=16, mc_samples=16, maxiter=8)


def test_registered_names_build() -> None:
    for name, cls in (("sobol", SobolProposer), ("random", RandomProposer), ("qlognei", LogNEIProposer),
                      ("gpr-ei", ReplicatedEIProposer)):
        assert name in PROPOSERS
        assert isinstance(build_proposer(name), cls)
    with pytest.raises(ConfigError, match="qlognei.mc_samples must be an integer >= 1; got 0"):
        build_proposer("qlognei", mc_samples=0)
    for bad in ("a", -1, 2**63, 10**23):  # 10**23 would break the run at its first batch
        with pytest.raises(ConfigError, match=r"sobol.seed must be an integer in \[0, 2\*\*63\) or null; "
                                              r"got "):
            build_proposer("sobol", seed=bad)
    X = build_proposer("sobol", seed=2**63 - 1).propose(None, 3, dim=2)
    assert X.shape == (3, 2)


@pytest.mark.parametrize("cls", [SobolProposer, RandomProposer])
def test_model_free_proposers_need_no_model(cls: type) -> None:
    assert cls.requires_model is False
    X = cls().propose(None, 7, dim=3, seed=0)
    assert X.shape == (7, 3) and X.dtype == torch.float64
    assert (X >= 0).all() and (X <= 1).all()
    with pytest.raises(InputDataError, match="needs `dim` when no model is given"):
        cls().propose(None, 7)


def test_model_based_baselines_refuse_no_model() -> None:
    for cls in (LogNEIProposer, ReplicatedEIProposer):
        with pytest.raises(InputDataError, match="needs a fitted model"):
            cls().propose(None, 2, dim=2)


def test_sobol_with_a_seed_continues_one_sequence() -> None:
    engine = torch.quasirandom.SobolEngine(3, scramble=True, seed=11)
    seq = engine.draw(12, dtype=torch.float64)
    p = SobolProposer(seed=11)
    X = p.propose(None, 5, X_observed=seq[:4], X_pending=seq[4:7], dim=3, seed=0)
    torch.testing.assert_close(X, seq[7:12])


def _peaked_surrogate(peak: float = 0.7) -> PartsSurrogate:
    """1-D posterior whose mean is a clear bump at `peak` and whose variance is tiny near the grid."""
    Z = torch.linspace(0, 1, 21, **TK).unsqueeze(-1)
    u = 2.0 * torch.exp(-((Z[:, 0] - peak) ** 2) / 0.02)
    parts = SparseLatentParts(
        constant_mean=torch.tensor(0.0, **TK), lengthscale=torch.tensor([0.15], **TK),
        outputscale=torch.tensor(1.0, **TK), Z=Z, u_mean=u, u_covar=1e-6 * torch.eye(21, **TK), jitter=1e-8,
    )
    return PartsSurrogate(parts, family="gaussian")


def test_qlognei_proposes_near_the_maximum_of_a_known_posterior_mean() -> None:
    model = _peaked_surrogate(0.7)
    X_obs = torch.tensor([[0.1], [0.3], [0.5], [0.9]], **TK)
    X = LogNEIProposer(num_restarts=4, raw_samples=64, mc_samples=64).propose(
        model, 1, X_observed=X_obs, seed=0
    )
    assert abs(X.item() - 0.7) < 0.05, X


def test_qlognei_sequential_batch_spreads_and_respects_pending() -> None:
    model = _peaked_surrogate(0.7)
    X_obs = torch.tensor([[0.1], [0.3], [0.5], [0.9]], **TK)
    pending = torch.tensor([[0.7]], **TK)
    X = LogNEIProposer(num_restarts=2, raw_samples=32, mc_samples=32, maxiter=20).propose(
        model, 2, X_observed=X_obs, X_pending=pending, seed=1
    )
    assert X.shape == (2, 1)
    # the peak (the q = 1 answer above) is pending: the points move off it, and apart
    assert (min_distance(X, pending) > 1e-3).all(), X
    assert (X[0] - X[1]).abs().item() > 1e-3, X


def _gpr_model(seed: int = 0) -> tuple[ReplicateQuantileGP, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    Xu = torch.tensor([[0.05], [0.2], [0.35], [0.5], [0.8], [0.95]], **TK)
    X = Xu.repeat_interleave(10, 0)
    Y = torch.sin(6 * X[:, 0]) + 0.3 * torch.randn(X.shape[0], generator=g, **TK)
    model = ReplicateQuantileGP(tau=0.75)
    model.fit(X, Y)
    return model, X


def test_gpr_ei_returns_one_point_replicated_q_times_at_the_ei_maximum() -> None:
    model, X_obs = _gpr_model()
    p = ReplicatedEIProposer(num_restarts=4, raw_samples=128)
    X = p.propose(model, 10, X_observed=X_obs, seed=0)
    assert X.shape == (10, 1) and (X >= 0).all() and (X <= 1).all()
    assert torch.equal(X, X[:1].expand(10, 1)), "GPR-EI's batch is one point replicated q times"
    assert ReplicatedEIProposer.allows_repeats is True
    # the incumbent is the best posterior mean at the observed unique inputs
    mu_obs, _ = model.posterior_f(X_obs, full_cov=False)
    assert math.isclose(p.last_incumbent, float(mu_obs.max()), rel_tol=1e-12)
    # and the point maximizes closed-form EI on a dense grid (within 2%)
    grid = torch.linspace(0, 1, 2001, **TK).unsqueeze(-1)
    mu, var = model.posterior_f(grid, full_cov=False)
    ei_grid = expected_improvement(mu, var.sqrt(), p.last_incumbent)
    mu_x, var_x = model.posterior_f(X[:1], full_cov=False)
    ei_x = expected_improvement(mu_x, var_x.sqrt(), p.last_incumbent)
    assert ei_x.item() >= 0.98 * ei_grid.max().item(), (X[0].item(), grid[ei_grid.argmax()].item())
    # same seed, same point
    assert torch.equal(
        ReplicatedEIProposer(num_restarts=4, raw_samples=128).propose(model, 3, X_observed=X_obs, seed=0),
        X[:3],
    )


def test_gpr_ei_moves_off_a_pending_point_but_not_for_a_far_one() -> None:
    """Streaming runs ask while earlier batches are pending. GPR-EI does not propose the EI maximum again at
    every ask until a refit: with the point pending it maximizes the joint EI with the pending points, which
    is small where they already are, and a pending point far from the EI maximum (where EI is low) leaves the
    proposal where it was."""
    model, X_obs = _gpr_model()
    p = ReplicatedEIProposer(num_restarts=4, raw_samples=128)
    x_star = p.propose(model, 4, X_observed=X_obs, seed=0)[:1]
    grid = torch.linspace(0, 1, 2001, **TK).unsqueeze(-1)
    mu, var = model.posterior_f(grid, full_cov=False)
    ei = expected_improvement(mu, var.sqrt(), p.last_incumbent)
    far = grid[ei.argmin()].reshape(1, 1)
    assert ei.min() < 1e-3 * ei.max()
    moved = p.propose(model, 4, X_pending=x_star.expand(4, 1), X_observed=X_obs, seed=0)
    assert torch.equal(moved, moved[:1].expand(4, 1))
    assert (moved[0] - x_star[0]).abs().item() > 0.02, (moved[0].item(), x_star[0].item())
    kept = p.propose(model, 4, X_pending=far.expand(4, 1), X_observed=X_obs, seed=0)
    assert (kept[0] - x_star[0]).abs().item() < 0.01, (kept[0].item(), x_star[0].item())


def test_qlognei_beats_random_search_on_a_1d_function_at_equal_evaluations() -> None:
    """A short BO loop (GP of the mean = `ReplicateQuantileGP` at tau 0.5 with 3 replicates, i.e. a GP with
    known noise) with qLogNEI reaches a better true value than random search with the same 24 evaluations."""
    f = lambda x: torch.sin(3 * math.pi * x) * torch.exp(-2 * (x - 0.6) ** 2)  # noqa: E731
    grid = torch.linspace(0, 1, 4001, **TK)
    f_star = float(f(grid).max())
    gen = torch.Generator().manual_seed(0)
    reps, noise = 3, 0.05

    def evaluate(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        X = x.repeat_interleave(reps, 0)
        return X, f(X[:, 0]) + noise * torch.randn(X.shape[0], generator=gen, **TK)

    X, Y = evaluate(torch.tensor([[0.1], [0.45], [0.9]], **TK))
    model = ReplicateQuantileGP(tau=0.5)
    prop = LogNEIProposer(num_restarts=3, raw_samples=64, mc_samples=64, maxiter=30)
    for it in range(5):
        model.fit(X, Y)
        Xu = torch.unique(X, dim=0)
        x_new = prop.propose(model, 1, X_observed=Xu, seed=it)
        Xn, Yn = evaluate(x_new)
        X, Y = torch.cat([X, Xn]), torch.cat([Y, Yn])
    model.fit(X, Y)
    Xu = torch.unique(X, dim=0)
    best_bo = float(f(Xu[model.posterior_f(Xu, full_cov=False)[0].argmax(), 0]))
    # random search: 8 points x 3 replicates, recommendation = best sample mean; averaged over 20 runs
    rand_best = []
    for _ in range(20):
        Xr = torch.rand(8, 1, generator=gen, **TK)
        _, Yr = evaluate(Xr)
        rand_best.append(float(f(Xr[Yr.reshape(8, reps).mean(-1).argmax(), 0])))
    regret_bo, regret_rand = f_star - best_bo, f_star - sum(rand_best) / len(rand_best)
    assert regret_bo < 0.02, regret_bo
    assert regret_bo < 0.5 * regret_rand, (regret_bo, regret_rand)


@pytest.mark.parametrize(
    "model, proposer", [("exact-gp", "qlognei"), ("exact-gp", "sobol"), ("exact-gp", "random"),
                        ("gpr-replicates", "gpr-ei")],
)
def test_baselines_run_from_a_config_through_ask_tell(model: str, proposer: str) -> None:
    """A config naming a baseline validates, and the optimizer the central actor builds from it (the same
    arguments as orchestrator/actor.py) runs synchronous batches on the GLD objective to its budget.
    GPR-EI asks one point per batch and evaluates it `reps` times (its design: 2 points x `reps`)."""
    import yaml

    from objectives.registry import load_objective
    from orchestrator.ask_tell import AskTellOptimizer
    from orchestrator.config import load_config

    replicate, reps = proposer == "gpr-ei", 3
    raw = yaml.safe_load((Path(__file__).resolve().parents[3] / "examples" / "gld.yaml").read_text())
    options = {"qlognei": {"num_restarts": 2, "raw_samples": 32, "mc_samples": 32, "maxiter": 20},
               "gpr-ei": {"num_restarts": 2, "raw_samples": 32, "maxiter": 20}}.get(proposer, {})
    raw.update(model={"type": model, "options": {}}, proposer={"type": proposer, "options": options},
               batch_size=3, initial_design=2 if replicate else 6, budget=12)
    cfg = load_config(raw)
    objective = load_objective(cfg.objective.name, dict(cfg.objective.options))
    opt = AskTellOptimizer(
        cfg.build_space(objective.space), model=cfg.model.type, tau=cfg.tau, proposer=cfg.proposer.type,
        initial_design=cfg.initial_design, seed=cfg.seed, model_options=dict(cfg.model.options),
        proposer_options=dict(cfg.proposer.options),
    )
    sources = []
    while opt.num_completed < cfg.budget:
        if not opt.num_completed:
            trials = opt.ask(cfg.initial_design)
        else:
            trials = opt.ask(1 if replicate else cfg.batch_size)
        for t in trials:
            sources.append(t.source)
            opt.tell(t.trial_id, objective.evaluate(t.params, t.seed))
            for r in range(1, reps if replicate else 1):
                opt.tell_point(t.params, objective.evaluate(t.params, t.seed + r))
    assert opt.num_completed == cfg.budget and opt.num_failed == 0
    assert sources[cfg.initial_design:] and all(s == "model" for s in sources[cfg.initial_design:])
    opt.fit()
    params, value = opt.best()
    assert set(params) == set(objective.space) and math.isfinite(value)
