"""A run's trials as a DataFrame (orchestrator/store/frame.py): `qbatch.read_trials(run_dir)` and
`AskTellOptimizer.trials_dataframe()` give one row per trial with typed parameter columns, the source, the
times, the node, the failure reason and message, and one column per metric; the log is read by its rule, so a
compaction, finished or cut short by a crash, never counts a trial twice."""

from __future__ import annotations

import pandas as pd
import pyarrow.dataset as ds
import pytest

from orchestrator.ask_tell import AskTellOptimizer
from orchestrator.store import Event, RunStore
from orchestrator.store.frame import COLUMNS, read_trials

SPACE = {
    "lr": {"type": "float", "low": 1e-4, "high": 1.0, "log": True},
    "layers": {"type": "int", "low": 1, "high": 8, "step": 1, "log": False},
    "act": {"type": "choice", "choices": ["relu", "tanh"]},
    "shape": {"type": "choice", "choices": [[1, 2], [3]]},
}
PARAMS = [{"lr": 0.01, "layers": 2, "act": "relu", "shape": [1, 2]},
          {"lr": 0.1, "layers": 5, "act": "tanh", "shape": [3]},
          {"lr": 0.5, "layers": 8, "act": "relu", "shape": [3]},
          {"lr": 0.001, "layers": 1, "act": "tanh", "shape": [1, 2]}]
EXPECTED = [*COLUMNS[:4], "param_lr", "param_layers", "param_act", "param_shape", *COLUMNS[4:], "metric_loss",
            "metric_note"]


def _events() -> list[Event]:
    """Four trials: 0-0 completed with metrics, 0-1 failed (exception), 0-2 running, 0-3 only proposed; 0-0
    also has a late duplicate result, which the replay ignores."""
    evs = []
    for i, p in enumerate(PARAMS):
        evs.append(Event("proposed", f"0-{i}", time=100.0 + i, batch_id=0, params=p, x=[0.1 * i] * 4,
                         info={"source": "sobol" if i < 2 else "model", "seed": i}))
    for i in range(3):
        evs.append(
            Event(
                "started",
                f"0-{i}",
                time=110.0 + i,
                batch_id=0,
                started_at=110.0 + i,
                node_id=f"node{i}",
                pid=40 + i,
                attempt=0,
            )
        )
    evs.append(
        Event(
            "completed",
            "0-0",
            time=120.0,
            value=1.25,
            started_at=110.0,
            ended_at=118.5,
            node_id="node0",
            pid=40,
            info={"metrics": {"loss": 0.5, "note": "ok"}},
        )
    )
    evs.append(Event("failed", "0-1", time=121.0, error="exception", traceback="Traceback "
                                                                               "...", started_at=111.0,
                     ended_at=112.0, node_id="node1", pid=41,
                     info={"message": "ValueError: bad lr", "metrics": {"loss": 2.0, "note": [1, 2]}}))
    evs.append(Event("completed", "0-0", time=130.0, value=9.0, started_at=110.0, ended_at=129.0))
    return evs


def _store(tmp_path, one_segment_per_event: bool = True) -> RunStore:
    store = RunStore.create(str(tmp_path / "run"), {"name": "frame", "space": SPACE})
    store.compact_files = 10_000  # no auto-compaction: the tests compact when they mean to
    evs = _events()
    for ev in evs if one_segment_per_event else [evs]:
        store.append([ev] if one_segment_per_event else ev)
    return store


def test_one_row_per_trial_with_typed_columns(tmp_path):
    store = _store(tmp_path)
    df = read_trials(store.run_dir)
    assert list(df.columns) == EXPECTED
    assert list(df["trial_id"]) == ["0-0", "0-1", "0-2", "0-3"]
    assert list(df["state"]) == ["completed", "failed", "running", "proposed"]
    assert df["value"].dtype == "float64" and df["value"][0] == 1.25 and df["value"][1:].isna().all()
    assert df["param_lr"].dtype == "float64" and list(df["param_lr"]) == [p["lr"] for p in PARAMS]
    assert df["param_layers"].dtype == "Int64" and list(df["param_layers"]) == [2, 5, 8, 1]
    assert isinstance(df["param_act"].dtype, pd.CategoricalDtype)
    assert list(df["param_act"].cat.categories) == ["relu", "tanh"] and list(df["param_act"]) == [
        "relu", "tanh", "relu", "tanh"]
    # lists: no category holds them
    assert df["param_shape"].dtype == object and df["param_shape"][0] == [1, 2]
    assert list(df["source"]) == ["sobol", "sobol", "model", "model"]
    assert df["batch_id"].dtype == "Int64" and df["attempt"].dtype == "Int64"
    for col in ("proposed", "started", "finished"):
        assert pd.api.types.is_datetime64_any_dtype(df[col]) and str(df[col].dt.tz) == "UTC"
    assert df["proposed"][0] == pd.Timestamp(100.0, unit="s", tz="UTC")
    assert df["started"][2] == pd.Timestamp(112.0, unit="s", tz="UTC") and pd.isna(df["finished"][2])
    assert df["duration_s"].dtype == "float64" and df["duration_s"][0] == pytest.approx(8.5)
    assert list(df["node"][:3]) == ["node0", "node1", "node2"] and pd.isna(df["node"][3])
    assert df["metric_loss"].dtype == "float64" and list(df["metric_loss"][:2]) == [0.5, 2.0]
    assert df["metric_note"].dtype == object and df["metric_note"][1] == [1, 2]


def test_a_failed_trial_has_its_reason_and_message(tmp_path):
    df = read_trials(_store(tmp_path).run_dir)
    failed = df[df["state"] == "failed"]
    assert len(failed) == 1
    row = failed.iloc[0]
    assert row["failure_reason"] == "exception" and row["failure_message"] == "ValueError: bad lr"
    assert pd.isna(row["value"])
    assert df["failure_reason"].isna().sum() == 3  # only a failed trial has a reason


def test_counts_after_a_compaction_and_after_one_cut_short(tmp_path):
    store = _store(tmp_path)
    events_dir = tmp_path / "run" / "events"
    before = read_trials(store.run_dir)
    segments = {p.name: p.read_bytes() for p in events_dir.iterdir()}
    assert len(segments) == len(_events())
    assert store.compact() == len(segments)
    assert len(list(events_dir.iterdir())) == 1
    pd.testing.assert_frame_equal(read_trials(store.run_dir), before)
    # a compaction that died before deleting its sources leaves every row twice on disk
    for name, data in segments.items():
        (events_dir / name).write_bytes(data)
    naive = ds.dataset(str(events_dir), format="parquet").to_table()
    assert naive.num_rows == 2 * len(_events())  # what a read that ignores `seq` would count
    after = read_trials(store.run_dir)
    pd.testing.assert_frame_equal(after, before)
    assert after["state"].value_counts().to_dict() == {
        "completed": 1,
        "failed": 1,
        "running": 1,
        "proposed": 1,
    }


def test_a_run_in_one_segment_reads_the_same(tmp_path):
    a = read_trials(_store(tmp_path / "a").run_dir)
    b = read_trials(_store(tmp_path / "b", one_segment_per_event=False).run_dir)
    pd.testing.assert_frame_equal(a, b)


def test_a_new_run_has_the_columns_and_no_rows(tmp_path):
    store = RunStore.create(str(tmp_path / "run"), {"name": "empty", "space": SPACE})
    df = read_trials(store.run_dir)
    assert len(df) == 0
    assert list(df.columns) == [
        *COLUMNS[:4],
        "param_lr",
        "param_layers",
        "param_act",
        "param_shape",
        *COLUMNS[4:],
    ]
    assert df["param_layers"].dtype == "Int64"


def test_a_damaged_segment_is_read_as_far_as_intact_with_a_warning(tmp_path):
    store = _store(tmp_path)
    last = sorted((tmp_path / "run" / "events").iterdir())[-2]  # 0-1's failed result
    last.write_bytes(b"not parquet")
    with pytest.warns(UserWarning, match="damaged"):
        df = read_trials(store.run_dir)
    assert list(df["state"]) == ["completed", "running", "running", "proposed"]


def test_the_optimizer_frame_has_the_same_columns():
    space = {k: v for k, v in SPACE.items()}
    opt = AskTellOptimizer(space, initial_design=4)
    trials = opt.ask(4)
    opt.tell(trials[0].trial_id, 2.5)
    opt.tell(trials[1].trial_id, float("nan"))
    opt.tell(trials[2].trial_id, None, error="timeout", message="timeout after 5 s")
    opt.tell_point(PARAMS[0], 3.0)
    df = opt.trials_dataframe()
    assert list(df.columns) == [
        *COLUMNS[:4],
        "param_lr",
        "param_layers",
        "param_act",
        "param_shape",
        *COLUMNS[4:],
    ]
    assert list(df["trial_id"]) == [t.trial_id for t in trials] + ["user-0"]
    assert list(df["state"]) == ["completed", "failed", "failed", "pending", "completed"]
    assert list(df["value"][[0, 4]]) == [2.5, 3.0]
    assert list(df["failure_reason"][1:3]) == ["nan", "timeout"]
    assert df["failure_message"][2] == "timeout after 5 s"
    assert list(df["source"]) == ["sobol"] * 4 + ["user"]
    assert df["param_layers"].dtype == "Int64" and isinstance(df["param_act"].dtype, pd.CategoricalDtype)
    assert list(df["param_layers"]) == [t.params["layers"] for t in trials] + [2]
    assert df["started"].isna().all() and df["node"].isna().all()  # the optimizer does not see times or nodes


def test_a_minimizing_optimizer_reports_values_in_the_users_units():
    opt = AskTellOptimizer({"x": {"type": "float", "low": 0.0, "high": 1.0}}, direction="minimize",
                           initial_design=2)
    t = opt.ask(1)[0]
    opt.tell(t.trial_id, 4.0)
    assert opt.trials_dataframe()["value"][0] == 4.0

