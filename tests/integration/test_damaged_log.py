"""A run's event log is damaged (one segment truncated, one with bytes flipped in
the middle); `resume_experiment` keeps every intact record, reports exactly which events were dropped, runs
again what was lost, and finishes with every trial recorded once and the count equal to the budget."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from orchestrator.runner import resume_experiment, run_experiment
from orchestrator.store import RunStore
from tests.integration.conftest import finished_counts

pytestmark = pytest.mark.ray

BUDGET = 12


def _kinds(path: Path) -> list[str]:
    return pq.read_table(path, columns=["kind"]).column("kind").to_pylist()


def test_resume_after_damaged_segments_keeps_intact_records_and_reports_the_loss(ray_local, tmp_path):
    run_dir = str(tmp_path / "damaged")
    cfg = {
        "name": "damaged",
        "objective": {"name": "sleep", "options": {"mean_s": 0.05, "num_cpus": 0.5}},
        "proposer": "sobol", "budget": BUDGET, "batch_size": 4, "initial_design": 4, "max_concurrent": 2,
        "run_dir": run_dir,
    }
    assert run_experiment(cfg, address=ray_local, progress=False, out=io.StringIO())["status"] == "finished"
    before = RunStore.open(run_dir).events()
    assert len(finished_counts(before)) == BUDGET

    # damage two segments that hold results: truncate the first, flip bytes inside the second
    segments = sorted((Path(run_dir) / "events").glob("seg-*.parquet"))
    with_results = [p for p in segments if "completed" in _kinds(p)]
    assert len(with_results) >= 4
    truncated, flipped = with_results[1], with_results[-2]
    lost_results = set()
    for p in (truncated, flipped):
        t = pq.read_table(p, columns=["kind", "trial_id"]).to_pylist()
        lost_results |= {r["trial_id"] for r in t if r["kind"] in ("completed", "failed")}
    data = truncated.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    data = bytearray(flipped.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 64] = bytes(b ^ 0xFF for b in data[mid : mid + 64])
    flipped.write_bytes(bytes(data))

    def seqs(path: Path) -> range:  # seg-<first>-<last>.parquet
        first, last = (int(s) for s in path.stem.split("-")[1:3])
        return range(first, last + 1)

    dropped = {s for p in (truncated, flipped) for s in seqs(p)}
    store = RunStore.open(run_dir)
    intact = store.events()
    assert len(store.damage) == 2 and all(p.name in "".join(store.damage) for p in (truncated, flipped))
    assert len(intact) == len(before) - len(dropped), "only the damaged segments' events are lost"
    assert lost_results and not lost_results & {
        e.trial_id for e in intact if e.kind in ("completed", "failed")
    }

    out = io.StringIO()
    summary = resume_experiment(run_dir, address=ray_local, progress=False, out=out)
    assert summary["status"] == "finished"
    printed = out.getvalue()
    for p in (truncated, flipped):
        assert f"damaged log in {run_dir}" in printed and p.name in printed, printed

    after = RunStore.open(run_dir).events()
    counts = finished_counts(after)
    assert len(counts) == BUDGET and set(counts.values()) == {1}, "count == budget, nothing recorded twice"
    kept = {e.trial_id: e for e in intact if e.kind in ("completed", "failed")}
    for e in after:  # every intact result is kept as it was, never re-run
        if e.kind in ("completed", "failed") and e.trial_id in kept:
            assert (e.value, e.time) == (kept[e.trial_id].value, kept[e.trial_id].time)
    assert os.path.exists(truncated), "a damaged segment is kept for inspection, not deleted"
