"""`QbatchGenerator` (qbatch/gest.py) through the real gest-api classes: a suggest/ingest loop on a small
function, ids, constants, earlier data, failures, and the VOCS qbatch refuses by name."""

from __future__ import annotations

import math

import pytest

gest_api = pytest.importorskip("gest_api")
from gest_api import Generator  # noqa: E402
from gest_api.vocs import VOCS  # noqa: E402

from qbatch.gest import QbatchGenerator, space_from_vocs  # noqa: E402
from tests.integration.conftest import FAST_MODEL, FAST_PROPOSER  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

FAST = {"model_options": FAST_MODEL["options"], "proposer_options": FAST_PROPOSER["options"]}


def _f(point):
    return (point["x1"] - 0.3) ** 2 + (point["x2"] + 1.0) ** 2 + (0.0 if point["mode"] == "a" else 0.5)


def test_a_suggest_ingest_loop_minimizes_a_small_function():
    vocs = VOCS(variables={"x1": [0.0, 1.0], "x2": [-2.0, 2.0], "mode": {"a", "b"}},
                objectives={"f": "MINIMIZE"}, constants={"alpha": 0.55}, observables=["o"])
    gen = QbatchGenerator(vocs, batch_size=4, initial_design=8, seed=2, **FAST)
    assert isinstance(gen, Generator) and gen.returns_id
    values = []
    for _ in range(5):
        points = gen.suggest()  # the generator's batch size
        assert len(points) == 4
        for p in points:
            assert set(p) == {"x1", "x2", "mode", "alpha", "_id"} and p["alpha"] == 0.55
            assert 0.0 <= p["x1"] <= 1.0 and -2.0 <= p["x2"] <= 2.0 and p["mode"] in ("a", "b")
            p["f"] = _f(p)
            p["o"] = 1.0  # an observable: ingested, not optimized
            values.append(p["f"])
        gen.ingest(points)
    points = gen.suggest(3)
    assert len(points) == 3
    gen.finalize()
    opt = gen.optimizer
    assert opt.direction == "minimize" and opt.num_completed == 20 and opt.num_pending == 3
    assert opt.num_stale == 0  # finalize refit on every result
    best_params, best_value = opt.best_observed()
    assert best_value == min(values)
    params, predicted = opt.best()
    assert set(params) == {"x1", "x2", "mode"} and math.isfinite(predicted)


def test_earlier_data_failures_and_unknown_ids():
    vocs = VOCS(variables={"x": [0.0, 1.0]}, objectives={"f": "MAXIMIZE"})
    gen = QbatchGenerator(vocs, batch_size=2, initial_design=4)
    gen.ingest([{"x": 0.5, "f": 2.0}])  # no "_id": a result at that point (earlier data)
    a, b = gen.suggest()
    gen.ingest([{**a, "f": float("nan")}, {**b}])  # a NaN and a missing value: recorded failures
    opt = gen.optimizer
    assert opt.num_completed == 1 and [f["error"] for f in opt.failures] == ["nan", "no-value"]
    assert opt.best_observed() == ({"x": 0.5}, 2.0) and opt.direction == "maximize"
    c, d = gen.suggest()
    with pytest.raises(ValueError, match="unknown _id 'nope'; nothing was ingested"):
        gen.ingest([{**c, "f": 1.0}, {"x": 0.1, "f": 1.0, "_id": "nope"}])
    with pytest.raises(ValueError, match="was ingested already"):
        gen.ingest([{**a, "f": 1.0}])
    with pytest.raises(ValueError, match="was ingested already"):
        gen.ingest([{**c, "f": 1.0}, {**c, "f": 1.0}])
    assert not opt.is_told(c["_id"])
    with pytest.raises(ValueError, match="missing"):
        gen.ingest([{"f": 1.0}])


@pytest.mark.parametrize("vocs, match", [
    (VOCS(variables={"x": [0.0, 1.0]}, objectives={"f": "MINIMIZE"}, constraints={"c1": ["LESS_THAN", 0.0]}),
     "constraint 'c1': qbatch optimizes without constraints"),
    (VOCS(variables={"x": [0.0, 1.0]}, objectives={"f": "MINIMIZE", "g": "MAXIMIZE"}), "one objective"),
    (VOCS(variables={"x": [0.0, 1.0]}, objectives={"f": "EXPLORE"}), "objective 'f': .*ExploreObjective"),
    (VOCS(variables={"x": [0.0, 1.0]}), "one objective"),
    (VOCS(variables={"x": [0.0, 1.0], "t": "CONTEXTUAL"}, objectives={"f": "MINIMIZE"}), "variable 't'"),
    (VOCS(variables={"x": {"type": "ContinuousVariable", "domain": [0.0, 1.0], "dtype": "(3,)"}},
          objectives={"f": "MINIMIZE"}), "variable 'x'.*dtype"),
])
def test_a_vocs_qbatch_cannot_optimize_is_refused_by_name(vocs, match):
    with pytest.raises(ValueError, match=match):
        QbatchGenerator(vocs)


def test_discrete_values_come_in_sorted_order_and_an_optimizer_given_must_fit_the_vocs():
    from orchestrator.ask_tell import AskTellOptimizer

    vocs = VOCS(variables={"n": {3, 1, 2}, "x": [0.0, 2.0]}, objectives={"f": "MINIMIZE"})
    assert space_from_vocs(vocs) == {"n": {"type": "choice", "choices": [1, 2, 3]},
                                     "x": {"type": "float", "low": 0.0, "high": 2.0}}
    opt = AskTellOptimizer(space_from_vocs(vocs), direction="minimize")
    assert QbatchGenerator(vocs, optimizer=opt).optimizer is opt
    with pytest.raises(ValueError, match="not the VOCS's variables"):
        QbatchGenerator(vocs, optimizer=AskTellOptimizer(space_from_vocs(vocs), direction="maximize"))
    with pytest.raises(ValueError, match="`direction` is the VOCS objective's"):
        QbatchGenerator(vocs, direction="maximize")
