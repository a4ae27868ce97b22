"""Inducing-point sizing and placement of the two-latent SVGPs (orchestrator/models/allocation.py)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from botorch.models.utils.inducing_point_allocators import (
    GreedyVarianceReduction,
    InducingPointAllocator,
    QualityFunction,
)

from orchestrator.errors import ConfigError
from orchestrator.models import build_model
from orchestrator.models.allocation import (
    AUTO_MAX,
    CANDIDATES_PER_INDUCING,
    FULL_UP_TO,
    QUALITY_CHUNK,
    QUALITY_FLOOR,
    _ImprovementQuality,
    _kernel,
    _preselect,
    allocate_inducing,
    auto_num_inducing,
    check_num_inducing,
    unique_rows,
)

TK = {"dtype": torch.float64}
REPO = Path(__file__).resolve().parents[3]


def test_auto_size_is_every_observation_then_grows_as_sqrt_n_to_its_cap():
    assert [auto_num_inducing(n) for n in (1, 20, FULL_UP_TO)] == [1, 20, FULL_UP_TO]
    assert auto_num_inducing(4 * FULL_UP_TO) == min(AUTO_MAX, 2 * FULL_UP_TO)
    sizes = [auto_num_inducing(n) for n in range(1, 20_000, 97)]
    assert sizes == sorted(sizes) and max(sizes) == AUTO_MAX
    assert auto_num_inducing(1000) == math.ceil(FULL_UP_TO * math.sqrt(2))


def test_num_inducing_is_auto_or_a_positive_integer():
    assert check_num_inducing("auto") == "auto" and check_num_inducing(7) == 7
    for bad in (0, -1, 2.5, True, "many"):
        with pytest.raises(ConfigError, match="num_inducing"):
            check_num_inducing(bad)
    with pytest.raises(ConfigError, match="inducing_placement"):
        build_model("quantile", tau=0.1, inducing_placement="random")
    with pytest.raises(ConfigError, match="optimizer"):
        build_model("quantile", tau=0.1, optimizer="sgd")


def test_unique_rows_keeps_first_seen_order():
    X = torch.tensor([[0.5, 0.1], [0.2, 0.2], [0.5, 0.1], [0.9, 0.3], [0.2, 0.2]], **TK)
    assert torch.equal(unique_rows(X), X[[0, 1, 3]])


def test_few_observations_are_all_inducing_inputs_and_replicates_count_once():
    X = torch.rand(30, 2, generator=torch.Generator().manual_seed(0), **TK)
    X = torch.cat([X, X[:5]])  # five replicated settings
    Z = allocate_inducing(X, 100, torch.full((2,), 0.3, **TK), 1.0)
    assert Z.shape == (30, 2) and torch.equal(Z, unique_rows(X))


def test_improvement_weighting_puts_more_inducing_inputs_near_the_optimum():
    X = torch.rand(600, 2, generator=torch.Generator().manual_seed(1), **TK)
    best = torch.tensor([0.8, 0.8], **TK)

    def posterior(Xc):  # a previous fit whose f peaks at `best`
        return -((Xc - best) ** 2).sum(-1) * 20, torch.full(Xc.shape[:1], 0.05, **TK)

    ls = torch.full((2,), 0.2, **TK)
    near = lambda Z: int(((Z - best).norm(dim=-1) < 0.25).sum())  # noqa: E731
    Z_var = allocate_inducing(X, 60, ls, 1.0)
    Z_ei = allocate_inducing(X, 60, ls, 1.0, posterior)
    assert Z_var.shape == Z_ei.shape == (60, 2)  # the floor on the quality keeps the greedy pass going to m
    assert near(Z_ei) >= 2 * near(Z_var)
    assert all(bool((X == z).all(-1).any()) for z in Z_ei)  # chosen among the observed inputs


def test_lbfgs_reaches_a_lower_loss_than_adam_on_a_small_fit():
    g = torch.Generator().manual_seed(2)
    X = torch.rand(40, 3, generator=g, **TK)
    Y = torch.sin(5 * X[:, 0]) + X[:, 1] + 0.2 * torch.randn(40, generator=g, **TK)
    losses = {}
    for name in ("lbfgs", "adam"):
        model = build_model("quantile", tau=0.2, optimizer=name, seed=0)
        info = model.fit(X, Y)
        assert info["lbfgs"] == float(name == "lbfgs") and info["num_inducing"] == 40
        losses[name] = -model.elbo(X, Y)
    assert losses["lbfgs"] < losses["adam"]


class _QualityAllocator(InducingPointAllocator):
    """BoTorch's public allocator with a given quality function (the reference of the greedy pass)."""

    def __init__(self, quality: QualityFunction) -> None:
        self._quality = quality

    def _get_quality_function(self) -> QualityFunction:
        return self._quality


@pytest.mark.parametrize("d", [2, 5])
@pytest.mark.parametrize("placement", ["variance", "improvement"])
def test_lazy_greedy_pass_picks_what_botorchs_public_allocator_picks(placement: str, d: int):
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        X = torch.rand(300, d, generator=g, **TK)
        ls = 0.1 + 0.4 * torch.rand(d, generator=g, **TK)
        best = torch.rand(d, generator=g, **TK)

        def posterior(Xc, best=best):
            return -((Xc - best) ** 2).sum(-1) * 20, 0.01 + 0.1 * Xc[:, 0]

        post = posterior if placement == "improvement" else None
        reference = (GreedyVarianceReduction() if post is None
                     else _QualityAllocator(_ImprovementQuality(post)))
        dense_kernel = _kernel(ls, 1.3, d, X).requires_grad_(True)  # the public method densifies it
        expected = reference.allocate_inducing_points(X, dense_kernel, 40, torch.Size([]))
        Z = allocate_inducing(X, 40, ls, 1.3, post)
        assert Z.shape == (40, d) and torch.equal(Z, expected)


_LARGE_N_SCRIPT = """
import json, resource, sys, time
import torch
torch.set_num_threads(1)
from orchestrator.models.allocation import _greedy_choice, _kernel, allocate_inducing
n, m, d = 30_000, 200, 4
X = torch.rand(n, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
ls = torch.full((d,), 0.3, dtype=torch.float64)
kernel = _kernel(ls, 1.0, d, X)
allocate_inducing(X[:1000], 20, ls, 1.0)  # library code paths loaded before the baseline
vm = int(next(line for line in open("/proc/self/status") if line.startswith("VmSize")).split()[1]) * 1024
cap = vm + 2**30  # 1 GiB of address space beside what is mapped: an n x n kernel needs 7.2 GB
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
t0 = time.process_time()
Z_all = _greedy_choice(X, kernel, m, torch.ones(n, dtype=torch.float64))
t1 = time.process_time()
Z = allocate_inducing(X, m, ls, 1.0)
t2 = time.process_time()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"greedy_s": t1 - t0, "allocate_s": t2 - t1, "rss_growth": rss - rss0,
                  "m_all": Z_all.shape[0], "m": Z.shape[0]}))
"""


def test_allocation_on_30000_distinct_rows_holds_m_by_n_floats_not_n_by_n():
    # in a subprocess whose address space is capped 1 GiB above what it maps (RLIMIT_AS, as
    # benchmarks/scale.py caps its runs): the greedy pass on all 30,000 rows and the allocation itself
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", _LARGE_N_SCRIPT], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    n = 30_000
    assert out["m_all"] == out["m"] == 200
    assert out["rss_growth"] < 0.02 * n * n * 8  # < 144 MB beside the 7.2 GB of a dense kernel
    assert out["greedy_s"] < 10 and out["allocate_s"] < 10  # CPU seconds of one thread


def test_preselection_past_the_cap_keeps_the_best_quality_points():
    n, m, d = 5000, 10, 3
    cap = CANDIDATES_PER_INDUCING * m
    X = torch.rand(n, d, generator=torch.Generator().manual_seed(3), **TK)
    for j in (17, 2500, n - 1):
        def posterior(Xc, best=X[j]):  # f peaks at the observed input X[j]
            return -((Xc - best) ** 2).sum(-1) * 50, torch.full(Xc.shape[:1], 0.01, **TK)

        quality = _ImprovementQuality(posterior)(X)
        keep = _preselect(quality, cap)
        assert keep.numel() == cap == keep.unique().numel() and torch.equal(keep, keep.sort().values)
        assert set(torch.topk(quality, cap // 2).indices.tolist()) <= set(keep.tolist())
        Z = allocate_inducing(X, m, torch.full((d,), 0.2, **TK), 1.0, posterior)
        assert Z.shape == (m, d) and torch.equal(Z[0], X[j])  # the first pivot is the best candidate
    uniform = _preselect(torch.ones(n, **TK), cap)  # constant quality (variance reduction): a seeded draw
    assert uniform.numel() == cap == uniform.unique().numel()
    assert torch.equal(uniform, _preselect(torch.ones(n, **TK), cap))
    assert uniform.float().mean() == pytest.approx(n / 2, rel=0.1)


def test_improvement_quality_reads_the_posterior_in_chunks_and_scores_as_one_call():
    X = torch.rand(2 * QUALITY_CHUNK + 5, 2, generator=torch.Generator().manual_seed(4), **TK)
    sizes = []

    def posterior(Xc):
        sizes.append(Xc.shape[0])
        return torch.sin(6 * Xc).sum(-1), 0.01 + Xc[:, 1]

    chunked = _ImprovementQuality(posterior)(X)
    assert sizes == [QUALITY_CHUNK, QUALITY_CHUNK, 5]
    mean, var = posterior(X)
    sigma = var.sqrt()
    u = (mean - mean.max()) / sigma
    normal = torch.distributions.Normal(0.0, 1.0)
    ei = sigma * (normal.log_prob(u).exp() + u * normal.cdf(u))
    torch.testing.assert_close(chunked, (ei / ei.max()).clamp_min(QUALITY_FLOOR))
