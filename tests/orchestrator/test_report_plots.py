"""Tests of the report's plots (orchestrator/report/plots.py, study_plots.py) and of its files' mode, on runs
whose logs are written by hand with the real RunStore (no Ray).

The runs have a parameter of each type the space supports (float, log float, int with a step, log int,
choice), Sobol and model trials, failures, refits with recommendations and one-step-ahead forecasts; the edge
cases are a run with only Sobol points, one with one parameter, and one with a single completed trial.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path

import numpy as np
import pytest

from orchestrator.config import load_config
from orchestrator.report import write_report
from orchestrator.store import Event, RunStore

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

#: a parameter of each type orchestrator/space.py supports
MIXED_SPACE = {
    "lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
    "momentum": {"type": "float", "low": 0.0, "high": 0.99},
    "layers": {"type": "int", "low": 2, "high": 10, "step": 2},
    "width": {"type": "int", "low": 8, "high": 512, "log": True},
    "act": {"type": "choice", "choices": ["relu", "tanh", "gelu"]},
}
ALL_PLOTS = {"best_vs_evaluations", "best_vs_time", "utilization", "predicted_vs_observed", "coverage",
             "pit_histogram", "parallel_coordinates", "slice_1", "slice_2", "importance"}


def _sample(rng: np.random.Generator, space: dict) -> dict:
    out = {}
    for name, spec in space.items():
        if spec["type"] == "float":
            lo, hi = spec["low"], spec["high"]
            out[name] = float(math.exp(rng.uniform(math.log(lo), math.log(hi)))) if spec.get("log") \
                else float(rng.uniform(lo, hi))
        elif spec["type"] == "int":
            if spec.get("log"):
                out[name] = int(round(math.exp(rng.uniform(math.log(spec["low"]), math.log(spec["high"])))))
            else:
                out[name] = int(rng.choice(np.arange(spec["low"], spec["high"] + 1, spec.get("step", 1))))
        else:
            out[name] = spec["choices"][int(rng.integers(len(spec["choices"])))]
    return out


def _value(p: dict) -> float:
    """A known function of the parameters: `momentum` and `act` matter most, `width` not at all."""
    return (3.0 * p.get("momentum", 0.5) + (1.0 if p.get("act") == "gelu" else 0.0)
            - 0.1 * abs(math.log10(p.get("lr", 1e-2)) + 2) + 0.05 * p.get("layers", 4))


def build_mixed_run(
    root: Path,
    *,
    n: int = 60,
    sobol: int = 12,
    space: dict | None = None,
    fail_every: int = 9,
    direction: str = "maximize",
    batch: int = 4,
    forecasts: bool = True,
    seed: int = 0,
    objective: str = "forrester",
) -> RunStore:
    """A finished run of `n` trials in batches of `batch`: the first `sobol` from the Sobol design, the rest
    from the model (with a Gaussian forecast of the outcome, negated for minimize), every `fail_every`-th a
    failure, and a refit after each model batch recording its recommendation (the best point so far) and
    prediction."""
    space = MIXED_SPACE if space is None else space
    cfg = load_config(
        {
            "name": "mixed",
            "objective": {"name": objective},
            "space": space,
            "budget": n,
            "batch_size": batch,
            "initial_design": sobol,
            "direction": direction,
            "tau": 0.5,
        }
    ).to_dict()
    store = RunStore.create(str(root), cfg)
    rng = np.random.default_rng(seed)
    sign = -1.0 if direction == "minimize" else 1.0
    best: tuple[float, dict] | None = None
    done = 0
    for b in range(math.ceil(n / batch)):
        t = 100.0 + 2.0 * b
        evs = []
        for k in range(min(batch, n - b * batch)):
            i = b * batch + k
            tid = f"{b}-{k}"
            p = _sample(rng, space)
            source = "sobol" if i < sobol else "model"
            mu = sign * _value(p)
            fc = ({"family": "gaussian", "tau": 0.5, "mu_f": sign * mu, "var_f": 0.01, "mu_g": math.log(0.3),
                   "var_g": 0.0} if forecasts and source == "model" else None)
            evs.append(Event("proposed", tid, time=t, batch_id=b, params=p, x=[0.5] * len(space), forecast=fc,
                             info={"source": source, "proposal_seconds": 0.01}))
            evs.append(Event("started", tid, time=t + 0.1, started_at=t + 0.1, node_id="n0", batch_id=b))
            if (i + 1) % fail_every == 0:
                evs.append(
                    Event(
                        "failed",
                        tid,
                        time=t + 1.0 + 0.1 * k,
                        started_at=t + 0.1,
                        ended_at=t + 1.0 + 0.1 * k,
                        error="exception",
                        traceback="Traceback ...",
                        info={"message": "boom"},
                    )
                )
                continue
            y = float(mu + rng.normal(0.0, 0.3))
            done += 1
            evs.append(Event("completed", tid, time=t + 1.0 + 0.1 * k, value=y, started_at=t + 0.1,
                             ended_at=t + 1.0 + 0.1 * k))
            if best is None or sign * y > sign * best[0]:
                best = (y, p)
        if (b + 1) * batch > sobol and best is not None and done >= 2:
            evs.append(Event("refit", time=t + 1.9, info={"seconds": 0.2, "n": done, "slots": batch,
                                                          "best_predicted": best[0] - sign * 0.2,
                                                          "best_params": best[1]}))
        store.append(evs)
    return RunStore.open(str(root))


def _png(path: str) -> np.ndarray:
    import matplotlib.image as mpimg

    data = Path(path).read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] >= 200 and img.shape[1] >= 300, (path, img.shape)
    assert float(img[..., :3].std()) > 0.01, path  # something was drawn
    return img


def _all_differ(paths: dict[str, str]) -> None:
    blobs = {k: Path(v).read_bytes() for k, v in paths.items()}
    assert len(set(blobs.values())) == len(blobs), "two plots are the same image"


def test_a_run_with_every_parameter_type_draws_every_plot(tmp_path, caplog):
    pytest.importorskip("optuna")
    store = build_mixed_run(tmp_path / "run")
    with caplog.at_level(logging.INFO, logger="orchestrator.report"):
        t0 = time.perf_counter()
        _, paths = write_report(store.run_dir)
        seconds = time.perf_counter() - t0
    plots = {k: v for k, v in paths.items() if k not in ("summary", "trials")}
    assert set(plots) == ALL_PLOTS, sorted(plots)
    assert not [r for r in caplog.records if "not drawn" in r.getMessage()], caplog.text
    for path in plots.values():
        _png(path)
    _all_differ(plots)
    assert seconds < 60, seconds  # a generous bound on a shared machine: test_report_of_200_trials_is_fast


def test_the_study_maps_each_parameter_type_to_its_distribution(tmp_path):
    optuna = pytest.importorskip("optuna")
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    from orchestrator.report.study_plots import build_study
    from orchestrator.store.frame import log_rows

    store = build_mixed_run(tmp_path / "run", n=40)
    rows = log_rows(store.events())
    study = build_study(rows, store.config["space"], "maximize")
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == 40
    states = [t.state for t in trials]
    assert states.count(optuna.trial.TrialState.FAIL) == 40 // 9
    d = trials[0].distributions
    assert d["lr"] == FloatDistribution(1e-4, 1e-1, log=True)
    assert d["momentum"] == FloatDistribution(0.0, 0.99)
    assert d["layers"] == IntDistribution(2, 10, step=2)
    assert d["width"] == IntDistribution(8, 512, log=True)
    assert d["act"] == CategoricalDistribution(["relu", "tanh", "gelu"])
    by_id = {r["trial_id"]: r for r in rows}
    for t in trials:
        assert t.params == by_id[t.user_attrs["trial_id"]]["params"]
        if t.state == optuna.trial.TrialState.COMPLETE:
            assert t.value == by_id[t.user_attrs["trial_id"]]["value"]
    # the importance the report draws ranks the parameters the value depends on above one it ignores
    imp = optuna.importance.get_param_importances(
        build_study(log_rows(build_mixed_run(tmp_path / "big", n=200, forecasts=False).events()),
                    MIXED_SPACE, "maximize"),
        evaluator=optuna.importance.PedAnovaImportanceEvaluator())
    assert imp["momentum"] > imp["width"], imp


def test_a_run_with_only_sobol_points_and_failures_draws_without_error(tmp_path, caplog):
    pytest.importorskip("optuna")
    store = build_mixed_run(tmp_path / "run", n=24, sobol=24, fail_every=3, forecasts=False)
    with caplog.at_level(logging.INFO, logger="orchestrator.report"):
        _, paths = write_report(store.run_dir)
    plots = {k: v for k, v in paths.items() if k not in ("summary", "trials")}
    # 16 completed trials: too few for PED-ANOVA's top 10%; no forecasts, no refits
    assert set(plots) == {
        "best_vs_evaluations",
        "best_vs_time",
        "utilization",
        "parallel_coordinates",
        "slice_1",
        "slice_2",
    }, sorted(plots)
    assert "importance.png not drawn: 16 completed trials; PED-ANOVA needs 20" in caplog.text
    for path in plots.values():
        _png(path)
    _all_differ(plots)


def test_plots_that_cannot_be_drawn_are_skipped_with_their_reason(tmp_path, caplog):
    pytest.importorskip("optuna")
    # one parameter: no importance; its slices are one figure
    one = build_mixed_run(tmp_path / "one", n=30, space={"x": {"type": "float", "low": 0.0, "high": 1.0}})
    with caplog.at_level(logging.INFO, logger="orchestrator.report"):
        _, paths = write_report(one.run_dir)
    assert {"parallel_coordinates", "slice"} <= set(paths) and "importance" not in paths
    assert "importance.png not drawn: the space has one parameter ('x')" in caplog.text
    _png(paths["slice"])
    # a single completed trial: no parameter plots, and the previous report's are removed
    caplog.clear()
    lone = build_mixed_run(tmp_path / "lone", n=2, sobol=2, fail_every=2, forecasts=False)
    out = tmp_path / "one" / "report"
    (out / "slice_3.png").write_bytes(PNG_SIGNATURE)  # a wider run's, reported into the same folder before
    with caplog.at_level(logging.INFO, logger="orchestrator.report"):
        _, paths = write_report(lone.run_dir, out_dir=str(out))
    for key in ("parallel_coordinates", "slice", "importance"):
        assert (
            f"{key}.png not drawn: 1 completed trial(s) with the run's parameters; it needs 2" in caplog.text
        )
        assert key not in paths and not (out / f"{key}.png").exists()
    assert not (out / "slice_3.png").exists()
    for key in ("best_vs_evaluations", "best_vs_time", "utilization"):
        _png(paths[key])


def test_the_study_takes_list_and_none_choices_and_leaves_out_trials_off_the_space():
    optuna = pytest.importorskip("optuna")
    from optuna.distributions import CategoricalDistribution

    from orchestrator.report.study_plots import build_study

    space = {"c": {"type": "choice", "choices": [None, True, [1, 2], {"a": 1}, "s"]},
             "k": {"type": "int", "low": 0, "high": 10, "step": 5}}
    rows = [
        {"trial_id": f"t{i}", "state": "completed", "value": float(i), "params": p}
        for i, p in enumerate(
            [
                {"c": [1, 2], "k": 5},
                {"c": None, "k": 10},
                {"c": {"a": 1}, "k": 0},
                {"c": True, "k": 0},
                {"c": "s", "k": 3},  # off the int's grid
                {"k": 5},  # a parameter missing
                {"c": "other", "k": 5},  # not one of the choices
            ]
        )
    ] + [{"trial_id": "r", "state": "running", "value": None, "params": {"c": "s", "k": 5}}]
    study = build_study(rows, space, "minimize")
    trials = study.get_trials(deepcopy=False)
    assert [t.user_attrs["trial_id"] for t in trials] == ["t0", "t1", "t2", "t3"]
    assert trials[0].distributions["c"] == CategoricalDistribution([None, True, "[1, 2]", '{"a": 1}', "s"])
    assert [t.params["c"] for t in trials] == ["[1, 2]", None, '{"a": 1}', True]
    assert study.direction == optuna.study.StudyDirection.MINIMIZE and study.best_trial.value == 0.0


def test_without_optuna_the_parameter_plots_are_skipped(tmp_path, caplog, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_optuna(name, *args, **kwargs):
        if name == "optuna" or name.startswith("optuna."):
            raise ImportError("No module named 'optuna'")
        return real(name, *args, **kwargs)

    store = build_mixed_run(tmp_path / "run", n=24)
    monkeypatch.setattr(builtins, "__import__", no_optuna)
    with caplog.at_level(logging.INFO, logger="orchestrator.report"):
        _, paths = write_report(store.run_dir)
    assert "parallel_coordinates.png not drawn: it is drawn by Optuna, which is not installed" in caplog.text
    assert {"best_vs_evaluations", "predicted_vs_observed", "coverage"} <= set(paths)
    assert not {"parallel_coordinates", "slice_1", "importance"} & set(paths)


def test_the_value_plot_shows_sources_failures_and_the_recommendation_at_each_refit(tmp_path, monkeypatch):
    """best_vs_evaluations: one point per completed trial in the colour of its source, a mark per failure, the
    best so far, and the recommendation's predicted level (and its true one for a built-in synthetic
    objective), labelled as the recommendation, not as a best so far; best_vs_time shows the best against time
    with the evaluations finished, and no recommendation."""
    import matplotlib.axes

    from orchestrator.report import recommendation_series
    from orchestrator.store import trials_table

    # forrester's own space: its true quantiles are known at every recommendation
    store = build_mixed_run(
        tmp_path / "run", n=20, sobol=8, space={"x0": {"type": "float", "low": 0.0, "high": 1.0}}
    )
    labels: dict[str, list[str]] = {}
    legend = matplotlib.axes.Axes.legend

    def record(ax, *args, **kwargs):
        out = legend(ax, *args, **kwargs)
        labels.setdefault(ax.get_title(), []).extend(t.get_text() for t in out.get_texts())
        return out

    monkeypatch.setattr(matplotlib.axes.Axes, "legend", record)
    write_report(store.run_dir)
    (values,) = [v for k, v in labels.items() if "every trial's value" in k]
    n_fail = 20 // 9
    assert (
        f"Sobol initial design ({8 - 0})" in values and f"model's proposer ({12 - n_fail})" in values
    ), values
    assert f"failed ({n_fail}, no value)" in values and "best observed so far" in values
    assert "recommendation at each refit: model's predicted tau-quantile" in values
    assert "recommendation at each refit: true tau-quantile" in values  # forrester knows its quantiles
    (over_time,) = [v for k, v in labels.items() if "over time" in k]
    assert over_time == ["best observed value", "evaluations finished"]
    events = store.events()
    n, _, _, params = recommendation_series(events, trials_table(events))
    assert len(n) == len(params) == sum(ev.kind == "refit" for ev in events) and all(p for p in params)


def test_predicted_against_observed_uses_each_trials_forecast_in_the_outcomes_units(tmp_path):
    """The forecasts of a minimized run are of the negated outcome: the plot's median and interval are turned
    back, so a calibrated forecast holds about 80% of the outcomes in its 80% interval."""
    from orchestrator.report import forecast_intervals
    from orchestrator.store import trials_table

    for direction in ("maximize", "minimize"):
        store = build_mixed_run(tmp_path / direction, n=400, sobol=4, fail_every=10**9, direction=direction,
                                batch=8, space={"momentum": MIXED_SPACE["momentum"]})
        obs, med, lo, hi, ids = forecast_intervals(trials_table(store.events()), direction, 0.8)
        assert len(obs) == len(ids) == 396 and np.all(lo < med) and np.all(med < hi)
        sign = -1.0 if direction == "minimize" else 1.0  # the outcome's mean (build_mixed_run)
        truth = {t.trial_id: sign * _value(t.params) for t in trials_table(store.events())}
        assert np.allclose(med, [truth[i] for i in ids], atol=1e-4)  # the median of N(mu, .) is mu
        inside = float(np.mean((obs >= lo) & (obs <= hi)))
        # the forecast's spread sqrt(0.3^2 + 0.01) is wider than the noise's 0.3: a little above 80%
        assert 0.78 < inside < 0.9, (direction, inside)


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_report_files_have_the_store_files_mode_under_each_umask(tmp_path, umask):
    """The report's files are made as the store makes the run's (0644 less the umask): readable by others
    under the usual umask, private under 077, and not group-writable under 002, as the run's own files are
    not."""
    before = os.umask(umask)
    try:
        store = build_mixed_run(tmp_path / "run", n=8, sobol=8, forecasts=False)
        _, paths = write_report(store.run_dir)
    finally:
        os.umask(before)
    want = os.stat(tmp_path / "run" / "config.yaml").st_mode & 0o777
    assert want == 0o644 & ~umask
    for path in paths.values():
        assert os.stat(path).st_mode & 0o777 == want, (path, oct(os.stat(path).st_mode))


def test_report_of_200_trials_is_fast(tmp_path):
    pytest.importorskip("optuna")
    store = build_mixed_run(tmp_path / "run", n=200)
    # imports (matplotlib, optuna, the forecasts' torch) are not the report's time
    write_report(store.run_dir)
    t0 = time.perf_counter()
    _, paths = write_report(store.run_dir)
    seconds = time.perf_counter() - t0
    assert set(paths) >= ALL_PLOTS
    assert seconds < 15, seconds


def test_qbatch_report_prints_the_plots_it_left_out_after_the_files_it_wrote(tmp_path, capsys):
    pytest.importorskip("optuna")
    from orchestrator import cli

    store = build_mixed_run(tmp_path / "run", n=12, space={"x": {"type": "float", "low": 0.0, "high": 1.0}})
    assert cli.main(["report", store.run_dir, "--out", str(tmp_path / "rep")]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert (
        lines[-1]
        == "qbatch: report: importance.png not drawn: the space has one parameter ('x'): its importance is 1"
    )
    assert f"wrote {tmp_path / 'rep' / 'slice.png'}" in lines
    assert "not drawn" not in captured.err
    assert logging.getLogger("orchestrator.report").level == logging.NOTSET  # put back
