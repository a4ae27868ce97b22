"""Tests of the run directory and Parquet event log (orchestrator/store.py).

Like Optuna's STORAGE_MODES (STYLE.md §4.12), the contract tests run over every store mode: a fresh run,
a resumed run, a run whose last write was torn, and the same log through a `file://` URI and two pyarrow
filesystems (a SubTreeFileSystem over the local disk and pyarrow's in-memory mock filesystem).
"""

from __future__ import annotations

import errno
import io
import json
import math
import os
import pickle
from pathlib import Path

import numpy as np
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from orchestrator import store as store_mod
from orchestrator.errors import QbatchError
from orchestrator.store import Event, RunDirError, RunStore, StoreError, status_counts, trials_table

CONFIG = {"name": "t", "objective": {"name": "forrester", "options": {}}, "tau": 0.2, "batch_size": 4}
MODES = ["fresh", "resumed", "torn", "torn-segment", "file-uri", "subtree-fs", "mock-fs"]


def _base_events(n: int = 3) -> list[Event]:
    return [
        Event("proposed", f"0-{i}", time=100.0 + i, batch_id=0, params={"a": i}, x=[i / 10]) for i in range(n)
    ]


class Supplier:
    """Builds a store in one mode and reopens it the way that mode's backend needs."""

    def __init__(self, mode: str, tmp_path: Path) -> None:
        self.mode = mode
        self.filesystem = None
        if mode == "file-uri":
            self.run_dir = (tmp_path / "run").as_uri()
        elif mode == "subtree-fs":
            (tmp_path / "root").mkdir()
            self.filesystem = pafs.SubTreeFileSystem(str(tmp_path / "root"), pafs.LocalFileSystem())
            self.run_dir = "runs/run"
        elif mode == "mock-fs":
            self.filesystem = pafs._MockFileSystem()
            self.run_dir = "bucket/run"
        else:
            self.run_dir = str(tmp_path / "run")
        self.prior: list[Event] = []
        self.damaged = 0  # damage lines every reopen must report

    def make(self) -> RunStore:
        s = RunStore.create(self.run_dir, CONFIG, filesystem=self.filesystem)
        if self.mode in ("resumed", "torn", "torn-segment"):
            self.prior = _base_events()
            s.append(self.prior)
            if self.mode == "torn":  # a crash mid-append leaves an unfinished temporary file
                Path(self.run_dir, "events", ".tmp-deadbeef").write_bytes(b"PAR1\x00\x01partial")
            # the last segment was cut short (non-atomic filesystem, bad disk)
            if self.mode == "torn-segment":
                s.append([Event("completed", "0-0", value=1.0), Event("completed", "0-1", value=2.0)])
                seg = Path(self.run_dir, "events", "seg-000000000003-000000000004.parquet")
                seg.write_bytes(seg.read_bytes()[:-40])
                self.damaged = 1
            s = self.reopen()
            assert len(s.damage) == self.damaged
        return s

    def reopen(self) -> RunStore:
        return RunStore.open(self.run_dir, filesystem=self.filesystem)


@pytest.fixture(params=MODES)
def supplier(request, tmp_path) -> Supplier:
    return Supplier(request.param, tmp_path)


def _full_event(i: int) -> Event:
    return Event(
        kind="completed",
        trial_id=f"3-{i}",
        time=1234.5 + i,
        batch_id=3,
        params={"lr": 1e-3, "layers": 4, "act": "relu", "flag": True, "nested": {"k": [1, 2.5, None]}},
        x=[0.0, 0.25, 1.0],
        value=-2.75 + i,
        forecast={
            "family": "asymmetric_laplace",
            "tau": 0.1,
            "mu_f": 1.0,
            "var_f": 0.5,
            "mu_g": -1.0,
            "var_g": 0.1,
        },
        node_id="node-abc",
        pid=4242,
        started_at=1200.0,
        ended_at=1234.0,
        attempt=2,
        error=None,
        traceback="Traceback (most recent call last):\n  ...\nValueError: x",
        info={"metrics": {"train_loss": 0.3}, "nan": float("nan")},
    )


def _same(a: Event, b: Event) -> bool:
    da, db = a.__dict__, b.__dict__
    return json.dumps(da, sort_keys=True) == json.dumps(db, sort_keys=True)


# ------------------------------------------------------------------ contract tests over every mode
def test_round_trip_every_field(supplier):
    s = supplier.make()
    evs = [
        _full_event(0),
        Event("failed", "3-1", time=5.0, error="timeout", ended_at=6.0),
        Event("refit", info={"fit_s": 0.1}),
    ]
    s.append(evs)
    got = supplier.reopen().events()
    assert len(got) == len(supplier.prior) + 3
    for a, b in zip(supplier.prior + evs, got):
        assert _same(a, b), (a, b)
    nan = got[len(supplier.prior)].info["nan"]
    assert math.isnan(nan)
    # every Event field was set to a non-default value in the full event, so every column is exercised
    full = got[len(supplier.prior)]
    assert all(getattr(full, f) is not None for f in store_mod._EVENT_FIELDS if f != "error")


def test_append_then_reopen_keeps_order_and_no_damage(supplier):
    s = supplier.make()
    for i in range(5):
        s.append([Event("started", f"0-{i}", time=200.0 + i, started_at=200.0 + i, node_id="n1")])
    r = supplier.reopen()
    assert [e.trial_id for e in r.events()] == [e.trial_id for e in supplier.prior] + [
        f"0-{i}" for i in range(5)
    ]
    assert len(r.damage) == supplier.damaged
    assert r.config == CONFIG
    assert r.events(kinds=["started"])[0].node_id == "n1"


def test_resumed_store_continues_sequence(supplier):
    s = supplier.make()
    s.append(_base_events(2))
    r = supplier.reopen()
    r.append([Event("refit", info={"n": 1})])
    assert len(supplier.reopen().events()) == len(supplier.prior) + 3


def test_compaction_keeps_every_event_once(supplier):
    s = supplier.make()
    s.compact_files = 8
    for i in range(30):
        s.append([Event("proposed", f"c-{i}", time=float(i))])
    n_files = len([n for n in _listdir(supplier, "events") if n.startswith("seg-")])
    assert n_files < 16, n_files
    evs = supplier.reopen().events()
    assert [e.trial_id for e in evs] == [e.trial_id for e in supplier.prior] + [f"c-{i}" for i in range(30)]
    s.compact()
    # one merged segment; a damaged segment is never merged away (its loss stays reported)
    assert len([n for n in _listdir(supplier, "events") if n.startswith("seg-")]) == 1 + supplier.damaged
    assert len(supplier.reopen().events()) == len(supplier.prior) + 30


def test_exactly_once_replay(supplier):
    s = supplier.make()
    s.append([Event("proposed", "9-0", params={"a": 1}, x=[0.5], batch_id=9, forecast={"mu_f": 0.0})])
    s.append([Event("started", "9-0", started_at=10.0, node_id="A")])
    s.append([Event("completed", "9-0", value=1.5, started_at=10.0, ended_at=11.0, node_id="A")])
    # a retry's duplicate
    s.append([Event("completed", "9-0", value=99.0, started_at=10.0, ended_at=12.0, node_id="B")])
    s.append([Event("failed", "9-0", error="worker-lost")])
    s.append([Event("proposed", "9-1", params={"a": 2}), Event("started", "9-1", started_at=11.0)])
    s.append([Event("proposed", "9-2", params={"a": 3})])
    trials = {t.trial_id: t for t in trials_table(supplier.reopen().events())}
    t = trials["9-0"]
    assert (t.status, t.value, t.node_id, t.duplicates, t.ended_at) == ("completed", 1.5, "A", 2, 11.0)
    assert t.params == {"a": 1} and t.x == [0.5] and t.batch_id == 9 and t.forecast == {"mu_f": 0.0}
    assert trials["9-1"].status == "running" and trials["9-2"].status == "proposed"
    counts = status_counts(list(trials.values()))
    assert counts["completed"] == 1 and counts["running"] == 1


def test_create_refuses_existing_run_and_open_needs_one(supplier):
    supplier.make()
    with pytest.raises(StoreError, match="already holds a run"):
        RunStore.create(supplier.run_dir, CONFIG, filesystem=supplier.filesystem)
    with pytest.raises(StoreError, match="no run at"):
        RunStore.open(supplier.run_dir + "-missing", filesystem=supplier.filesystem)


def test_checkpoints_round_trip(supplier):
    s = supplier.make()
    state = {
        "model": {"w": torch.arange(6, dtype=torch.float64).reshape(2, 3)},
        "step": 3,
        "names": ["a", "b"],
    }
    s.save_checkpoint("actor", state)
    s.save_checkpoint("calibrator", {"alpha": 0.1, "history": [1.0, 2.0]})
    r = supplier.reopen()
    got = r.load_checkpoint("actor")
    assert (
        torch.equal(got["model"]["w"], state["model"]["w"])
        and got["step"] == 3
        and got["names"] == ["a", "b"]
    )
    assert r.load_checkpoint("calibrator") == {"alpha": 0.1, "history": [1.0, 2.0]}
    assert r.load_checkpoint("missing") is None
    assert r.checkpoints() == ["actor", "calibrator"]
    r.save_checkpoint("actor", {"step": 4})  # switching format removes the stale file
    assert supplier.reopen().load_checkpoint("actor") == {"step": 4}


def test_a_crash_while_switching_checkpoint_format_leaves_no_stale_checkpoint(supplier, monkeypatch):
    """A .pt checkpoint replaced by a JSON one: were the write to die before the old file is removed, the
    stale .pt (which loads first) would pass for the current state. The old file goes first instead."""
    s = supplier.make()
    s.save_checkpoint("model", {"w": torch.ones(2), "step": 1})

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(s._fs, "write_atomic", crash)
    with pytest.raises(OSError):
        s.save_checkpoint("model", {"step": 2})
    assert supplier.reopen().load_checkpoint("model") is None


# ------------------------------------------------------------------ local-disk guarantees
def _listdir(supplier: Supplier, rel: str) -> list[str]:
    s = supplier.reopen()
    return s._fs.listdir(rel)


def test_config_yaml_is_plain_yaml(tmp_path):
    s = RunStore.create(str(tmp_path / "r"), CONFIG)
    assert yaml.safe_load((tmp_path / "r" / "config.yaml").read_text()) == CONFIG
    assert s.durable_fsync


@pytest.fixture
def fsynced(monkeypatch) -> list[str]:
    """The paths `os.fsync` is called on from now on, in order."""
    synced: list[str] = []
    real_fsync = os.fsync

    def spy(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return synced


def test_append_is_fsynced_before_return(tmp_path, fsynced):
    s = RunStore.create(str(tmp_path / "r"), CONFIG)
    fsynced.clear()
    synced = fsynced
    s.append(_base_events(2))
    seg = [n for n in os.listdir(tmp_path / "r" / "events") if n.startswith("seg-")]
    assert seg == ["seg-000000000000-000000000001.parquet"]
    # the data file (under its temporary name) and then the events folder were fsynced
    assert len(synced) == 2 and ".tmp-" in synced[0] and synced[1] == str(tmp_path / "r" / "events")


def test_crash_mid_write_leaves_segment_absent(tmp_path, monkeypatch):
    s = RunStore.create(str(tmp_path / "r"), CONFIG)
    s.append(_base_events(2))
    real_write = os.write

    def dying_write(fd, data):
        real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError("disk died")

    monkeypatch.setattr(os, "write", dying_write)
    with pytest.raises(OSError, match="disk died"):
        s.append([Event("completed", "0-0", value=1.0)])
    monkeypatch.setattr(os, "write", real_write)
    names = os.listdir(tmp_path / "r" / "events")
    assert names == ["seg-000000000000-000000000001.parquet"], names  # complete or absent, no leftovers
    r = RunStore.open(str(tmp_path / "r"))
    assert len(r.events()) == 2 and r.damage == []
    r.append([Event("completed", "0-0", value=1.0)])
    assert len(RunStore.open(str(tmp_path / "r")).events()) == 3


def test_invalid_event_names_field_and_writes_nothing(tmp_path):
    s = RunStore.create(str(tmp_path / "r"), CONFIG)
    with pytest.raises(StoreError, match=r"events\[1\]\.kind must be one of"):
        s.append([Event("proposed", "a"), Event("exploded", "b")])
    with pytest.raises(StoreError, match=r"events\[0\]\.value must be a number"):
        s.append([Event("completed", "a", value="1.0")])
    with pytest.raises(StoreError, match=r"info\['obj'\] holds a object"):
        s.append([Event("refit", info={"obj": object()})])
    # a StoreError naming them, not pyarrow's OverflowError / a UnicodeEncodeError
    with pytest.raises(StoreError, match=r"events\[0\]\.pid must fit in a signed 64-bit integer; got "
                                         r"18446744073709551616"):
        s.append([Event("completed", "a", value=1.0, pid=2**64)])
    with pytest.raises(StoreError, match=r"events\[0\]\.batch_id must fit in a signed 64-bit integer"):
        s.append([Event("proposed", "a", batch_id=1e20)])
    with pytest.raises(StoreError, match=r"events\[0\]\.trial_id must be UTF-8 text"):
        s.append([Event("proposed", "a\udcff")])
    assert os.listdir(tmp_path / "r" / "events") == []
    s.append(
        [Event("completed", "a", value=np.float32(1.5), x=np.array([0.5, 0.25]), params={"k": np.int64(3)})]
    )
    ev = RunStore.open(str(tmp_path / "r")).events()[0]
    assert ev.value == 1.5 and ev.x == [0.5, 0.25] and ev.params == {"k": 3}


def test_text_that_is_not_utf8_is_written_escaped(tmp_path):
    """A lone surrogate (an undecodable file name in an objective's message) is not UTF-8: Parquet would
    refuse the whole segment, losing the batch's other results, and every resume would crash again."""
    bad = "ValueError: cannot parse /data/run-" + os.fsdecode(b"\xff") + ".csv"
    s = RunStore.create(str(tmp_path / "r"), CONFIG)
    s.append([Event("failed", "0-0", error="exception", traceback=bad, node_id=bad),
              Event("completed", "0-1", value=1.0)])
    got = RunStore.open(str(tmp_path / "r")).events()
    assert [e.trial_id for e in got] == ["0-0", "0-1"]
    assert got[0].traceback == got[0].node_id == "ValueError: cannot parse /data/run-\\udcff.csv"


def test_two_writers_never_overwrite_a_segment(tmp_path):
    a = RunStore.create(str(tmp_path / "r"), CONFIG)
    b = RunStore.open(str(tmp_path / "r"))
    a.append([Event("proposed", "x")])
    with pytest.raises(StoreError, match="already exists"):
        b.append([Event("proposed", "y")])
    assert [e.trial_id for e in RunStore.open(str(tmp_path / "r")).events()] == ["x"]


def test_one_writer_at_a_time_and_a_dead_writer_frees_the_lock(tmp_path):
    """Two writers of one log number their segments on from what each has read, and a reader kept one of two
    events with the same number: a second resume of a running run would lose results silently.
    The writer lock refuses the second writer, naming the first; the OS frees it when its process dies."""
    import signal
    import subprocess
    import sys

    rd = str(tmp_path / "r")
    a = RunStore.create(rd, CONFIG)
    a.lock_writer()
    b = RunStore.open(rd)
    with pytest.raises(StoreError, match=rf"being written by another run \(pid {os.getpid()} on "):
        b.lock_writer()
    with pytest.raises(StoreError, match="being written by another run"):
        RunStore.check_writer_free(rd)
    a.unlock_writer()
    RunStore.check_writer_free(rd)
    b.lock_writer()
    b.append([Event("proposed", "x")])
    b.unlock_writer()
    code = ("import sys, time; from orchestrator.store import RunStore; s = RunStore.open(sys.argv[1]); "
            "s.lock_writer(); print('locked', flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code, rd], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "locked"
        with pytest.raises(StoreError, match=rf"pid {child.pid} on "):
            RunStore.check_writer_free(rd)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    RunStore.check_writer_free(rd)  # a crash leaves no stale lock
    assert [e.trial_id for e in RunStore.open(rd).events()] == ["x"]


def test_a_create_that_died_before_its_config_leaves_a_folder_a_new_run_may_use(tmp_path, monkeypatch):
    """`create` makes events/ and checkpoints/ before config.yaml; a failure in between (ENOSPC) must not
    leave a folder that is neither a run (resume refused) nor new (run refused), for the user to delete."""
    rd = str(tmp_path / "r")
    real = store_mod._Local.write_atomic

    def full_disk(self, rel, data, exclusive=False):
        if rel == "config.yaml":
            raise OSError(28, "No space left on device")
        return real(self, rel, data, exclusive)

    monkeypatch.setattr(store_mod._Local, "write_atomic", full_disk)
    with pytest.raises(RunDirError, match="No space left on device"):
        RunStore.create(rd, CONFIG)
    monkeypatch.setattr(store_mod._Local, "write_atomic", real)
    assert not os.path.exists(rd)  # what the failed create made is removed again
    RunStore.check_new(rd)
    RunStore.create(rd, CONFIG).append([Event("proposed", "x")])
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "events").mkdir()
    (tmp_path / "other" / "events" / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match="already holds"):
        RunStore.check_new(str(tmp_path / "other"))


def test_check_new_leaves_no_folder_behind(tmp_path):
    """`check_new` probes that a run dir can be made: it used to leave the missing parents (e.g. `runs/`)
    behind, so a run refused afterwards (a bad `--address`) had created something."""
    RunStore.check_new(str(tmp_path / "runs" / "a" / "b"))
    assert os.listdir(tmp_path) == []
    (tmp_path / "keep").mkdir()
    RunStore.check_new(str(tmp_path / "keep" / "new"))
    assert os.listdir(tmp_path) == ["keep"] and os.listdir(tmp_path / "keep") == []


def test_conflicting_overlap_of_two_writers_is_reported_and_never_compacted(tmp_path):
    """Two writers that opened the log at the same length write different events under the same sequence
    numbers (segment names differ when their batches do). Overlaps are otherwise exact copies (a compaction
    that died before deleting its inputs); a conflicting one is damage: named, the same winner on every
    read, and left out of compaction so the losing rows stay on disk."""
    rd = str(tmp_path / "r")
    first = RunStore.create(rd, CONFIG)
    first.append(_base_events(3))  # seq 0-2
    second = RunStore.open(rd)
    first.append([Event("completed", "0-0", value=1.0)])  # seq 3
    second.append([Event("completed", "0-0", value=2.0), Event("completed", "0-1", value=5.0)])  # seq 3-4
    reader = RunStore.open(rd)
    values = [e.value for e in reader.events(["completed"])]
    assert values == [1.0, 5.0]  # seq 3 from seg-3-3 (sorted first), seq 4 only in the second writer's
    assert reader.damage == [
        "events/seg-000000000003-000000000004.parquet: 1 event(s) with sequence number(s) 3 differ from "
        "those in events/seg-000000000003-000000000003.parquet (two writers on one run?); kept "
        "events/seg-000000000003-000000000003.parquet's"
    ]
    reader.compact()
    assert "seg-000000000003-000000000004.parquet" in os.listdir(os.path.join(rd, "events"))
    again = RunStore.open(rd)
    assert [e.value for e in again.events(["completed"])] == [1.0, 5.0] and len(again.damage) == 1
    # an exact overlap is no damage
    exact = str(tmp_path / "exact")
    s = RunStore.create(exact, CONFIG)
    s.append(_base_events(2))
    s.append([Event("completed", "0-0", value=1.0, time=7.0)])
    seg = os.path.join(exact, "events", "seg-000000000002-000000000002.parquet")
    with open(seg, "rb") as fh:
        data = fh.read()
    with open(os.path.join(exact, "events", "seg-000000000002-000000000003.parquet"), "wb") as fh:
        # the same row 2, in a segment that promises 2-3 (3 missing: that is damage of its own)
        fh.write(data)
    o = RunStore.open(exact)
    assert [e.value for e in o.events(["completed"])] == [1.0]
    assert not any("differ" in line for line in o.damage)


def test_conflict_winner_keeps_winning_after_a_later_writer_compacts(tmp_path):
    """Neither side of a conflict is merged: a later (single) writer's auto-compaction merging the winning
    segment into one named after the loser would change the replay from one read to the next."""
    rd = str(tmp_path / "r")
    a = RunStore.create(rd, CONFIG)
    a.append([Event("proposed", f"p-{i}", time=1.0) for i in range(1024)])  # a large segment: never "small"
    b = RunStore.open(rd)
    a.append([Event("completed", "p-0", value=1.0, time=2.0)])
    b.append([Event("completed", "p-0", value=2.0, time=2.0), Event("completed", "p-1", value=5.0, time=2.0)])
    w = RunStore.open(rd)
    w.compact_files = 4
    for i in range(8):
        w.append([Event("refit", time=3.0 + i)])
        r = RunStore.open(rd)
        assert [e.value for e in r.events(["completed"])] == [1.0, 5.0] and len(r.damage) == 1
    names = os.listdir(os.path.join(rd, "events"))
    assert {"seg-000000001024-000000001024.parquet", "seg-000000001024-000000001025.parquet"} <= set(names)


def test_a_long_lived_writer_does_not_compact_a_conflict_it_never_read(tmp_path):
    """The first writer keeps appending after a second one wrote over its numbers; its auto-compaction must
    not merge its side of the conflict (the merge would sort after the other side and flip the replay)."""
    rd = str(tmp_path / "r")
    a = RunStore.create(rd, CONFIG)
    a.compact_files = 4
    a.append([Event("proposed", f"p-{i}", time=1.0) for i in range(1024)])
    b = RunStore.open(rd)
    a.append([Event("completed", "p-0", value=1.0, time=2.0)])
    b.append([Event("completed", "p-0", value=2.0, time=2.0), Event("completed", "p-1", value=5.0, time=2.0)])
    a.append([Event("refit", time=3.0)])  # seq 1025 in a's count: a second conflict, with b's p-1
    first = RunStore.open(rd)
    assert [e.value for e in first.events(["completed"])] == [1.0, 5.0] and len(first.damage) == 2
    for i in range(8):  # a's auto-compaction (every 4 small segments) runs twice
        a.append([Event("refit", time=4.0 + i)])
        r = RunStore.open(rd)
        assert [e.value for e in r.events(["completed"])] == [1.0, 5.0] and r.damage == first.damage
    names = os.listdir(os.path.join(rd, "events"))
    assert {"seg-000000001024-000000001024.parquet", "seg-000000001025-000000001025.parquet"} <= set(names)


def test_append_after_a_crash_between_a_merge_and_its_deletes(tmp_path, monkeypatch, caplog):
    """After such a crash the merge (no longer small) is merged in by the next auto-compaction, whose merge of
    the same sources would otherwise collide with it by name ('already exists', with the append's batch
    already on disk). A failed compaction does not fail the append, so a collision would show only as its
    warning: checked below."""
    rd = str(tmp_path / "r")
    w = RunStore.create(rd, CONFIG)

    class Crash(Exception):
        pass

    for i in range(store_mod._COMPACT_FILES):
        if i == store_mod._COMPACT_FILES - 1:
            def boom(rel):
                raise Crash()
            monkeypatch.setattr(w._fs, "delete", boom)
        try:
            w.append([Event("proposed", f"t-{i}-{j}", time=1.0) for j in range(20)])
        except Crash:
            pass
    assert "failed (Crash" in caplog.text  # the simulated crash: reported, the batch kept
    caplog.clear()
    w = RunStore.open(rd)
    assert w.damage == []
    w.append([Event("proposed", f"u-{j}", time=1.0) for j in range(1024)])
    w.append([Event("refit", time=2.0)])
    again = RunStore.open(rd)
    assert again.damage == [] and len(again.events()) == store_mod._COMPACT_FILES * 20 + 1025
    assert "compacting the log" not in caplog.text


def test_check_new_cleans_up_after_a_refusal_and_beside_a_sibling(tmp_path):
    long = tmp_path / "np" / ("a" * 300) / "run"  # makedirs makes `np` and then fails on the long name
    with pytest.raises(RunDirError, match="cannot be created"):
        RunStore.check_new(str(long))
    assert os.listdir(tmp_path) == []
    # a sibling run under the same new parent keeps it
    (tmp_path / "runs" / "sibling").mkdir(parents=True)
    RunStore.check_new(str(tmp_path / "runs" / "mine"))
    assert sorted(os.listdir(tmp_path / "runs")) == ["sibling"]


def test_truncated_segment_keeps_others_and_reports_exact_loss(tmp_path):
    s = RunStore.create(str(tmp_path / "r"), CONFIG)
    s.append(_base_events(3))  # seq 0-2
    s.append([Event("completed", "0-0", value=1.0), Event("completed", "0-1", value=2.0)])  # seq 3-4
    s.append([Event("completed", "0-2", value=3.0)])  # seq 5
    seg = tmp_path / "r" / "events" / "seg-000000000003-000000000004.parquet"
    data = seg.read_bytes()
    seg.write_bytes(data[: len(data) // 2])  # a torn write on a non-atomic filesystem / disk damage
    r = RunStore.open(str(tmp_path / "r"))
    ids = [(e.kind, e.trial_id) for e in r.events()]
    assert ids == [("proposed", "0-0"), ("proposed", "0-1"), ("proposed", "0-2"), ("completed", "0-2")]
    assert len(r.damage) == 1
    assert "seg-000000000003-000000000004.parquet" in r.damage[0]
    assert "dropped 2 event(s) with sequence number(s) 3-4, kept 0" in r.damage[0]
    # the run continues: new events get fresh sequence numbers, damage stays reported
    r.append([Event("completed", "0-0", value=1.0)])
    r2 = RunStore.open(str(tmp_path / "r"))
    assert len(r2.events()) == 5 and len(r2.damage) == 1
    assert r2.compact() == 3  # the intact segments merge; the damaged one stays and is still reported
    r3 = RunStore.open(str(tmp_path / "r"))
    assert len(r3.events()) == 5 and "sequence number(s) 3-4" in r3.damage[0]


def test_corrupt_row_group_keeps_intact_row_groups(tmp_path):
    s = RunStore.create(str(tmp_path / "r"), CONFIG)
    n = 3 * store_mod._ROW_GROUP
    s.append([Event("proposed", f"t-{i}", params={"i": i}) for i in range(n)])
    seg = next((tmp_path / "r" / "events").iterdir())
    meta = pq.ParquetFile(seg).metadata
    assert meta.num_row_groups == 3
    col = meta.row_group(1).column(meta.schema.names.index("params"))
    offset = col.data_page_offset + col.total_compressed_size // 2
    data = bytearray(seg.read_bytes())
    for k in range(8):
        data[offset + k] ^= 0xFF
    seg.write_bytes(bytes(data))
    r = RunStore.open(str(tmp_path / "r"))
    rg = store_mod._ROW_GROUP
    kept = [int(e.trial_id.split("-")[1]) for e in r.events()]
    assert kept == list(range(rg)) + list(range(2 * rg, n))
    assert len(r.damage) == 1 and "row group 1" in r.damage[0]
    assert f"dropped {rg} event(s) with sequence number(s) {rg}-{2 * rg - 1}, kept {2 * rg}" in r.damage[0]


def test_crash_during_compaction_does_not_duplicate(tmp_path):
    s = RunStore.create(str(tmp_path / "r"), CONFIG)
    for i in range(4):
        s.append([Event("proposed", f"t-{i}")])
    events_dir = tmp_path / "r" / "events"
    saved = {p.name: p.read_bytes() for p in events_dir.iterdir()}
    assert s.compact() == 4
    for name, data in saved.items():  # as if the process died after the merge, before deleting the sources
        (events_dir / name).write_bytes(data)
    r = RunStore.open(str(tmp_path / "r"))
    assert [e.trial_id for e in r.events()] == [f"t-{i}" for i in range(4)] and r.damage == []
    assert r.compact() == 5
    assert [p.name for p in events_dir.iterdir()] == ["seg-000000000000-000000000003.parquet"]
    assert len(RunStore.open(str(tmp_path / "r")).events()) == 4


# ------------------------------------------------------------------ checkpoints never unpickle
class _Evil:
    def __reduce__(self):
        return (os.mkdir, (os.environ["QBATCH_EVIL_MARKER"],))


def test_malicious_checkpoint_is_not_unpickled(tmp_path, monkeypatch):
    s = RunStore.create(str(tmp_path / "r"), CONFIG)
    marker = tmp_path / "pwned"
    monkeypatch.setenv("QBATCH_EVIL_MARKER", str(marker))
    buf = io.BytesIO()
    torch.save({"w": torch.zeros(1), "evil": _Evil()}, buf)
    (tmp_path / "r" / "checkpoints" / "actor.pt").write_bytes(buf.getvalue())
    with pytest.raises(StoreError, match="cannot be loaded safely"):
        s.load_checkpoint("actor")
    assert not marker.exists()
    (tmp_path / "r" / "checkpoints" / "raw.pt").write_bytes(pickle.dumps(_Evil(), protocol=2))
    with pytest.raises(StoreError, match="cannot be loaded safely"):
        s.load_checkpoint("raw")
    assert not marker.exists()


def test_checkpoint_rejects_unsafe_types_and_names(tmp_path):
    s = RunStore.create(str(tmp_path / "r"), CONFIG)
    with pytest.raises(StoreError, match=r"checkpoint 'm'\['model'\]\['w'\] is a ndarray"):
        s.save_checkpoint("m", {"model": {"w": np.zeros(3)}})
    for bad in ("../escape", "", ".hidden", "a/b"):
        with pytest.raises(StoreError, match="checkpoint name"):
            s.save_checkpoint(bad, {"a": 1})
    assert os.listdir(tmp_path / "r" / "checkpoints") == []
    assert issubclass(StoreError, QbatchError)


# ------------------------------------------------------------------ property: damage never corrupts silently
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cut=st.one_of(st.none(), st.floats(min_value=0.0, max_value=0.999)),
    flips=st.lists(st.tuples(st.floats(min_value=0.0, max_value=0.999), st.integers(1, 255)), max_size=4),
)
def test_property_damaged_segment_keeps_exact_intact_records(tmp_path_factory, monkeypatch, cut, flips):
    monkeypatch.setattr(store_mod, "_ROW_GROUP", 8)  # small row groups keep each example fast
    root = tmp_path_factory.mktemp("prop") / "r"
    s = RunStore.create(str(root), CONFIG)
    s.append(_base_events(2))  # seq 0-1, left intact
    n = 2 * store_mod._ROW_GROUP + 17
    original = [_full_event(i) for i in range(n)]  # seq 2 .. n+1, three row groups
    s.append(original)
    seg = root / "events" / f"seg-000000000002-{n + 1:012d}.parquet"
    data = bytearray(seg.read_bytes())
    for pos, xor in flips:
        data[int(pos * len(data))] ^= xor
    if cut is not None:
        data = data[: int(cut * len(data))]
    seg.write_bytes(bytes(data))
    r = RunStore.open(str(root))
    events = r.events()
    assert [e.trial_id for e in events[:2]] == ["0-0", "0-1"]
    by_id = {e.trial_id: e for e in original}
    kept = events[2:]
    for ev in kept:  # whatever is kept is exactly what was written
        assert _same(ev, by_id[ev.trial_id])
    if len(kept) < n:
        assert len(r.damage) == 1 and f"dropped {n - len(kept)} event(s)" in r.damage[0]
        assert r.damage[0].endswith(f"kept {len(kept)}")
    else:
        assert r.damage == []


def test_a_failed_auto_compaction_does_not_fail_an_append_whose_segment_is_durable(
    tmp_path, monkeypatch, caplog
):
    """A compaction error (disk full writing the merged segment) does not come out of `append` once its own
    segment is durable: the actor would report the results unrecorded, and a retry would write them twice."""
    s = RunStore.create(str(tmp_path / "r"), CONFIG)
    s.compact_files = 3

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(s, "compact", full)
    for i in range(4):
        s.append([Event("completed", f"0-{i}", value=float(i))])  # the third and fourth try to compact
    assert "compacting the log" in caplog.text
    events = RunStore.open(str(tmp_path / "r")).events()
    assert [e.trial_id for e in events] == ["0-0", "0-1", "0-2", "0-3"]  # each once


def test_an_unreadable_segment_is_reported_and_the_rest_of_the_log_read(tmp_path):
    """An I/O error reading one segment (a bad sector; here a folder with a segment's name) is reported as
    that segment, rather than `events()` raising and open, status, report and resume all failing."""
    s = RunStore.create(str(tmp_path / "r"), CONFIG)
    for i in range(3):
        s.append([Event("completed", f"0-{i}", value=float(i))])  # seq 0, 1, 2
    seg = tmp_path / "r" / "events" / "seg-000000000001-000000000001.parquet"
    seg.unlink()
    seg.mkdir()
    r = RunStore.open(str(tmp_path / "r"))
    assert [e.trial_id for e in r.events()] == ["0-0", "0-2"]
    assert len(r.damage) == 1 and "seg-000000000001-000000000001.parquet" in r.damage[0], r.damage
    assert "unreadable (IsADirectoryError" in r.damage[0]


def test_a_transient_read_error_is_raised_not_read_as_damage(tmp_path, monkeypatch):
    """A transient EIO is raised, not read as damage (which would drop that segment's results and make a
    resume run their trials again, breaking exactly-once): the resume is refused and nothing is lost."""
    s = RunStore.create(str(tmp_path / "r"), CONFIG)
    for i in range(2):
        s.append([Event("completed", f"0-{i}", value=float(i))])
    real = store_mod._Local.read

    def flaky(self, rel):
        if rel.endswith("seg-000000000001-000000000001.parquet"):
            raise OSError(errno.EIO, "Input/output error")
        return real(self, rel)

    monkeypatch.setattr(store_mod._Local, "read", flaky)
    with pytest.raises(OSError, match="Input/output error"):
        RunStore.open(str(tmp_path / "r"))
    monkeypatch.setattr(store_mod._Local, "read", real)
    assert [e.trial_id for e in RunStore.open(str(tmp_path / "r")).events()] == ["0-0", "0-1"]


def test_damaged_segments_do_not_make_every_append_compact(tmp_path, monkeypatch):
    """Damaged segments do not count as small ones to merge (`compact` skips them): counted, once as many
    exist as `compact_files`, every append would compact (18.6 MB written for 1000 appends instead of 4.8)."""
    s = RunStore.create(str(tmp_path / "r"), CONFIG)
    for i in range(3):
        s.append([Event("completed", f"0-{i}", value=float(i))])
    for name in sorted(os.listdir(tmp_path / "r" / "events")):
        (tmp_path / "r" / "events" / name).write_bytes(b"PAR1 torn")
    r = RunStore.open(str(tmp_path / "r"))
    assert len(r.damage) == 3
    r.compact_files = 3
    calls = []
    real = r.compact
    monkeypatch.setattr(r, "compact", lambda names=None: calls.append(list(names or [])) or real(names))
    r.append([Event("completed", "1-0", value=1.0)])
    r.append([Event("completed", "1-1", value=1.0)])
    assert calls == []  # two intact small segments: nothing to merge yet
    r.append([Event("completed", "1-2", value=1.0)])
    assert len(calls) == 1 and len(calls[0]) == 3


def test_a_new_run_directory_is_fsynced_into_its_parents(tmp_path, fsynced):
    """The new run directory (and a new `runs/`) is fsynced in its parent, as the files, `events/` and
    `checkpoints/` are: otherwise, after a power loss the whole run could be gone on some filesystems."""
    synced = fsynced
    RunStore.create(str(tmp_path / "runs" / "r"), CONFIG)
    for folder in (tmp_path, tmp_path / "runs", tmp_path / "runs" / "r"):  # each holds a new entry
        assert str(folder) in synced, (folder, synced)
    assert synced.index(str(tmp_path)) < synced.index(str(tmp_path / "runs"))  # top down


def test_a_filesystem_without_flock_runs_without_a_writer_lock_and_says_so(tmp_path, monkeypatch, caplog):
    """Not every flock error counts as "another run holds the lock": on a filesystem without flock (Lustre
    mounted without -o flock: ENOSYS) a run can still start and resume."""
    import fcntl

    s = RunStore.create(str(tmp_path / "r"), CONFIG)

    def no_flock(fd, op):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    s.lock_writer()  # no error
    RunStore.check_writer_free(str(tmp_path / "r"))
    err = caplog.text
    assert err.count("no writer lock on the filesystem") == 2 and "(flock: ENOSYS)" in err
    s.append([Event("completed", "0-0", value=1.0)])

    def held(fd, op):
        raise OSError(errno.EWOULDBLOCK, "Resource temporarily unavailable")

    monkeypatch.setattr(fcntl, "flock", held)
    with pytest.raises(RunDirError, match="is being written by another run"):
        RunStore.open(str(tmp_path / "r")).lock_writer()


def test_a_checkpoint_comes_back_as_it_was_saved_without_tensors_too(tmp_path):
    """A checkpoint without a tensor comes back intact, as one with a tensor does: saved as JSON, int keys
    would turn into strings (keys 1 and "1" merged) and tuples into lists."""
    s = RunStore.create(str(tmp_path / "r"), CONFIG)
    state = {"per_batch": {0: 1.5, 1: 2.5, "1": "b"}, "shape": (2, 3), "plain": [1, "x", None]}
    s.save_checkpoint("odd", state)
    assert RunStore.open(str(tmp_path / "r")).load_checkpoint("odd") == state
    s.save_checkpoint("plain", {"a": [1, 2.5], "b": {"c": None}})  # JSON keeps these: still JSON
    assert (tmp_path / "r" / "checkpoints" / "plain.json").exists()


def test_the_writer_removes_temporary_files_a_crash_left(tmp_path):
    """A write cut short by a crash does not leave its `.tmp-*` file in events/ for good."""
    s = RunStore.create(str(tmp_path / "r"), CONFIG)
    s.append(_base_events(2))
    for folder in ("events", "checkpoints", ""):
        (tmp_path / "r" / folder / ".tmp-deadbeef").write_bytes(b"PAR1 partial")
    r = RunStore.open(str(tmp_path / "r"))
    assert len(r.events()) == 2 and r.damage == []  # a reader leaves them (a writer may be mid-write)
    assert (tmp_path / "r" / "events" / ".tmp-deadbeef").exists()
    r.lock_writer()
    for folder in ("events", "checkpoints", ""):
        assert not (tmp_path / "r" / folder / ".tmp-deadbeef").exists()
    assert len(RunStore.open(str(tmp_path / "r")).events()) == 2
    r.unlock_writer()


def test_discard_unstarted_removes_only_a_run_that_recorded_nothing(tmp_path):
    cfg = {"name": "x", "budget": 3}
    empty = str(tmp_path / "empty")
    RunStore.create(empty, cfg)
    writer = RunStore.open(empty)
    writer.lock_writer()
    assert RunStore.discard_unstarted(empty) is False and RunStore.exists(empty)  # a process is writing it
    writer.unlock_writer()
    assert RunStore.discard_unstarted(empty) is True and not RunStore.exists(empty)
    assert sorted(os.listdir(empty)) == ["checkpoints", "events"]
    RunStore.create(empty, cfg)  # the same run directory takes a new run
    recorded = str(tmp_path / "recorded")
    RunStore.create(recorded, cfg).append([Event("proposed", "0-0", time=1.0, params={"x": 0.5})])
    assert RunStore.discard_unstarted(recorded) is False and len(RunStore.open(recorded).events()) == 1
    assert RunStore.discard_unstarted(str(tmp_path / "none")) is False


def test_a_status_probe_of_the_writer_lock_does_not_refuse_a_starting_writer(tmp_path):
    """`is_being_written` (status, report) holds a shared flock for an instant; a writer (a run's central
    actor, a resume, Ray's restart of a crashed actor) taking the lock then tries again for a moment rather
    than being refused as if another run held it (2 of 2000 takes under a loop of probes)."""
    import fcntl
    import threading

    run_dir = str(tmp_path / "run")
    RunStore.create(run_dir, {"name": "x", "budget": 1})
    store = RunStore.open(run_dir)
    store.lock_writer()
    store.unlock_writer()
    with open(os.path.join(run_dir, "writer.lock")) as probe:
        fcntl.flock(probe.fileno(), fcntl.LOCK_SH)  # a probe caught mid-way
        threading.Timer(0.05, fcntl.flock, (probe.fileno(), fcntl.LOCK_UN)).start()
        store.lock_writer()  # waits out the probe
    assert RunStore.is_being_written(run_dir) is True
    with pytest.raises(RunDirError, match="being written by another run"):  # a real writer is still refused
        RunStore.open(run_dir).lock_writer()
    store.unlock_writer()


def test_a_deleted_segment_is_reported_as_missing_events(tmp_path):
    """Deleting a segment file (the first, or one in the middle) is damage, not an intact, shorter log (status
    showing fewer results without a damage line, a resume running those trials again silently). Sequence
    numbers run from 0 without holes, so a hole is damage; an intact log has none."""
    s = RunStore.create(str(tmp_path / "r"), CONFIG)
    for i in range(6):
        s.append([Event("completed", f"0-{i}", value=float(i))])  # seq 0 .. 5, one segment each
    assert RunStore.open(str(tmp_path / "r")).damage == []
    events = tmp_path / "r" / "events"
    for seq in (0, 2, 3):
        (events / f"seg-{seq:012d}-{seq:012d}.parquet").unlink()
    r = RunStore.open(str(tmp_path / "r"))
    assert [e.trial_id for e in r.events()] == ["0-1", "0-4", "0-5"]
    assert r.damage == ["events/: no segment holds 3 event(s) with sequence number(s) 0, 2-3 (a segment file "
                        "deleted?); their results are not in the log"]
    r.lock_writer()
    try:
        r.append([Event("completed", "0-6", value=6.0)])  # numbering goes on after the last segment
    finally:
        r.unlock_writer()
    assert "seg-000000000006-000000000006.parquet" in os.listdir(events)
    # a compaction merges on each side of a hole, never across it: a merge named for the missing numbers would
    # make the hole read as that intact merge being short of rows, and keep it out of compaction
    r = RunStore.open(str(tmp_path / "r"))
    r.compact_files = 2
    r.lock_writer()
    try:
        r.append([Event("completed", "0-7", value=7.0)])  # auto-compacts (compact_files 2)
        r.compact()
    finally:
        r.unlock_writer()
    assert sorted(os.listdir(events)) == ["seg-000000000001-000000000001.parquet",
                                          "seg-000000000004-000000000007.parquet"]
    r = RunStore.open(str(tmp_path / "r"))
    assert [e.trial_id for e in r.events()] == ["0-1", "0-4", "0-5", "0-6", "0-7"]
    assert r.damage == ["events/: no segment holds 3 event(s) with sequence number(s) 0, 2-3 (a segment file "
                        "deleted?); their results are not in the log"]


def test_a_run_whose_events_folder_is_gone_is_refused_not_read_as_new(tmp_path):
    """With events/ removed, status does not show a fresh run, and a resume does not start Ray to fail at its
    first write claiming everything logged before was kept."""
    s = RunStore.create(str(tmp_path / "r"), CONFIG)
    s.append([Event("completed", "0-0", value=1.0)])
    import shutil

    shutil.rmtree(tmp_path / "r" / "events")
    with pytest.raises(RunDirError, match=r"/events/ is missing: the run's log is gone"):
        RunStore.open(str(tmp_path / "r"))


def test_a_writer_lock_that_cannot_be_written_is_one_line_naming_it(tmp_path):
    """A read-only run directory, a full disk or a folder named writer.lock makes `resume` end in a
    `RunDirError` (exit 2) naming the file, not a raw OSError traceback (before Ray starts)."""
    s = RunStore.create(str(tmp_path / "r"), CONFIG)
    (tmp_path / "r" / "writer.lock").mkdir()
    r = RunStore.open(str(tmp_path / "r"))
    with pytest.raises(RunDirError, match=r"cannot write the run directory .*/r: writer.lock: Is a "
                                          r"directory"):
        r.lock_writer()
    del s
