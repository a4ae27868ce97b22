"""Reading, compacting and validating the segmented event log, and checkpoint formats (orchestrator/store.py):
a segment contributes only the sequence numbers its name covers and is reported when it holds fewer, sequence
numbers are never handed out twice, compaction writes every event exactly once and merges in a merge left by
a crash, an event needs a trial id, and a checkpoint comes back exactly as saved (the .pt file winning over a
.json one of the same name).
"""

from __future__ import annotations

import io
import json
import os

import pyarrow.parquet as pq
import pytest
import torch

from orchestrator.store import Event, RunStore, StoreError

CONFIG = {"name": "t", "objective": {"name": "forrester", "options": {}}, "tau": 0.2, "batch_size": 4}


def _segments(rd: str) -> list[str]:
    return sorted(n for n in os.listdir(os.path.join(rd, "events")) if n.startswith("seg-"))


def _seqs(path: str) -> list[int]:
    return pq.read_table(path).column("seq").to_pylist()


# ------------------------------------------------------------------ reading
def _three_events_named(tmp_path, last: int) -> RunStore:
    """A run whose one segment holds seqs 0-2 but is named as holding 0-`last`; opened again."""
    rd = str(tmp_path / "r")
    s = RunStore.create(rd, CONFIG)
    s.append([Event("proposed", f"t-{i}", time=1.0 + i) for i in range(3)])  # seq 0-2
    ev = os.path.join(rd, "events")
    os.rename(os.path.join(ev, "seg-000000000000-000000000002.parquet"),
              os.path.join(ev, f"seg-000000000000-{last:012d}.parquet"))
    return RunStore.open(rd)


def test_rows_outside_a_segments_named_range_are_ignored(tmp_path):
    r = _three_events_named(tmp_path, 1)
    assert [e.trial_id for e in r.events()] == ["t-0", "t-1"]
    assert r.damage == []


def test_a_segment_with_fewer_rows_than_its_name_is_reported(tmp_path):
    r = _three_events_named(tmp_path, 4)
    assert [e.trial_id for e in r.events()] == ["t-0", "t-1", "t-2"]
    assert r.damage == [
        "events/seg-000000000000-000000000004.parquet: fewer rows than its name says; "
        "dropped 2 event(s) with sequence number(s) 3-4, kept 3"
    ]


def test_a_sequence_number_is_never_handed_out_twice_after_a_segment_vanishes(tmp_path):
    rd = str(tmp_path / "r")
    s = RunStore.create(rd, CONFIG)
    for i in range(3):
        s.append([Event("proposed", f"t-{i}", time=1.0)])  # seq 0, 1, 2
    os.remove(os.path.join(rd, "events", "seg-000000000002-000000000002.parquet"))
    assert len(s.events()) == 2  # the writer re-reads the log without its last segment
    s.append([Event("proposed", "t-3", time=2.0)])
    assert _segments(rd) == [
        "seg-000000000000-000000000000.parquet",
        "seg-000000000001-000000000001.parquet",
        "seg-000000000003-000000000003.parquet",
    ]
    assert _seqs(os.path.join(rd, "events", "seg-000000000003-000000000003.parquet")) == [3]


# ------------------------------------------------------------------ compaction
def test_compaction_after_a_crash_mid_compaction_writes_each_event_once(tmp_path):
    rd = str(tmp_path / "r")
    s = RunStore.create(rd, CONFIG)
    for i in range(4):
        s.append([Event("proposed", f"t-{i}", time=1.0)])
    ev = os.path.join(rd, "events")
    saved = {n: open(os.path.join(ev, n), "rb").read() for n in _segments(rd)}
    assert s.compact() == 4
    for name, data in saved.items():  # the merge was written, its sources never deleted
        with open(os.path.join(ev, name), "wb") as f:
            f.write(data)
    r = RunStore.open(rd)
    assert r.compact() == 5
    assert _segments(rd) == ["seg-000000000000-000000000003.parquet"]
    merged = os.path.join(ev, "seg-000000000000-000000000003.parquet")
    assert pq.ParquetFile(merged).metadata.num_rows == 4
    assert _seqs(merged) == [0, 1, 2, 3]


def test_an_auto_compaction_merges_in_a_merge_a_crash_left(tmp_path, monkeypatch, caplog):
    """After a crash between writing a merge (1024 rows: not small) and deleting its four sources, the next
    auto-compaction of those sources merges the old merge in rather than colliding with its name (an error
    `append` would only print)."""
    rd = str(tmp_path / "r")
    w = RunStore.create(rd, CONFIG)
    w.compact_files = 4

    def crash(rel):
        raise RuntimeError("crash before deleting the merged sources")

    for i in range(4):
        if i == 3:
            monkeypatch.setattr(w._fs, "delete", crash)
        w.append([Event("proposed", f"t-{i}-{j}", time=1.0) for j in range(256)])
    assert "compacting the log" in caplog.text  # the crash, as append reports it
    caplog.clear()
    assert _segments(rd) == [
        "seg-000000000000-000000000255.parquet",
        "seg-000000000000-000000001023.parquet",
        "seg-000000000256-000000000511.parquet",
        "seg-000000000512-000000000767.parquet",
        "seg-000000000768-000000001023.parquet",
    ]
    monkeypatch.undo()

    r = RunStore.open(rd)
    assert r.damage == []
    r.compact_files = 4
    r.append([Event("proposed", f"u-{j}", time=2.0) for j in range(1024)])  # seq 1024-2047: auto-compacts
    assert "compacting the log" not in caplog.text
    assert _segments(rd) == ["seg-000000000000-000000001023.parquet", "seg-000000001024-000000002047.parquet"]
    merged = os.path.join(rd, "events", "seg-000000000000-000000001023.parquet")
    assert pq.ParquetFile(merged).metadata.num_rows == 1024
    again = RunStore.open(rd)
    assert again.damage == [] and len(again.events()) == 2048


# ------------------------------------------------------------------ validation
def test_an_event_other_than_refit_needs_a_trial_id(tmp_path):
    rd = str(tmp_path / "r")
    s = RunStore.create(rd, CONFIG)
    with pytest.raises(StoreError) as err:
        s.append([Event("completed", "", value=1.0)])
    assert str(err.value) == "events[0].trial_id must be non-empty for a 'completed' event"
    assert _segments(rd) == []
    s.append([Event("refit", "", time=1.0)])  # a refit belongs to no trial
    assert [e.kind for e in RunStore.open(rd).events()] == ["refit"]


# ------------------------------------------------------------------ checkpoints
def test_a_tuple_alone_makes_a_checkpoint_come_back_as_saved(tmp_path):
    rd = str(tmp_path / "r")
    s = RunStore.create(rd, CONFIG)
    s.save_checkpoint("c", {"shape": (2, 3)})
    got = RunStore.open(rd).load_checkpoint("c")
    assert got == {"shape": (2, 3)} and isinstance(got["shape"], tuple)
    assert sorted(os.listdir(os.path.join(rd, "checkpoints"))) == ["c.pt"]


def test_an_int_key_alone_makes_a_checkpoint_come_back_as_saved(tmp_path):
    rd = str(tmp_path / "r")
    s = RunStore.create(rd, CONFIG)
    s.save_checkpoint("c", {"k": {0: 1.5}})
    got = RunStore.open(rd).load_checkpoint("c")
    assert got == {"k": {0: 1.5}} and list(got["k"]) == [0]
    assert sorted(os.listdir(os.path.join(rd, "checkpoints"))) == ["c.pt"]


def test_the_pt_file_wins_over_a_json_file_of_the_same_name(tmp_path):
    """`save_checkpoint` removes the other format's file before writing and `load_checkpoint` reads .pt
    first; where both exist (left by another writer or an older version) the .pt file is the checkpoint."""
    rd = str(tmp_path / "r")
    RunStore.create(rd, CONFIG)
    ck = os.path.join(rd, "checkpoints")
    buf = io.BytesIO()
    torch.save({"step": 2, "w": torch.tensor([1.0, 2.0])}, buf)
    with open(os.path.join(ck, "m.pt"), "wb") as f:
        f.write(buf.getvalue())
    with open(os.path.join(ck, "m.json"), "w") as f:
        json.dump({"step": 1}, f)
    got = RunStore.open(rd).load_checkpoint("m")
    assert sorted(got) == ["step", "w"] and got["step"] == 2
    assert torch.equal(got["w"], torch.tensor([1.0, 2.0]))
