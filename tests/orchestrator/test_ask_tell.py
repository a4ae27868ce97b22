"""Library ask/tell: user names and types, partial and out-of-order tells, failures kept
away from the model, pending points handed to the proposer, direction at the edge, errors naming the input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import orchestrator.acquisition as acquisition
import orchestrator.models as models
from orchestrator.acquisition.base import Proposer
from orchestrator.ask_tell import AskTellOptimizer, TrialError
from orchestrator.errors import ConfigError, QbatchError, SpaceError

SPACE = {
    "lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
    "width": {"type": "int", "low": 8, "high": 64, "step": 8},
    "act": {"type": "choice", "choices": ["relu", "tanh"]},
    "drop": {"type": "float", "low": 0.0, "high": 0.5},
}
SMALL = {"a": {"type": "float", "low": -1.0, "high": 1.0}, "b": {"type": "float", "low": 0.0, "high": 2.0}}


def f_true(p):
    return -((p["a"] - 0.3) ** 2) - (p["b"] - 1.0) ** 2


def test_ask_returns_user_names_and_types():
    opt = AskTellOptimizer(SPACE, initial_design=8, seed=3)
    trials = opt.ask(8)
    assert len(trials) == 8 and len({t.trial_id for t in trials}) == 8
    for t in trials:
        assert list(t.params) == list(SPACE)
        assert isinstance(t.params["lr"], float) and 1e-4 <= t.params["lr"] <= 1e-1
        assert isinstance(t.params["width"], int) and t.params["width"] % 8 == 0
        assert t.params["act"] in ("relu", "tanh")
        assert t.x.shape == (4,) and t.x.dtype == torch.float64
        assert t.source == "sobol" and t.forecast is None
        opt.space.validate(t.params)
    assert opt.num_pending == 8
    # same seed -> same design; the Sobol design continues rather than repeats
    again = AskTellOptimizer(SPACE, initial_design=8, seed=3).ask(8)
    assert [t.params for t in again] == [t.params for t in trials]
    more = opt.ask(2)
    assert {t.trial_id for t in more}.isdisjoint({t.trial_id for t in trials})


@pytest.mark.parametrize("q", [0, -1, 1.5, True, "3"])
def test_bad_q_is_named(q):
    opt = AskTellOptimizer(SMALL)
    with pytest.raises(TrialError, match=f"q must be an integer >= 1; got {q!r}"):
        opt.ask(q)


def test_bad_trial_ids_and_double_tell_are_named():
    opt = AskTellOptimizer(SMALL, initial_design=3)
    t = opt.ask(2)
    with pytest.raises(TrialError, match="unknown trial id 'nope'"):
        opt.tell("nope", 1.0)
    with pytest.raises(TrialError, match="unknown trial id 7"):
        opt.tell(7, 1.0)
    opt.tell(t[0].trial_id, 1.0)
    with pytest.raises(TrialError, match=f"trial '{t[0].trial_id}' was already told \\(completed\\)"):
        opt.tell(t[0].trial_id, 2.0)
    assert isinstance(TrialError("x"), QbatchError)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"tau": 1.5}, r"`tau` must be a number in \(0, 1\); got 1.5"),
        ({"direction": "up"}, "`direction` must be 'maximize' or 'minimize'; got 'up'"),
        ({"initial_design": 0}, "`initial_design` must be an integer >= 1; got 0"),
    ],
)
def test_bad_options_are_named(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        AskTellOptimizer(SMALL, **kwargs)


def test_partial_and_out_of_order_tells():
    opt = AskTellOptimizer(SMALL, initial_design=6)
    trials = opt.ask(6)
    order = [4, 1, 5]
    for i in order:
        assert opt.tell(trials[i].trial_id, f_true(trials[i].params)) == "completed"
    assert [t.trial_id for t in opt.pending()] == [trials[i].trial_id for i in (0, 2, 3)]
    X, Y = opt.observations()  # in the order the trials were asked, not the order they were told
    assert torch.equal(X, torch.stack([trials[i].x for i in sorted(order)]))
    assert Y.tolist() == [f_true(trials[i].params) for i in sorted(order)]
    opt.tell_many([trials[3].trial_id, trials[0].trial_id], [1.0, 2.0])
    assert opt.num_completed == 5 and opt.num_pending == 1
    assert opt.observations()[1].tolist() == [2.0, f_true(trials[1].params), 1.0, f_true(trials[4].params),
                                              f_true(trials[5].params)]


def test_hostile_values_become_failures_that_never_reach_the_observations():
    opt = AskTellOptimizer(SMALL, initial_design=9)
    trials = opt.ask(9)
    bad = [float("nan"), float("inf"), -float("inf"), None, "1.0", np.array([1.0, 2.0]), 10**400]
    for t, v in zip(trials, bad):
        assert opt.tell(t.trial_id, v) == "failed"
    assert opt.tell(trials[7].trial_id, 5.0, error="timeout") == "failed"
    assert opt.tell(trials[8].trial_id, np.float32(0.25)) == "completed"
    assert [f["error"] for f in opt.failures] == [
        "nan",
        "inf",
        "inf",
        "none",
        "non-numeric",
        "array",
        "inf",
        "timeout",
    ]
    X, Y = opt.observations()
    assert Y.tolist() == [0.25] and X.shape == (1, 2)
    assert opt.num_pending == 0


def test_a_number_type_whose_conversion_raises_is_a_failure_not_an_exception():
    """`tell` classifies the value itself (no worker around it in library use): a float subclass whose
    `__float__` raises is a recorded 'non-numeric' failure, naming the error."""

    class BadFloat(float):
        def __float__(self):
            raise RuntimeError("cannot convert")

    opt = AskTellOptimizer(SMALL, initial_design=2)
    t = opt.ask(1)[0]
    assert opt.tell(t.trial_id, BadFloat(1.0)) == "failed"
    assert (
        opt.failures[-1]["error"] == "non-numeric"
        and "RuntimeError: cannot convert" in opt.failures[-1]["message"]
    )


def test_minimize_negates_at_the_edge():
    opt = AskTellOptimizer(SMALL, direction="minimize", tau=0.2, initial_design=4)
    assert opt.model_tau == pytest.approx(0.8)
    trials = opt.ask(3)
    for t, v in zip(trials, [3.0, -1.0, 2.0]):
        opt.tell(t.trial_id, v)
    _, Y = opt.observations()
    assert Y.tolist() == [-3.0, 1.0, -2.0]
    params, value = opt.best()
    assert value == -1.0 and params == trials[1].params


def test_best_without_results_is_an_error():
    with pytest.raises(QbatchError, match="no completed results yet"):
        AskTellOptimizer(SMALL).best()


def test_snapped_duplicates_are_replaced_until_the_space_is_exhausted():
    space = {"k": {"type": "int", "low": 0, "high": 3}, "c": {"type": "choice", "choices": ["a", "b"]}}
    opt = AskTellOptimizer(space, initial_design=100, seed=1)
    trials = opt.ask(8)  # the space has exactly 8 points: all distinct
    assert len({(t.params["k"], t.params["c"]) for t in trials}) == 8
    extra = opt.ask(3)  # exhausted: repeats are allowed (noisy objective) rather than failing
    assert len(extra) == 3
    for t in extra:
        opt.space.validate(t.params)


def test_a_batch_that_fills_a_grid_takes_its_last_free_cells():
    """`ask` gives no repeats while cells are left, also on a nearly full grid: replacing a duplicate by one
    of 64 random grid points only rarely hits the last free cells (991 distinct of 1,000 here; 1,148 of 1,200
    on the log-int x choice grid)."""
    for space, q in [({"k": {"type": "int", "low": 0, "high": 999}}, 1000),
                     ({"k": {"type": "int", "low": 1, "high": 400, "log": True},
                       "c": {"type": "choice", "choices": ["a", "b", "c"]}}, 1200)]:
        opt = AskTellOptimizer(space, initial_design=5000, seed=1)
        trials = opt.ask(q)  # as many points as the grid holds
        assert len({tuple(t.params.values()) for t in trials}) == q


def test_the_grid_cells_are_every_point_of_the_space_as_ask_snaps_them():
    """`_grid_cells` (the free-cell listing of `_dedupe`) takes the product of per-parameter coordinates; it
    must equal mapping each point of the grid, as `ask` snaps a proposal (steps, log ints, unhashable
    choices)."""
    import itertools

    space = {
        "k": {"type": "int", "low": 5, "high": 30, "step": 5},
        "j": {"type": "int", "low": 1, "high": 40, "log": True},
        "c": {"type": "choice", "choices": [[1], {"a": 1}, None, "s"]},
    }
    opt = AskTellOptimizer(space, seed=0)
    values = [range(5, 31, 5), range(1, 41), [[1], {"a": 1}, None, "s"]]
    points = [dict(zip(["k", "j", "c"], combo)) for combo in itertools.product(*values)]
    cells = opt._grid_cells()
    assert cells.shape == (6 * 40 * 4, 3)
    assert torch.equal(cells, opt.space.to_unit(points, dtype=torch.float64))
    assert torch.equal(opt.space.snap(cells), cells)


def test_a_discrete_model_batch_never_repeats_an_observed_point():
    """Thompson points avoid observed points in the unit cube, and snapping onto an int/choice grid must not
    put them back on observed ones (a second model batch repeating (relu, layers=5) with 21 of the 32 points
    unseen): `ask` promises points that are neither pending nor observed while any are left."""
    space = {"layers": {"type": "int", "low": 1, "high": 8},
             "act": {"type": "choice", "choices": ["relu", "tanh", "gelu", "silu"]}}
    opt = AskTellOptimizer(space, tau=0.5, initial_design=4, seed=0, model_options=_fast_model(),
                           proposer_options=FAST_TS)
    seen, sources = set(), []
    for _ in range(5):
        batch = opt.ask(4)
        keys = [(t.params["layers"], t.params["act"]) for t in batch]
        assert not seen & set(keys) and len(set(keys)) == 4
        for t, k in zip(batch, keys):
            opt.tell(t.trial_id, -(k[0] - 5) ** 2 - ["relu", "tanh", "gelu", "silu"].index(k[1]))
            seen.add(k)
            sources.append(t.source)
    assert sources.count("model") == 16


def test_tell_point_keeps_each_parameter_in_its_own_type():
    """`tell_point({"layers": 2.0, ...})` keeps the int 2, and `best()` recommends layers=2, not 2.0."""
    space = {
        "layers": {"type": "int", "low": 1, "high": 8},
        "lr": {"type": "float", "low": 1e-4, "high": 1.0, "log": True},
        "act": {"type": "choice", "choices": ["relu", "tanh"]},
    }
    opt = AskTellOptimizer(space)
    opt.tell_point({"layers": 2.0, "lr": 1, "act": "tanh"}, 1.0)
    params, _ = opt.best()
    assert params == {"layers": 2, "lr": 1.0, "act": "tanh"}
    assert type(params["layers"]) is int and type(params["lr"]) is float


def test_tell_point_validates_and_records():
    opt = AskTellOptimizer(SMALL)
    assert opt.tell_point({"a": 0.1, "b": 1.0}, 2.0) == "completed"
    with pytest.raises(SpaceError, match="'a'=5.0 is outside"):
        opt.tell_point({"a": 5.0, "b": 1.0}, 2.0)
    assert opt.tell_point({"a": 0.2, "b": 1.0}, float("nan")) == "failed"
    assert opt.num_completed == 1 and opt.best()[1] == 2.0


def test_state_round_trip_sobol_phase():
    opt = AskTellOptimizer(SMALL, initial_design=6, seed=5)
    trials = opt.ask(4)
    opt.tell(trials[2].trial_id, 1.5)
    opt.tell(trials[0].trial_id, float("nan"))
    state = opt.get_state()
    twin = AskTellOptimizer(SMALL, initial_design=6, seed=5)
    twin.set_state(state)
    assert [t.trial_id for t in twin.pending()] == [trials[1].trial_id, trials[3].trial_id]
    assert twin.observations()[1].tolist() == [1.5] and twin.failures == opt.failures
    assert [t.params for t in twin.ask(2)] == [t.params for t in opt.ask(2)]
    torch.save(state, "/dev/null")  # plain values and tensors only


# ----------------------------------------------------------------------------- with the real model
class SpyProposer(Proposer):
    """A real proposer (random points) that records what the optimizer hands it."""

    calls: list = []

    def __init__(self) -> None:
        pass

    def _propose(self, model, q, X_pending, X_observed, generator):
        SpyProposer.calls.append((q, X_pending.clone(), X_observed.clone()))
        return torch.rand(q, X_observed.shape[-1], generator=generator, dtype=torch.float64)


class RepeatingProposer(Proposer):
    """A user's model-free proposer that hands back the centre of the cube q times."""

    requires_model = False

    def __init__(self) -> None:
        pass

    def _propose(self, model, q, X_pending, X_observed, generator):
        return torch.full((q, X_observed.shape[-1]), 0.5, dtype=torch.float32)


def test_a_proposer_that_repeats_points_in_a_float_space_still_gives_distinct_trials(monkeypatch):
    """The proposer base class refuses repeats and `ask` checks proposers in float spaces too: a user's
    proposer handing out the same point q times, and an observed one, does not get them through."""
    monkeypatch.setitem(acquisition.PROPOSERS, "repeating", f"{__name__}:RepeatingProposer")
    opt = AskTellOptimizer(SMALL, initial_design=2, proposer="repeating", seed=0)
    opt.tell_point({"a": 0.0, "b": 1.0}, 0.0)  # the cube's centre, observed
    opt.tell_point({"a": 0.5, "b": 0.5}, 0.0)
    trials = opt.ask(5)
    points = {(t.params["a"], t.params["b"]) for t in trials}
    assert len(points) == 5 and (0.0, 1.0) not in points
    assert [t.source for t in trials] == ["model"] * 5
    # the base class hands float64 on, whatever the proposer computed in (its docstring says so)
    X = RepeatingProposer().propose(None, 3, X_observed=torch.zeros(1, 2), dim=2)
    assert X.dtype == torch.float64


@pytest.fixture
def spy_model(monkeypatch):
    """The real `build_model`, with every fit's training data recorded."""
    fits = []
    real = models.build_model

    def build(name, **kw):
        model = real(name, **kw)
        fit = model.fit

        def recording_fit(X, Y):
            fits.append((X.clone(), Y.clone()))
            return fit(X, Y)

        model.fit = recording_fit
        return model

    monkeypatch.setattr(models, "build_model", build)
    return fits


def _fast_model():
    """Small quantile SVGP options so a fit is quick on a busy 2-core machine."""
    return {"num_inducing": 16, "max_steps": 60, "warm_max_steps": 20}


#: small Thompson-sampling settings for the same reason (the proposer has its own tests)
FAST_TS = {"num_features": 128, "raw_samples": 128, "num_restarts": 1, "maxiter": 20}


def test_model_phase_pending_points_reach_the_proposer_and_failures_do_not_reach_the_model(
    spy_model, monkeypatch
):
    monkeypatch.setitem(acquisition.PROPOSERS, "spy", f"{__name__}:SpyProposer")
    SpyProposer.calls = []
    opt = AskTellOptimizer(SMALL, initial_design=8, proposer="spy", seed=0, model_options=_fast_model())
    first = opt.ask(12)
    values = [f_true(t.params) for t in first]
    values[3] = float("nan")
    values[7] = float("inf")
    for t, v in zip(first[:11], values[:11]):  # first[11] stays pending
        opt.tell(t.trial_id, v)
    batch = opt.ask(4)
    assert all(t.source == "model" for t in batch)
    (X, Y), = spy_model
    assert Y.shape == (9,) and torch.isfinite(Y).all()
    q, X_pending, X_observed = SpyProposer.calls[-1]
    assert q == 4
    assert torch.equal(X_pending, first[11].x.reshape(1, -1))
    assert X_observed.shape == (9, 2)
    for t in batch:  # each model point carries the forecast made at proposal time
        assert set(t.forecast) >= {"family", "tau", "mu_f", "var_f", "mu_g", "var_g"}
        assert math.isfinite(t.forecast["mu_f"]) and t.forecast["tau"] == pytest.approx(0.5)
    # the next proposal counts the new batch as pending too
    opt.ask(2, fit=False)
    assert SpyProposer.calls[-1][1].shape == (5, 2)


def test_thompson_loop_minimize_calibrator_and_best_in_user_units():
    opt = AskTellOptimizer(
        SMALL,
        direction="minimize",
        tau=0.3,
        initial_design=10,
        seed=1,
        calibrator="online",
        model_options=_fast_model(),
        proposer_options=FAST_TS,
    )
    rng = np.random.default_rng(0)
    first = opt.ask(10)
    for t in reversed(first):
        opt.tell(t.trial_id, -f_true(t.params) + 0.05 * rng.standard_normal())
    assert opt.calibrator.num_updates == 0  # Sobol points carry no forecast
    batch = opt.ask(6)
    assert all(t.source == "model" and t.forecast["tau"] == pytest.approx(0.7) for t in batch)  # 1 - tau
    for t in batch[::-1]:
        opt.tell(t.trial_id, -f_true(t.params) + 0.05 * rng.standard_normal())
    assert opt.calibrator.num_updates == 0  # queued: learned at the next ask or fit, in ask order
    assert opt.flush_calibration() == 6
    assert opt.calibrator.num_updates == 6  # each with the forecast recorded at proposal time
    diag = opt.fit()
    assert diag["n"] == 16 and diag["seconds"] > 0
    params, value = opt.best()
    assert value == pytest.approx(diag["best_predicted"])
    assert -0.2 < value < 1.0  # predicted 0.3-quantile of the minimized outcome, user units (minimum is 0)
    opt.space.validate(params)


def test_the_order_results_come_in_does_not_change_the_fit_or_the_next_batch():
    """A synchronous run is reproducible from its config and seed: completion order within a batch (set by
    the workers' timing) must not reach the model, whose minibatches and k-means inducing points see the
    data's order; nor may a state round trip reorder the observations."""

    def make():
        opt = AskTellOptimizer(SMALL, tau=0.3, initial_design=8, seed=2, calibrator="online",
                               model_options=_fast_model(), proposer_options=FAST_TS)
        # the default (off, a library loop's calibrator would learn each result in the order told)
        assert opt.defer_calibration
        return opt

    def run(order):
        opt = make()
        rng = np.random.default_rng(0)
        for _ in range(3):
            batch = opt.ask(8)
            values = [f_true(t.params) + 0.1 * rng.standard_normal() for t in batch]
            for i in order:
                opt.tell(batch[i].trial_id, values[i])
        twin = make()
        twin.set_state(opt.get_state())
        return opt.observations(), [t.x for t in opt.ask(4)], opt.calibrator.get_state(), twin.observations()

    # calibrator updates told but not yet applied survive a state round trip
    opt = make()
    batch = opt.ask(8)
    for t in batch:
        opt.tell(t.trial_id, f_true(t.params))
    opt.fit()
    for t in opt.ask(4):
        opt.tell(t.trial_id, f_true(t.params))
    twin = make()
    twin.set_state(opt.get_state())
    assert twin.flush_calibration() == opt.flush_calibration() == 4
    assert repr(twin.calibrator.get_state()) == repr(opt.calibrator.get_state())
    # and so does the record of what it learned (the central actor's calibrator checkpoint)
    assert twin.num_calibrated == opt.num_calibrated == 4
    assert twin.calibrator_checkpoint()["taught"] == opt.calibrator_checkpoint()["taught"]

    (X0, Y0), next0, cal0, (Xt, Yt) = run(list(range(8)))
    (X1, Y1), next1, cal1, _ = run([3, 0, 7, 5, 1, 6, 2, 4])
    assert torch.equal(X0, X1) and torch.equal(Y0, Y1)
    assert torch.equal(torch.stack(next0), torch.stack(next1))
    assert cal0["num_updates"] == cal1["num_updates"] == 16  # two model batches carry forecasts
    assert repr(cal0) == repr(cal1)  # the calibrator learned the same from either order
    assert torch.equal(Xt, X0) and torch.equal(Yt, Y0)


def test_model_free_proposer_never_fits_and_proposes_after_the_design():
    """Random search after the initial design: no surrogate is ever built or fitted for it."""
    opt = AskTellOptimizer(SMALL, proposer="random", initial_design=4, seed=2)
    for t in opt.ask(4):
        opt.tell(t.trial_id, f_true(t.params))
    assert not opt.can_fit()
    trials = opt.ask(6)
    assert opt.model is None and [t.source for t in trials] == ["model"] * 6
    assert all(t.forecast is None for t in trials)
    for t in trials:
        opt.space.validate(t.params)
    sobol_next = AskTellOptimizer(SMALL, initial_design=4, seed=2)
    sobol_next.ask(4)
    assert [t.params for t in trials] != [t.params for t in sobol_next.ask(6)]  # not the Sobol continuation


def test_proposer_that_repeats_on_purpose_is_not_deduplicated():
    """GPR-EI (spec §4.4) evaluates one point r times; ask must keep those replicates."""
    space = {"k": {"type": "int", "low": 0, "high": 50}, "a": {"type": "float", "low": 0.0, "high": 1.0}}
    opt = AskTellOptimizer(space, model="gpr-replicates", proposer="gpr-ei", initial_design=6, seed=0,
                           tau=0.5)
    rng = np.random.default_rng(0)
    for _ in range(2):
        for t in opt.ask(6):
            opt.tell(t.trial_id, -((t.params["k"] - 20) ** 2) / 100 + 0.1 * rng.standard_normal())
    trials = opt.ask(4)
    keys = {(t.params["k"], round(t.params["a"], 9)) for t in trials}
    assert [t.source for t in trials] == ["model"] * 4 and len(keys) == 1, keys


@pytest.mark.parametrize("proposer,model", [("gpr-ei", "gpr-replicates"), ("qlognei", "exact-gp")])
def test_a_point_whose_evaluations_failed_is_not_proposed_again(proposer, model):
    """Failed trials count as taken, so a proposer whose model never sees a failure does not propose the same
    failing point again and again (GPR-EI: 7 batches in a row at (0.97, 1.0), 28 evaluations, never ending;
    qLogNEI: (1, 1) in 4 batches). GPR-EI's replicates go to a new point."""
    space = {"x": {"type": "float", "low": 0.0, "high": 1.0}, "y": {"type": "float", "low": 0.0, "high": 1.0}}
    opt = AskTellOptimizer(space, model=model, proposer=proposer, tau=0.5, initial_design=12, seed=0,
                           proposer_options={"num_restarts": 2, "raw_samples": 64})
    rng = np.random.default_rng(0)
    failed: set[tuple[float, float]] = set()

    def evaluate(trials):
        keys = [(round(t.params["x"], 9), round(t.params["y"], 9)) for t in trials]
        for t, key in zip(trials, keys):
            if t.source == "model":
                assert key not in failed, f"batch {t.batch_id} proposed {key}, which failed before"
        for t, key in zip(trials, keys):
            if t.params["x"] > 0.8 and t.params["y"] > 0.8:  # the objective raises in this corner
                opt.tell(t.trial_id, None, error="exception", message="crash")
                failed.add(key)
            else:
                opt.tell(t.trial_id, t.params["x"] + t.params["y"] + 0.1 * rng.standard_normal())

    evaluate(opt.ask(12))
    for _ in range(6):
        evaluate(opt.ask(4))
    assert failed  # the proposer did go for the failing corner, and each failing point was tried once


def _forrester(x: float) -> float:
    return (6 * x - 2) ** 2 * math.sin(12 * x - 4)


def _put_in_the_noise_basin(opt: AskTellOptimizer) -> None:
    """Hyperparameters that explain every point as noise (a long lengthscale, the noise at the data's
    variance): what a fit on the first few points of a run can find, and where a warm-started L-BFGS stays."""
    m = opt._model.model
    with torch.no_grad():
        # no outputscale (BoTorch's default kernel); its lengthscale prior pulls a fit away from 30 (the basin
        # before the priors), not from 1e4, where the prior's gradient vanishes too
        m.covar_module.lengthscale = torch.tensor([[1e4]], dtype=torch.float64)
        m.likelihood.noise = torch.tensor([0.9999], dtype=torch.float64)


def test_fit_with_restart_leaves_a_basin_the_warm_start_stays_in():
    """`fit(restart=True)` (the end of a run) also fits from scratch and keeps the lower loss. A warm-started
    refit can stay in a noise basin and recommend x = 0.01 on Forrester, whose minimum is at 0.757 (a run's
    final recommendation comes from the end-of-run fit)."""
    opt = AskTellOptimizer({"x": {"type": "float", "low": 0.0, "high": 1.0}}, model="exact-gp",
                           direction="minimize", initial_design=40, seed=0)
    for t in opt.ask(40):
        opt.tell(t.trial_id, _forrester(t.params["x"]))
    first = opt.fit()
    assert abs(first["best_params"]["x"] - 0.757) < 0.02
    _put_in_the_noise_basin(opt)
    warm = opt.fit(restart=False)
    assert abs(warm["best_params"]["x"] - 0.757) > 0.2, ("the warm start left the basin: the test shows "
                                                         "nothing")
    _put_in_the_noise_basin(opt)
    out = opt.fit(restart=True)
    assert out["restart_kept"] == "cold" and out["loss_cold"] < out["loss_warm"] - 1.0
    assert out["loss"] == out["loss_cold"]
    assert abs(out["best_params"]["x"] - 0.757) < 0.02 and out["best_predicted"] < -5.9
    assert opt.best()[0] == out["best_params"]
    # a good warm fit is kept: the restart only replaces a worse one
    again = opt.fit(restart=True)
    assert again["restart_kept"] == "warm" and again["loss_warm"] <= again["loss_cold"] + 1e-9


def test_fit_with_restart_compares_full_data_elbos_of_the_svgp():
    """On the quantile SVGP the two fits are compared by the full-data ELBO (its fit reports a minibatch
    average of the last epoch): both losses finite and the kept one is the lower."""
    opt = AskTellOptimizer(SMALL, model="quantile", tau=0.3, initial_design=30, seed=1,
                           model_options={"num_inducing": 16, "max_steps": 300, "warm_max_steps": 20})
    rng = np.random.default_rng(0)
    for t in opt.ask(30):
        opt.tell(t.trial_id, f_true(t.params) + 0.1 * rng.standard_normal())
    opt.fit()
    for t in opt.ask(10):
        opt.tell(t.trial_id, f_true(t.params) + 0.1 * rng.standard_normal())
    out = opt.fit(restart=True)
    assert math.isfinite(out["loss_warm"]) and math.isfinite(out["loss_cold"])
    assert out["restart_kept"] == ("warm" if out["loss_warm"] <= out["loss_cold"] else "cold")
    X, Y = opt.observations()
    assert -opt._model.elbo(X, Y) == pytest.approx(min(out["loss_warm"], out["loss_cold"]))


def test_a_fit_that_is_not_finite_is_refused_and_the_model_kept(monkeypatch):
    """An objective returning 1e200 (finite, so a valid result) makes the standardization overflow: such a fit
    raises ModelFitError (a refit failure for the actor) and the model in use stays, rather than "succeeding"
    with a NaN posterior that proposes points and recommends nan."""
    from orchestrator.errors import ModelFitError

    opt = AskTellOptimizer(SMALL, initial_design=8, seed=0, model_options=_fast_model())
    trials = opt.ask(8)
    for i, t in enumerate(trials):
        opt.tell(t.trial_id, float(i))
    opt.fit()
    model, best = opt.model, opt.best()
    t = opt.ask(1, fit=False)[0]
    opt.tell(t.trial_id, 1e200)
    with pytest.raises(ModelFitError, match=r"span \[0, 1e\+200\], too wide"):
        opt.fit()
    assert opt.model is model and opt.best() == best
    # a posterior that comes out NaN for another reason is refused the same way
    opt2 = AskTellOptimizer(SMALL, initial_design=8, seed=0, model_options=_fast_model())
    for i, t in enumerate(opt2.ask(8)):
        opt2.tell(t.trial_id, float(i))
    monkeypatch.setattr(type(model), "objective_mean", lambda self, X: torch.full((X.shape[0],), math.nan))
    with pytest.raises(ModelFitError, match="posterior mean not finite at 8 of 8 observed points"):
        opt2.fit()
    assert opt2.model is None


# ------------------------------------------------------------------ the library API
def test_prior_results_count_toward_the_initial_design():
    """200 results added with `tell_point` (an Optuna-style warm start) still got a whole first batch of
    Sobol."""
    opt = AskTellOptimizer(SMALL, tau=0.5, initial_design=10, seed=0, model_options=_fast_model(),
                           proposer_options=FAST_TS)
    rng = np.random.default_rng(0)
    for _ in range(6):
        p = {"a": float(rng.uniform(-1, 1)), "b": float(rng.uniform(0, 2))}
        opt.tell_point(p, f_true(p))
    opt.tell_point({"a": 0.0, "b": 1.0}, float("nan"))  # a failed prior result is no design point
    assert {t.source for t in opt.ask(4)} == {"sobol"}  # 6 + 4 = 10 design points
    for t in opt.pending():
        opt.tell(t.trial_id, f_true(t.params))
    assert {t.source for t in opt.ask(4)} == {"model"}
    twin = AskTellOptimizer(SMALL, tau=0.5, initial_design=10, seed=0, model_options=_fast_model(),
                            proposer_options=FAST_TS)
    twin.set_state(opt.get_state())
    assert twin._design_left() == opt._design_left() == 0


def test_best_is_a_point_as_told_and_trials_handed_out_are_copies():
    """`best()` mapped the point back from its unit coordinates (lr 0.0010000000000000002 for a told 0.001),
    and `ask` handed out the optimizer's own records, so editing a trial's params rewrote history."""
    opt = AskTellOptimizer(SPACE, tau=0.5, initial_design=4, seed=1, model_options=_fast_model(),
                           proposer_options=FAST_TS)
    told = [
        {"lr": 1e-3, "width": 16, "act": "tanh", "drop": 0.1},
        {"lr": 3e-2, "width": 64, "act": "relu", "drop": 0.3},
        {"lr": 2e-4, "width": 8, "act": "relu", "drop": 0.0},
        {"lr": 7e-3, "width": 32, "act": "tanh", "drop": 0.45},
    ]
    for i, p in enumerate(told):
        opt.tell_point(p, float(i == 0))
    opt.fit()
    assert opt.best()[0] in told
    trial = opt.ask(1)[0]
    trial.params["lr"] = 99.0  # a training script editing its config
    assert opt.pending()[0].params["lr"] != 99.0 and opt.trial(trial.trial_id).params["lr"] != 99.0
    opt.pending()[0].params["width"] = -1
    assert opt.trial(trial.trial_id).params["width"] != -1


def test_tell_many_tells_nothing_when_one_id_is_bad():
    """A typo in the middle left the first results told, and the corrected call then failed on them."""
    opt = AskTellOptimizer(SMALL, tau=0.5, initial_design=4, seed=0)
    ids = [t.trial_id for t in opt.ask(3)]
    for bad in ([ids[0], "typo", ids[2]], [ids[0], ids[1], ids[0]]):
        with pytest.raises(TrialError, match="nothing was told"):
            opt.tell_many(bad, [1.0, 2.0, 3.0])
        assert opt.num_pending == 3 and opt.num_completed == 0
    assert opt.tell_many(ids, [1.0, 2.0, 3.0]) == ["completed"] * 3


@pytest.mark.parametrize(
    "other",
    [
        {"direction": "minimize"},
        {"tau": 0.9},
        {"space": {"a": {"type": "float", "low": 0.0, "high": 100.0}, "b": SMALL["b"]}},
        {"model": "expectile"},
        {"model_options": {"num_inducing": 8}},
    ],
)
def test_a_state_of_an_optimizer_set_up_otherwise_is_refused(other):
    """A state is refused by an optimizer it does not fit: a minimize state loaded into a maximize optimizer
    would flip the sign of every value, one of another space relabel its points, one at tau 0.1 keep proposing
    at 0.1 in a tau 0.9 optimizer."""
    base = {"space": SMALL, "tau": 0.3, "initial_design": 4, "seed": 0, "model_options": _fast_model()}
    opt = AskTellOptimizer(**base)
    for t in opt.ask(4):
        opt.tell(t.trial_id, f_true(t.params))
    state = opt.get_state()
    kwargs = {**base, **other}
    space = kwargs.pop("space")
    with pytest.raises(QbatchError, match=f"the state was saved by an optimizer with {next(iter(other))}="):
        AskTellOptimizer(space, **kwargs).set_state(state)
    same = AskTellOptimizer(SMALL, **{k: v for k, v in base.items() if k != "space"})
    same.set_state(state)
    assert same.best_observed() == opt.best_observed()
    legacy = {k: v for k, v in state.items() if k != "settings"}  # saved before the settings were recorded
    AskTellOptimizer(space, **kwargs).set_state(legacy)


def test_numpy_integers_are_integers():
    """`ask(np.int64(2))`, `initial_design=np.int64(5)` and `seed=np.int64(1)` are taken, as the config takes
    numpy integers."""
    opt = AskTellOptimizer(SMALL, tau=0.5, initial_design=np.int64(5), seed=np.int64(1))
    assert len(opt.ask(np.int64(2))) == 2 and opt.initial_design == 5 and type(opt.seed) is int
    with pytest.raises(TrialError, match="q must be an integer >= 1; got 2.0"):
        opt.ask(2.0)


@pytest.mark.parametrize("model, proposer, calibrator", [("quantile", "thompson", "none"),
                                                         ("exact-gp", "calibrated", "conformal"),
                                                         ("exact-gp", "calibrated", "offline-cv")])
def test_a_fitted_optimizer_pickles_and_deep_copies(model, proposer, calibrator):
    """Library use: `pickle.dumps` and `copy.deepcopy` of an optimizer work (its locks and the quantile SVGP's
    cached KL factors, non-leaf tensors of the last ELBO's graph, are left out), so it can be `ray.put`,
    passed to an actor or cached. A copy asks what the original asks and has locks of its own."""
    import copy
    import pickle

    space = {"x": {"type": "float", "low": 0.0, "high": 1.0}, "y": {"type": "float", "low": 0.0, "high": 1.0}}
    opt = AskTellOptimizer(space, model=model, proposer=proposer, calibrator=calibrator, tau=0.3,
                           initial_design=6, seed=0)
    rng = np.random.default_rng(0)
    for _ in range(2):
        for t in opt.ask(6):
            opt.tell(t.trial_id, float(np.sin(6 * t.params["x"]) + t.params["y"] + rng.normal(0, 0.1)))
    opt.fit()
    clones = [pickle.loads(pickle.dumps(opt)), copy.deepcopy(opt)]
    asked = [t.params for t in opt.ask(3)]
    for clone in clones:
        assert clone._lock is not opt._lock and clone._ask_lock is not opt._ask_lock
        assert [t.params for t in clone.ask(3)] == asked


def test_a_fit_that_learned_no_lengthscale_warns_once():
    """With the spec's prior (mode 0.074) in 20 dimensions the points are too far apart for the kernel to
    correlate them; the prior alone sets every lengthscale and the model is flat (posterior-mean correlation
    with the truth 0.03, 0.998 with the dimension-scaled prior): the user gets a warning."""
    import warnings

    from orchestrator.errors import ModelWarning

    def fitted(d):
        space = {f"x{i}": {"type": "float", "low": 0.0, "high": 1.0} for i in range(d)}
        opt = AskTellOptimizer(space, initial_design=100, seed=0,
                               model_options={"num_inducing": 32, "lengthscale_prior": "spec"})
        gen = torch.Generator().manual_seed(0)
        for t in opt.ask(100):
            x = torch.tensor([t.params[f"x{i}"] for i in range(3)])
            opt.tell(t.trial_id, float(-5 * ((x - 0.3) ** 2).sum() + 0.1 * torch.randn((), generator=gen)))
        return opt

    for d, flat in [(20, True), (3, False)]:
        opt = fitted(d)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            diag = opt.fit()
            again = opt.fit()  # a warm refit: no second warning
        said = [str(w.message) for w in caught if issubclass(w.category, ModelWarning)]
        assert diag["lengthscales_at_prior_mode"] == float(flat) == again["lengthscales_at_prior_mode"]
        if flat:
            assert len(said) == 1 and "all 20 lengthscales" in said[0] and ("lengthscale_prior: "
                                                                            "dim-scaled") in said[0]
        else:
            assert said == []


def test_an_optimizer_pickled_before_the_prior_mode_warning_still_fits():
    """`__setstate__` of a pickle without `_warned_prior_mode` sets it, so `fit` does not raise AttributeError
    the first time a fit ends at the prior's mode."""
    opt = AskTellOptimizer(SMALL, seed=0)
    state = opt.__getstate__()
    del state["_warned_prior_mode"]
    old = AskTellOptimizer.__new__(AskTellOptimizer)
    old.__setstate__(state)
    assert old._warned_prior_mode is False


def test_the_sobol_proposer_continues_the_initial_designs_sequence():
    """Without a `seed` option the optimizer's seed continues the design's sequence: a sequence scrambled
    afresh for each batch makes batches of 1-4 no more even than random points (centred L2 discrepancy 3.1e-3
    at q = 1, random 2.9e-3, one sequence 4.2e-5)."""
    space = {"a": {"type": "float", "low": 0.0, "high": 1.0}, "b": {"type": "float", "low": 0.0, "high": 1.0}}
    opt = AskTellOptimizer(space, proposer="sobol", initial_design=8, seed=5)
    X = []
    for q in (8, 2, 2, 4):
        for t in opt.ask(q):
            X.append([t.params["a"], t.params["b"]])
            opt.tell(t.trial_id, float(sum(X[-1])))
    expected = torch.quasirandom.SobolEngine(2, scramble=True, seed=5).draw(16, dtype=torch.float64)
    assert torch.allclose(torch.tensor(X, dtype=torch.float64), expected, atol=1e-12)


def test_a_lost_worker_does_not_make_its_point_taken():
    """One `worker-lost` (a node pre-empted) does not ban the point for good (on a grid, maybe the best
    cell)."""
    from orchestrator.acquisition.base import Proposer

    class WantsTheTop(Proposer):
        requires_model = False

        def _propose(self, model, q, X_pending, X_observed, generator):
            return torch.ones(q, 1, dtype=torch.float64)

    space = {"n": {"type": "int", "low": 0, "high": 99}}
    opt = AskTellOptimizer(space, initial_design=1, seed=0)
    opt._proposer = WantsTheTop()
    for t in opt.ask(1):
        opt.tell(t.trial_id, 0.0)
    (t,) = opt.ask(1)
    assert t.params == {"n": 99}
    opt.tell(t.trial_id, None, error="worker-lost", message="node lost")
    assert [u.params for u in opt.ask(1)] == [{"n": 99}]  # asked again: the point's evaluation never ran
    opt2 = AskTellOptimizer(space, initial_design=1, seed=0)
    opt2._proposer = WantsTheTop()
    for t in opt2.ask(1):
        opt2.tell(t.trial_id, 0.0)
    (t,) = opt2.ask(1)
    opt2.tell(t.trial_id, None, error="exception", message="boom")
    assert [u.params for u in opt2.ask(1)] != [{"n": 99}]  # an evaluation that failed there: taken


def test_the_sobol_proposer_counts_failed_points_of_its_sequence():
    """The Sobol proposer skips the sequence's points used by failed trials too, not only pending + observed
    ones, so a later batch does not begin on an observed point and get a random one for it."""
    space = {"a": {"type": "float", "low": 0.0, "high": 1.0}, "b": {"type": "float", "low": 0.0, "high": 1.0}}
    opt = AskTellOptimizer(space, proposer="sobol", initial_design=8, seed=5)
    X = []
    for q in (8, 2, 2, 4):
        for t in opt.ask(q):
            X.append([t.params["a"], t.params["b"]])
            if len(X) == 4:
                opt.tell(t.trial_id, None, error="exception", message="boom")
            else:
                opt.tell(t.trial_id, float(sum(X[-1])))
    expected = torch.quasirandom.SobolEngine(2, scramble=True, seed=5).draw(16, dtype=torch.float64)
    assert torch.allclose(torch.tensor(X, dtype=torch.float64), expected, atol=1e-12)


def test_a_replay_without_calibrator_checkpoint_rebuilds_the_online_calibrator():
    """A resume without a usable calibrator checkpoint tells every logged result again and flushes once. The
    online recalibrator steps once per ask, so that flush must update it round by round
    (`end_calibration_round` where the log shows a model batch proposed): one update for all the results would
    leave its levels one step from the identity however long the run."""
    kw = dict(model="exact-gp", proposer="calibrated", initial_design=6, seed=2, calibrator="online",
              calibrator_options={"eta": 0.2},
              proposer_options={"acquisition": "ucb", "raw_samples": 32, "num_restarts": 1, "maxiter": 10})
    opt = AskTellOptimizer(SMALL, **kw)
    rng = np.random.default_rng(0)
    for _ in range(7):
        for t in opt.ask(6):
            opt.tell(t.trial_id, f_true(t.params) + 0.3 * rng.standard_normal())
    opt.flush_calibration()
    assert opt.calibrator.T == 36  # six model batches of six (the design carries no forecast)
    new = AskTellOptimizer(SMALL, **kw)  # the actor's replay (orchestrator/actor.py `_replay`), in log order:
    y_of = dict(zip(opt._obs_ids, opt._obs_y))  # a batch's proposals, then its results
    for b in sorted({t.batch_id for t in opt._trials.values()}):
        batch = [(tid, t) for tid, t in opt._trials.items() if t.batch_id == b]
        if batch[0][1].source == "model":  # its ask flushed the calibrator: a new round
            new.end_calibration_round()
        for tid, t in batch:
            new.restore_trial(tid, t.params, t.x, t.batch_id, forecast=t.forecast, source=t.source)
        for tid, _ in batch:
            new.tell(tid, opt.sign * y_of[tid])
    twin = AskTellOptimizer(SMALL, **kw)  # a state saved with the rounds queued keeps them
    twin.set_state(new.get_state())
    assert new.flush_calibration() == twin.flush_calibration() == 36  # the design results carry no forecast
    np.testing.assert_allclose(new.calibrator.raw_levels(), opt.calibrator.raw_levels(), atol=1e-12)
    np.testing.assert_allclose(twin.calibrator.raw_levels(), opt.calibrator.raw_levels(), atol=1e-12)
    # the map has moved off the identity
    assert np.abs(opt.calibrator.raw_levels() - opt.calibrator.levels).max() > 0.1


def test_neighbouring_values_of_a_wide_log_int_are_distinct_points():
    """Adjacent values of a log int near 1e5 lie under `DUPLICATE_TOL` apart in the unit cube: discrete
    coordinates compare by their cell, not by rounded coordinates (which take 99,994 and 99,995 for one point,
    replace the second with a random one, and give the 100,000 cells 98,259 keys)."""
    space = {"k": {"type": "int", "low": 1, "high": 100_000, "log": True},
             "x": {"type": "float", "low": 0.0, "high": 1.0}}
    opt = AskTellOptimizer(space, seed=0)
    X = opt.space.to_unit([{"k": 99_994, "x": 0.5}, {"k": 99_995, "x": 0.5}, {"k": 99_995, "x": 0.5 + 1e-9}],
                          dtype=torch.float64)
    out = opt._dedupe(
        X, torch.empty(0, 2, dtype=torch.float64), torch.empty(0, 2, dtype=torch.float64), batch_id=0
    )
    assert torch.equal(out[:2], X[:2])  # two values of k: both kept
    assert not torch.equal(out[2], X[2])  # a repeat of the second (x within DUPLICATE_TOL): replaced
    one = AskTellOptimizer({"k": space["k"]}, seed=0)
    assert len(set(one._cell_keys(one._grid_cells()))) == 100_000


def test_a_streaming_ask_teaches_the_online_calibrator_in_one_step():
    """In streaming use an ask's flush holds the results told since the last ask, from any batches: they take
    one step of the online recalibrator together, so its map changes once per proposal (one step per batch of
    them over-covered with 8-16-point batches: `test_online.py`'s streaming test)."""
    from orchestrator.calibration import OnlineQuantileRecalibrator
    from orchestrator.models.predictive import Forecast

    opt = AskTellOptimizer(
        SMALL,
        model="exact-gp",
        proposer="calibrated",
        initial_design=6,
        seed=2,
        calibrator="online",
        calibrator_options={"eta": 0.2},
        proposer_options={"acquisition": "ucb", "raw_samples": 32, "num_restarts": 1, "maxiter": 10},
    )
    for t in opt.ask(6):
        opt.tell(t.trial_id, f_true(t.params))
    a, b = opt.ask(3), opt.ask(3)  # b is proposed while a is pending
    told = [a[0], b[1], a[2]]
    for t in told:
        opt.tell(t.trial_id, f_true(t.params) + 0.5)
    before = opt.calibrator.raw_levels()
    opt.ask(2)  # flushes the three results: one step
    expected = OnlineQuantileRecalibrator(eta=0.2)
    expected.q = before.copy()
    u = Forecast.from_records([t.forecast for t in sorted(told, key=lambda t: (t.batch_id, t.trial_id))]).cdf(
        torch.tensor([f_true(t.params) + 0.5 for t in sorted(told, key=lambda t: (t.batch_id, t.trial_id))],
                     dtype=torch.float64))
    expected.update_pit_batch(u)
    np.testing.assert_allclose(opt.calibrator.raw_levels(), expected.raw_levels(), atol=1e-12)
    assert opt.calibrator.T == 3 and not np.allclose(before, expected.raw_levels())


def _online_opt():
    return AskTellOptimizer(
        SMALL,
        model="exact-gp",
        proposer="calibrated",
        initial_design=6,
        seed=2,
        calibrator="online",
        calibrator_options={"eta": 0.2},
        proposer_options={"acquisition": "ucb", "raw_samples": 32, "num_restarts": 1, "maxiter": 10},
    )


def test_a_state_saved_between_tells_keeps_the_calibration_round():
    """`set_state` does not start a new round: results told before and after the snapshot take one step at the
    next ask, as in the optimizer it was taken from."""
    opt = _online_opt()
    for t in opt.ask(6):
        opt.tell(t.trial_id, f_true(t.params))
    a = opt.ask(4)
    for t in a[:2]:
        opt.tell(t.trial_id, f_true(t.params) + 0.5)
    twin = _online_opt()
    twin.set_state(opt.get_state())
    for o in (opt, twin):
        for t in a[2:]:
            o.tell(t.trial_id, f_true(t.params) + 0.5)
        assert o.flush_calibration() == 4
    np.testing.assert_allclose(twin.calibrator.raw_levels(), opt.calibrator.raw_levels(), atol=1e-12)


def test_a_result_told_during_an_ask_is_learned_with_the_next_round_after_a_checkpoint_restore():
    """Streaming: a result told while an ask runs (after its flush) is logged before that ask's proposals, so
    a replay puts it in the round before, beside results a calibrator checkpoint has learned. It does not stay
    there after `restore_calibrator`, so the next flush steps once, as the run did."""
    opt = _online_opt()
    for t in opt.ask(6):
        opt.tell(t.trial_id, f_true(t.params))
    a = opt.ask(3)
    y = {t.trial_id: f_true(t.params) + 0.5 for t in a}
    for t in a[:2]:
        opt.tell(t.trial_id, y[t.trial_id])
    b = opt.ask(3)  # its flush learns a[0], a[1]; a[2] comes in after it
    ckpt = opt.calibrator_checkpoint()
    y.update({t.trial_id: f_true(t.params) + 0.5 for t in b})
    for t in (a[2], b[0]):
        opt.tell(t.trial_id, y[t.trial_id])
    opt.flush_calibration()  # one step for a[2] and b[0]

    new = _online_opt()  # the replay, in log order: a[2]'s result before b's proposals
    for tid, t in opt._trials.items():
        if t.batch_id == 0:
            new.restore_trial(tid, t.params, t.x, t.batch_id, forecast=t.forecast, source=t.source)
            new.tell(tid, f_true(t.params))
    new.end_calibration_round()
    for t in a:
        new.restore_trial(t.trial_id, t.params, t.x, t.batch_id, forecast=t.forecast, source=t.source)
    for t in a:
        new.tell(t.trial_id, y[t.trial_id])
    new.end_calibration_round()
    for t in b:
        new.restore_trial(t.trial_id, t.params, t.x, t.batch_id, forecast=t.forecast, source=t.source)
    new.tell(b[0].trial_id, y[b[0].trial_id])
    assert new.restore_calibrator(ckpt) == 2
    assert new.flush_calibration() == 2
    np.testing.assert_allclose(new.calibrator.raw_levels(), opt.calibrator.raw_levels(), atol=1e-12)


def test_a_fit_stops_between_training_steps_once_its_stop_event_is_set():
    """`fit(stop=event)`: the SVGP's training loop asks the event between steps, so a fit nobody will use (the
    central actor's background refit when the run ends) stops with `FitInterrupted` and the model in use
    stays; an event that is never set changes nothing."""
    import threading

    from orchestrator.errors import FitInterrupted

    opt = AskTellOptimizer({"x": {"type": "float", "low": 0.0, "high": 1.0}}, model="quantile", tau=0.5,
                           initial_design=12, seed=0, model_options={
                               "num_inducing": 8, "max_steps": 200, "warm_max_steps": 10**6,
                               "warm_early_stop_patience": 10**6})
    for t in opt.ask(12):
        opt.tell(t.trial_id, math.sin(6 * t.params["x"]))
    stop = threading.Event()
    stop.set()
    with pytest.raises(FitInterrupted):
        opt.fit(stop=stop)
    assert opt.model is None  # nothing was fitted
    opt.fit(stop=threading.Event())  # a cold fit of at most 200 steps, never stopped
    first = opt.model
    assert first is not None
    for t in opt.ask(4):
        opt.tell(t.trial_id, math.sin(6 * t.params["x"]))
    stop = threading.Event()
    # a warm fit of 10**6 steps without early stopping, stopped at 0.5 s
    timer = threading.Timer(0.5, stop.set)
    timer.start()
    try:
        with pytest.raises(FitInterrupted):
            opt.fit(stop=stop)
    finally:
        timer.cancel()
    assert opt.model is first and opt.num_stale == 4


def test_a_state_saved_during_a_flush_holds_every_result_queued_or_learned():
    """`flush_calibration` takes the queue under the optimizer's lock and teaches the calibrator outside it;
    `get_state` waits for the flush, so a state saved in between does not hold the flushed results neither
    queued nor learned (a twin restored from it would never learn them)."""
    import threading

    opt = _online_opt()
    for t in opt.ask(6):
        opt.tell(t.trial_id, f_true(t.params))
    for t in opt.ask(4):
        opt.tell(t.trial_id, f_true(t.params) + 0.5)
    update, entered, release = opt.calibrator.update, threading.Event(), threading.Event()

    def slow_update(*args, **kwargs):
        entered.set()
        release.wait(10)
        return update(*args, **kwargs)

    opt.calibrator.update = slow_update
    flush = threading.Thread(target=opt.flush_calibration)
    flush.start()
    assert entered.wait(10)
    states = []
    saver = threading.Thread(target=lambda: states.append(opt.get_state()))
    saver.start()
    saver.join(0.5)
    release.set()
    flush.join(10)
    saver.join(10)
    state = states[0]
    assert len(state["calib_taught"]) + len(state["calib_queue"]) == 4, (
        state["calib_taught"],
        state["calib_queue"],
    )
