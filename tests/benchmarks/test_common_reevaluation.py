"""The benchmarks' synchronous loops spend a run's default re-evaluation (`benchmarks._common.ask_batch`):
qbatch's own models search until the budget's last share and then re-evaluate their best observed points, as
the planner does in a run; the baselines search to the end, and their recorded runs keep their tags."""

from __future__ import annotations

import pytest

from benchmarks._common import (
    Method,
    ask_batch,
    config_tag,
    next_batch_size,
    reevaluation_of,
    reevaluation_section,
    run_settings,
)
from orchestrator.ask_tell.repeats import SOURCE, repeat_share
from orchestrator.config.experiment import ReevaluationConfig


def _loop(final: int, budget: int = 30, batch: int = 8) -> tuple[list[int], list[list]]:
    from orchestrator.ask_tell import AskTellOptimizer

    space = {k: {"type": "float", "low": 0.0, "high": 1.0} for k in ("x", "y")}
    opt = AskTellOptimizer(space, model="exact-gp", tau=0.5, proposer="thompson", initial_design=10, seed=0)
    sizes, batches, n = [], [], 0
    while trials := ask_batch(opt, n, budget, batch, final):
        for t in trials:
            opt.tell(t.trial_id, -((t.params["x"] - 0.3) ** 2) - (t.params["y"] - 0.6) ** 2)
        sizes.append(len(trials))
        batches.append(trials)
        n += len(trials)
    return sizes, batches


def test_the_search_stops_where_the_reevaluations_begin_and_they_repeat_measured_points():
    sizes, batches = _loop(final=4)
    # batches of 8 (the initial design's 10 points among them) up to budget - final = 26, then the 4
    # re-evaluations
    assert sizes == [8, 8, 8, 2, 4]
    searched = [t for b in batches[:-1] for t in b]
    assert all(t.source != SOURCE for t in searched)
    measured = {tuple(t.x.tolist()) for t in searched}
    assert all(t.source == SOURCE and tuple(t.x.tolist()) in measured for t in batches[-1])
    # a loop that keeps nothing back searches to the end in whole batches
    sizes, batches = _loop(final=0)
    assert sizes == [8, 8, 8, 6] and all(t.source != SOURCE for b in batches for t in b)


@pytest.mark.parametrize(
    ("n", "budget", "batch", "final", "size"),
    [(0, 30, 8, 4, 8), (18, 30, 8, 4, 8), (20, 30, 8, 4, 6), (26, 30, 8, 4, 4), (28, 30, 8, 4, 2),
     (30, 30, 8, 4, 0), (27, 30, 8, 0, 3), (1340, 1500, 25, 150, 10), (1350, 1500, 25, 150, 25)],
)
def test_next_batch_size_splits_the_budget_at_the_reevaluations(n, budget, batch, final, size):
    assert next_batch_size(n, budget, batch, final) == size


def test_qbatch_models_take_the_run_default_and_the_baselines_search_to_the_end():
    default = ReevaluationConfig()
    assert default.fraction > 0
    for model in ("quantile", "expectile"):
        assert reevaluation_of(Method(model, "thompson")) == (default.fraction, default.repeats)
    for model in ("exact-gp", "heteroscedastic", "gpr-replicates"):
        assert reevaluation_of(Method(model, "thompson")) == (0.0, 1)
    assert repeat_share(1500, default.fraction) == 150


def test_a_config_that_searches_to_the_end_keeps_the_tag_of_the_runs_recorded_before():
    base = {"name": "x", "budget": 40, "seed": 0}
    searching = {**base, "reevaluation": reevaluation_section(Method("exact-gp", "qlognei"))}
    assert config_tag(run_settings(searching)) == config_tag(base)
    spending = {**base, "reevaluation": reevaluation_section(Method("quantile", "thompson"))}
    assert config_tag(run_settings(spending)) != config_tag(base)


def test_the_lander_and_laser_configs_carry_the_section_and_the_loops_keep_the_final_share(load_benchmark):
    lander, laser = load_benchmark("lander"), load_benchmark("laser")
    proto = lander.Protocol(0.1, 20, 40, 10)
    objective = {"name": "lunar-lander", "options": {}}
    for mod, raw in [
        (lander, lander.method_config("quantile-ts", proto, 0, objective, {}, {})),
        (laser, laser.method_config("quantile-ts", 0.1, 20, 40, 10, 0, objective, {}, {})),
    ]:
        assert raw["reevaluation"] == {"fraction": ReevaluationConfig().fraction,
                                       "repeats": ReevaluationConfig().repeats}, mod.__name__
    raw = lander.method_config("qlognei", proto, 0, objective, {}, {})
    assert raw["reevaluation"]["fraction"] == 0
    run = lander.LanderRun("quantile-ts", proto, 0, 5, 10, {}, {})
    assert run.final == repeat_share(40, ReevaluationConfig().fraction) == 4
    assert lander.LanderRun("gpr-ei", proto, 0, 5, 10, {}, {}).final == 0
