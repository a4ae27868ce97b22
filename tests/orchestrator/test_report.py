"""Tests of the run metrics and the report (orchestrator/report/) on synthetic finished runs.

The runs are written with the real RunStore in a known schedule, so utilization, latencies, queue depth,
failures and forecast coverage have exact or statistically tight expected values. The end-to-end run on
Runs on Ray are tested in tests/integration/; here the log is built by hand.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

from orchestrator.config import load_config
from orchestrator.report import compute_metrics, format_summary, max_concurrency, write_report
from orchestrator.store import Event, RunStore
from orchestrator.store.frame import read_trials

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def build_run(
    root: Path,
    *,
    slots: int = 4,
    per_slot: int = 10,
    dur: float = 1.0,
    gap: float = 0.25,
    direction: str | None = "maximize",
    forecast_scale: float | None = 1.0,
    record_slots: bool = True,
    max_concurrent: int | None = None,
    fail_every: int = 7,
    seed: int = 0,
) -> tuple[RunStore, dict]:
    """A finished run: slot k runs batch j's k-th trial over [t0 + j (dur+gap), ... + dur].

    Outcomes are N(mu, 0.5^2) with mu = x; forecasts are Gaussian with the true mu and sigma * forecast_scale
    (model units: negated for minimize). Every `fail_every`-th trial fails (alternating timeout/exception).
    """
    cfg = load_config(
        {
            "name": "synthetic",
            "objective": {"name": "forrester"},
            "tau": 0.2,
            "budget": slots * per_slot,
            "batch_size": slots,
            "initial_design": slots,
            "max_concurrent": max_concurrent,
            "direction": direction,
        }
    ).to_dict()
    store = RunStore.create(str(root), cfg)
    rng = np.random.default_rng(seed)
    sign = -1.0 if direction == "minimize" else 1.0
    t0, sigma = 1000.0, 0.5
    truth = {"busy": 0.0, "values": [], "latency": [], "fit": [], "failures": {}}
    count = 0
    for j in range(per_slot):
        start = t0 + j * (dur + gap)
        lat = 0.05 * (j + 1)
        proposed, results = [], []
        for k in range(slots):
            tid = f"{j}-{k}"
            x = float(rng.uniform())
            fc = None
            if forecast_scale is not None:
                fc = {"family": "gaussian", "tau": 0.5, "mu_f": sign * x, "var_f": 0.0,
                      "mu_g": math.log(sigma * forecast_scale), "var_g": 0.0}
            proposed.append(
                Event(
                    "proposed",
                    tid,
                    time=start - 0.5,
                    batch_id=j,
                    params={"x": x},
                    x=[x],
                    forecast=fc,
                    info={"proposal_seconds": lat, "source": "model"},
                )
            )
            results.append(
                Event("started", tid, time=start, started_at=start, node_id=f"node-{k % 2}", batch_id=j)
            )
            count += 1
            if count % fail_every == 0:
                reason = "timeout" if (count // fail_every) % 2 else "exception"
                truth["failures"][reason] = truth["failures"].get(reason, 0) + 1
                results.append(Event("failed", tid, time=start + dur, started_at=start, ended_at=start + dur,
                                     error=reason, traceback="Traceback ...", node_id=f"node-{k % 2}",
                                     info={"metrics": {}, "message": f"{reason} of {tid}"}))
            else:
                y = float(rng.normal(x, sigma))
                truth["values"].append(y)
                results.append(Event("completed", tid, time=start + dur, value=y, started_at=start,
                                     ended_at=start + dur, node_id=f"node-{k % 2}",
                                     info={"metrics": {"loss": x, "curve": [1, 2]}}))
            truth["busy"] += dur
        if j == 1:  # a retried evaluation reports twice: the replay must count it once
            dup = results[-1]
            results.append(Event(dup.kind, dup.trial_id, time=dup.time + 5, value=dup.value, error=dup.error,
                                 started_at=dup.started_at, ended_at=dup.ended_at + 5))
        info = {
            "seconds": 0.1 * (j + 1),
            "n": count,
            "best_predicted": 0.3 + 0.01 * j,
            "best_params": {"x": 0.9},
        }
        if record_slots:
            info["slots"] = slots
        store.append(proposed + results + [Event("refit", time=start + dur + 0.01, info=info)])
        truth["latency"].append(lat)
        truth["fit"].append(0.1 * (j + 1))
    truth["span"] = (per_slot - 1) * (dur + gap) + dur
    return RunStore.open(str(root)), truth


def test_metrics_of_a_known_schedule(tmp_path):
    store, truth = build_run(tmp_path / "run")
    m = compute_metrics(store.events(), store.config, damage=store.damage)
    assert m.counts == {
        "proposed": 0,
        "running": 0,
        "unfinished": 0,
        "completed": 40 - sum(truth["failures"].values()),
        "failed": sum(truth["failures"].values()),
    }
    assert m.progress == 1.0 and m.duplicates == 1
    assert m.span_s == pytest.approx(truth["span"]) and m.busy_s == pytest.approx(truth["busy"])
    assert (m.slots, m.slots_source) == (4, "recorded")
    assert m.utilization == pytest.approx(truth["busy"] / (4 * truth["span"]))  # 40 / (4 * 12.25)
    assert m.proposal_latency_p50 == pytest.approx(np.percentile(truth["latency"], 50))
    assert m.proposal_latency_p95 == pytest.approx(np.percentile(truth["latency"], 95))
    assert m.n_proposals == 10 and m.n_refits == 10
    assert m.refit_mean_s == pytest.approx(np.mean(truth["fit"]))
    assert m.failures == truth["failures"]
    assert m.best_value == pytest.approx(max(truth["values"]))
    assert m.best_predicted == pytest.approx(0.39) and m.best_predicted_params == {"x": 0.9}
    assert m.queue_depth_max == 4
    assert m.evals_per_s == pytest.approx(40 / truth["span"])
    text = format_summary(m)
    assert "utilization U" in text and f"{m.utilization:.4g}" in text


def test_slots_fall_back_to_config_then_observed(tmp_path):
    store, truth = build_run(tmp_path / "a", record_slots=False, max_concurrent=8, forecast_scale=None)
    m = compute_metrics(store.events(), store.config)
    assert (m.slots, m.slots_source) == (8, "config")
    assert m.utilization == pytest.approx(truth["busy"] / (8 * truth["span"]))
    store, truth = build_run(tmp_path / "b", record_slots=False, forecast_scale=None)
    m = compute_metrics(store.events(), store.config)
    assert (m.slots, m.slots_source) == (4, "observed")
    assert max_concurrency(np.array([[0.0, 1.0], [1.0, 2.0], [0.5, 1.5]])) == 2


def test_minimize_best_is_the_smallest(tmp_path):
    store, truth = build_run(tmp_path / "run", direction="minimize", forecast_scale=None)
    m = compute_metrics(store.events(), store.config)
    assert m.direction == "minimize" and m.best_value == pytest.approx(min(truth["values"]))


def test_calibration_coverage_detects_overconfidence(tmp_path):
    store, _ = build_run(tmp_path / "good", slots=8, per_slot=50, fail_every=10**9)
    good = compute_metrics(store.events(), store.config)
    assert good.n_calibration == 400
    for p in (0.5, 0.8, 0.9):
        assert abs(good.coverage[p] - p) < 0.08, good.coverage
    pit_hist = np.histogram(good.pit, bins=5, range=(0, 1))[0] / 400
    assert np.all(np.abs(pit_hist - 0.2) < 0.07), pit_hist
    store, _ = build_run(tmp_path / "bad", slots=8, per_slot=50, fail_every=10**9, forecast_scale=0.3)
    bad = compute_metrics(store.events(), store.config)
    assert bad.coverage[0.5] < 0.3 and bad.coverage[0.9] < 0.6, bad.coverage
    # minimize: forecasts are of the negated outcome; scored at -y they are calibrated again
    store, _ = build_run(tmp_path / "min", slots=8, per_slot=50, fail_every=10**9, direction="minimize")
    mins = compute_metrics(store.events(), store.config)
    assert abs(mins.coverage[0.8] - 0.8) < 0.08 and abs(np.mean(mins.pit) - 0.5) < 0.05


def _check_png(path: Path) -> None:
    import matplotlib.image as mpimg

    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 2000, path
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] >= 200 and img.shape[1] >= 300
    assert float(img[..., :3].std()) > 0.01  # something was drawn


def test_report_writes_valid_pngs_and_tables(tmp_path):
    store, _ = build_run(tmp_path / "run")
    metrics, paths = write_report(str(tmp_path / "run"))
    expected = {
        "best_vs_evaluations",
        "best_vs_time",
        "utilization",
        "coverage",
        "pit_histogram",
        "summary",
        "trials",
        "predicted_vs_observed",
    }
    # the parameter plots (tests/orchestrator/test_report_plots.py): one parameter has no importance plot
    expected |= {"parallel_coordinates", "slice"} if importlib.util.find_spec("optuna") else set()
    assert set(paths) == expected
    for key in expected - {"summary", "trials"}:
        assert Path(paths[key]).parent == tmp_path / "run" / "report"
        _check_png(Path(paths[key]))
    rows = dict(csv.reader(open(paths["summary"])))
    assert rows["utilization U"] == f"{metrics.utilization:.4g}"
    assert (
        rows["failures"].startswith("exception: ")
        and rows["completed"] == str(metrics.counts["completed"])
    )
    with open(paths["trials"]) as f:
        trials = list(csv.DictReader(f))
    assert len(trials) == 40 and {t["state"] for t in trials} == {"completed", "failed"}
    # the columns of qbatch.read_trials: one per parameter and per metric, not JSON text, with the failure's
    # reason and message, as Optuna's trials_dataframe shows user attributes
    assert list(trials[0]) == list(read_trials(str(tmp_path / "run")).columns)
    for t in trials:
        if t["state"] == "failed":
            assert t["failure_message"] == f"{t['failure_reason']} of {t['trial_id']}"
            assert t["metric_loss"] == "" and t["value"] == ""
        else:
            assert float(t["metric_loss"]) == float(t["param_x"]) and t["metric_curve"] == "[1, 2]"
            assert t["failure_message"] == ""


def test_report_of_a_run_without_results(tmp_path):
    cfg = load_config({"objective": "forrester", "direction": "maximize", "budget": 4}).to_dict()
    store = RunStore.create(str(tmp_path / "run"), cfg)
    store.append([Event("proposed", f"0-{i}", time=1.0, params={"x": 0.1 * i}) for i in range(4)])
    metrics, paths = write_report(str(tmp_path / "run"), out_dir=str(tmp_path / "out"))
    # no process writes the run: its proposals are unfinished, not queued
    assert (
        metrics.counts["proposed"] == 0
        and metrics.counts["unfinished"] == 4
        and math.isnan(metrics.utilization)
    )
    for key in ("best_vs_evaluations", "best_vs_time", "utilization"):
        _check_png(Path(paths[key]))
    assert "coverage" not in paths


def test_report_of_a_run_whose_every_evaluation_failed(tmp_path, monkeypatch):
    """The best-so-far plots of a run without a successful result say what happened, instead of empty axes
    and a legend for a "best observed value" that does not exist."""
    import matplotlib.axes

    cfg = load_config({"objective": "forrester", "direction": "maximize", "budget": 3}).to_dict()
    store = RunStore.create(str(tmp_path / "run"), cfg)
    evs = []
    for i in range(3):
        evs.append(Event("proposed", f"0-{i}", time=1.0, params={"x": 0.1 * i}))
        evs.append(Event("failed", f"0-{i}", time=3.0 + i, started_at=2.0, ended_at=3.0 + i, error="nan"))
    store.append(evs)
    texts, legends = [], []
    text, legend = matplotlib.axes.Axes.text, matplotlib.axes.Axes.legend
    monkeypatch.setattr(
        matplotlib.axes.Axes,
        "text",
        lambda ax, x, y, s, *a, **k: texts.append(s) or text(ax, x, y, s, *a, **k),
    )
    monkeypatch.setattr(
        matplotlib.axes.Axes,
        "legend",
        lambda ax, *a, **k: legends.append(ax.get_title()) or legend(ax, *a, **k),
    )
    _, paths = write_report(str(tmp_path / "run"), out_dir=str(tmp_path / "out"))
    assert texts.count("no successful evaluation: all 3 finished ones failed (see trials.csv)") == 2
    assert not [t for t in legends if "best so far" in t]
    for key in ("best_vs_evaluations", "best_vs_time"):
        _check_png(Path(paths[key]))


def test_utilization_of_a_resumed_run_leaves_out_the_time_between_sessions(tmp_path):
    """A run stopped and resumed later is measured over its sessions' spans, not across the wait for `qbatch
    resume`: with the slots busy in both sessions, U is not pulled down by the gap."""
    cfg = load_config(
        {"objective": "forrester", "direction": "maximize", "budget": 8, "max_concurrent": 2}
    ).to_dict()
    store = RunStore.create(str(tmp_path / "run"), cfg)
    evs = []
    for i, (session, start) in enumerate([(100.0, 100.0), (100.0, 100.0), (100.0, 101.0), (100.0, 101.0),
                                         (500.0, 600.0), (500.0, 600.0), (500.0, 601.0), (500.0, 601.0)]):
        tid = f"{i // 2}-{i % 2}"
        evs.append(Event("proposed", tid, time=start, params={"x": 0.1 * i}))
        evs.append(
            Event(
                "completed",
                tid,
                time=start + 1,
                value=float(i),
                started_at=start,
                ended_at=start + 1,
                info={"session": session},
            )
        )
    store.append(evs)
    m = compute_metrics(RunStore.open(str(tmp_path / "run")).events(), cfg)
    assert m.span_s == pytest.approx(4.0) and m.utilization == pytest.approx(1.0)
    assert m.evals_per_s == pytest.approx(2.0)
    for ev in evs:  # a log without sessions (older runs) is one span
        ev.info = None
    assert compute_metrics(evs, cfg).span_s == pytest.approx(502.0)
    # an evaluation adopted by a restarted actor may start before its session's other results: counted once
    evs[-1].info = {"session": 2.0}
    evs[-1].started_at = 599.0
    for ev in evs[:-1]:
        ev.info = {"session": 1.0}
    assert compute_metrics(evs, cfg).span_s == pytest.approx(502.0)


def test_a_report_that_fails_half_way_leaves_the_previous_tables_whole(tmp_path, monkeypatch):
    """The CSV tables are written by a rename, as the plots were: a report that failed while writing
    trials.csv (a metric that cannot be written, a full disk) left it truncated after its header, and a reader
    of summary.csv during a rewrite could see it half-written."""
    import orchestrator.report.writer as R

    store, _ = build_run(tmp_path / "run")
    _, paths = write_report(store.run_dir)
    before = {k: Path(paths[k]).read_bytes() for k in ("summary", "trials")}
    assert before["trials"].count(b"\n") > 10
    calls = {"n": 0, "path": ""}
    fdopen, os_open = R.os.fdopen, R.os.open

    def opening(path, *args):
        calls["path"] = str(path)
        return os_open(path, *args)

    class Full:
        """A file whose write stops half way on a full disk: what it wrote is on disk, the rest is not."""

        def __init__(self, fd, mode):
            self.f = fdopen(fd, mode)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            if "trials.csv" not in calls["path"]:  # the plots and summary.csv are written whole
                return self.f.write(data)
            calls["n"] += 1
            self.f.write(data[: len(data) // 2])
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(R.os, "open", opening)
    monkeypatch.setattr(R.os, "fdopen", Full)
    with pytest.raises(OSError):
        write_report(store.run_dir)
    assert calls["n"] == 1
    assert {k: Path(paths[k]).read_bytes() for k in ("summary", "trials")} == before
    assert not list(Path(paths["trials"]).parent.glob("*.tmp"))


def test_review_of_the_report_stale_plots_latency_and_the_fits_n(tmp_path):
    """(1) An earlier report's coverage.png and pit_histogram.png do not stay beside a summary with no
    forecasts; (2) the proposal latency is the model's, not that of the millisecond Sobol batches that fill
    free slots before the first fit; (3) the model's predictions are drawn at the results the fit saw
    (`info["n"]`), not at the evaluations finished when the refit was logged."""
    from orchestrator.report import predicted_series
    from orchestrator.store import trials_table

    store, _ = build_run(tmp_path / "run")
    out = tmp_path / "out"
    out.mkdir()
    for name in ("coverage.png", "pit_histogram.png"):
        (out / name).write_bytes(PNG_SIGNATURE)
    events = store.events()
    metrics = compute_metrics(events, store.config)
    if metrics.n_calibration:  # this run has forecasts: the plots are rewritten, not removed
        _, paths = write_report(store.run_dir, out_dir=str(out))
        assert (out / "coverage.png").read_bytes() != PNG_SIGNATURE
    cfg = load_config({"name": "lat", "objective": {"name": "forrester"}, "budget": 8, "batch_size": 2,
                       "initial_design": 2}).to_dict()
    lat = RunStore.create(str(tmp_path / "lat"), cfg)
    evs = []
    for b, (source, secs) in enumerate([("sobol", 0.001), ("sobol", 0.002), ("sobol", 0.001), ("model", 3.0),
                                        ("model", 1.0)]):
        evs.append(Event("proposed", trial_id=f"t{b}", batch_id=b, time=100.0 + b, params={"x": 0.5}, x=[0.5],
                         info={"source": source, "proposal_seconds": secs}))
    evs.append(Event("refit", time=104.5, info={"seconds": 1.0, "n": 2, "best_predicted": 0.3}))
    for b in range(5):
        evs.append(Event("completed", trial_id=f"t{b}", time=101.0 + b, value=0.1, started_at=100.5 + b,
                         ended_at=101.0 + b))
    lat.append(evs)
    m = compute_metrics(lat.events(), lat.config)
    assert m.n_proposals == 2 and m.proposal_latency_p50 == pytest.approx(2.0)
    n, _, v = predicted_series(lat.events(), trials_table(lat.events()))
    assert list(n) == [2.0] and list(v) == [0.3]  # 4 evaluations had finished when it was logged
    _, paths = write_report(lat.run_dir, out_dir=str(out))
    assert (
        "coverage" not in paths
        and not (out / "coverage.png").exists()
        and not (out / "pit_histogram.png").exists()
    )


def test_utilization_counts_each_sessions_own_slots_and_cuts_the_gap_between_sessions(tmp_path):
    """A resume with fewer slots (another cluster, or `max_concurrent` edited) counts each session's slots
    over that session only (so U stays at most 1), and the utilization plot's bins leave out the wait for the
    resume. Two fully busy sessions, 2 slots then 1, 990 s apart: U is 1, and no bin of the plot lies in the
    gap."""
    from orchestrator.report import utilization_series

    cfg = load_config({"name": "two", "objective": {"name": "forrester"}, "budget": 3, "batch_size": 1,
                       "initial_design": 3}).to_dict()
    store = RunStore.create(str(tmp_path / "two"), cfg)
    evs = [Event("refit", time=1000.5, info={"seconds": 0.1, "slots": 2}),
           Event("refit", time=2000.5, info={"seconds": 0.1, "slots": 1})]
    for i, (session, lo) in enumerate([(1000.0, 1001.0), (1000.0, 1001.0), (2000.0, 2001.0)]):
        evs.append(Event("proposed", trial_id=f"t{i}", batch_id=i, time=lo - 0.5, params={"x": 0.5}, x=[0.5]))
        evs.append(Event("started", trial_id=f"t{i}", time=lo, started_at=lo))
        evs.append(
            Event(
                "completed",
                trial_id=f"t{i}",
                time=lo + 10,
                value=0.1,
                started_at=lo,
                ended_at=lo + 10,
                info={"session": session},
            )
        )
    store.append(evs)
    m = compute_metrics(store.events(), store.config)
    assert m.span_s == pytest.approx(20.0) and m.busy_s == pytest.approx(30.0)
    assert m.utilization == pytest.approx(1.0)
    assert m.slots_source == "recorded per session: 2, 1"
    centres, busy = utilization_series(intervals_of(store), m.slots, bins=10, pieces=m.session_slots)
    assert centres.max() < 20.0 and np.allclose(busy, 1.0)
    assert m.queue_depth_mean < 1.0  # the 990 s wait is not queue time
    write_report(store.run_dir)


def intervals_of(store):
    from orchestrator.report import intervals
    from orchestrator.store import trials_table

    return intervals(trials_table(store.events()))


def test_summary_csv_keeps_every_parameter_of_the_best_point_and_names_its_trial(tmp_path):
    """summary.csv holds the best point's parameters in full, every digit, and names its trial; the terminal
    summary keeps its short form."""
    names = [f"quad_{i:02d}_strength" for i in range(16)]
    cfg = load_config({"name": "wide", "objective": {"name": "forrester"}, "budget": 2, "batch_size": 1,
                       "initial_design": 2}).to_dict()
    store = RunStore.create(str(tmp_path / "wide"), cfg)
    params = {n: 0.123456789 + i for i, n in enumerate(names)}
    store.append(
        [
            Event("proposed", trial_id="best-one", batch_id=0, time=1.0, params=params, x=[0.5] * 16),
            Event("completed", trial_id="best-one", time=3.0, value=-1.0, started_at=2.0, ended_at=3.0),
        ]
    )
    _, paths = write_report(store.run_dir)
    rows = dict(csv.reader(open(paths["summary"])))
    assert rows["best observed trial"] == "best-one"
    assert json.loads(rows["best observed params"]) == params
    assert "..." in format_summary(compute_metrics(store.events(), store.config))


def test_review_of_the_report_change_failures_sessions_and_temporary_files(tmp_path, monkeypatch):
    """(1) `info["n"]` counts completed results, so with failures among the finished ones the prediction is
    drawn where the fit's results end; (2) a session that recorded no result (a resume stopped at once) does
    not give its slots to the one before; (3) a log without sessions keeps its own slots beside a resume's,
    and U stays at most 1; (4) a failed atomic write leaves no temporary file behind."""
    import orchestrator.report.writer as R
    from orchestrator.report import predicted_series
    from orchestrator.store import trials_table

    # (1) six finish, every other one fails; the refit on 3 completed results came after all six
    evs = []
    for i in range(6):
        evs.append(Event("proposed", trial_id=f"t{i}", batch_id=i, time=float(i), params={"x": 0.5}, x=[0.5]))
        kind = "completed" if i % 2 else "failed"
        evs.append(
            Event(
                kind,
                trial_id=f"t{i}",
                time=10.0 + i,
                value=0.1 if kind == "completed" else None,
                started_at=9.0 + i,
                ended_at=10.0 + i,
                error=None if kind == "completed" else "exception",
            )
        )
    evs.append(Event("refit", time=20.0, info={"n": 3, "best_predicted": 0.2}))
    n, _, _ = predicted_series(evs, trials_table(evs))
    assert list(n) == [6.0]  # the 3rd completed result was the 6th to finish

    # (2) sessions of 2 slots (busy), 8 slots (no result), 1 slot (busy); (3) the first without `session`
    for first_session in (1000.0, None):
        cfg = load_config({"name": "s", "objective": {"name": "forrester"}, "budget": 3, "batch_size": 1,
                           "initial_design": 3}).to_dict()
        store = RunStore.create(str(tmp_path / f"s{first_session}"), cfg)
        tagged = {} if first_session is None else {"session": first_session}
        evs = [Event("refit", time=1000.5, info={"slots": 2, **tagged}),
               Event("refit", time=1500.5, info={"slots": 8, "session": 1500.0}),
               Event("refit", time=2000.5, info={"slots": 1, "session": 2000.0})]
        for i, (session, lo) in enumerate(
            [(first_session, 1001.0), (first_session, 1001.0), (2000.0, 2001.0)]
        ):
            evs.append(
                Event("proposed", trial_id=f"t{i}", batch_id=i, time=lo - 0.5, params={"x": 0.5}, x=[0.5])
            )
            evs.append(Event("completed", trial_id=f"t{i}", time=lo + 10, value=0.1, started_at=lo,
                             ended_at=lo + 10, info={} if session is None else {"session": session}))
        store.append(evs)
        m = compute_metrics(store.events(), store.config)
        assert m.utilization == pytest.approx(1.0), first_session
        assert m.slots_source == "recorded per session: 2, 1"

    # (4)
    def full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(R.os, "replace", full)
    with pytest.raises(OSError):
        R._write_atomic(str(tmp_path / "t.csv"), b"x")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("t.csv")] == []
