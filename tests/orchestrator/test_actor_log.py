"""The central actor's log writes are group commits, and nothing is acknowledged before it is durable
(orchestrator/actor/log.py `RunLog.append`, orchestrator/actor/dispatch.py `Dispatcher.collect`).

Appends that arrive while one is being written share the next segment and its fsync; none returns before the
fsync of the segment that holds its events. `os.fsync` is spied on (and held, to make appends pile up), so the
order of fsyncs and acknowledgements is observed, not assumed. No Ray: the collect test replaces `ray.wait`
and `ray.get` with finished results, as test_actor_guards.py replaces the submission.
"""

from __future__ import annotations

import itertools
import os
import threading
import time

import pytest

from orchestrator.actor import CentralActor
from orchestrator.actor.guard import AbortCause
from orchestrator.actor.log import LogWriteError, RunLog
from orchestrator.config import load_config
from orchestrator.store import Event, RunStore, StoreError
from workers.records import TrialResult

CONFIG = {"name": "log", "objective": {"name": "forrester", "options": {}}}


class FsyncSpy:
    """`os.fsync` that records each call in `order` ("fsync <path>") and, while `hold` is set, blocks the
    first call until `gate` is set (then `entered` is set while it waits)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.order: list[str] = []
        self.lock = threading.Lock()
        self.hold = False
        self.entered, self.gate = threading.Event(), threading.Event()
        self.fail_after: int | None = None  # fsync calls that succeed before the next ones raise OSError
        real = os.fsync

        def spy(fd: int) -> None:
            path = os.readlink(f"/proc/self/fd/{fd}")
            if self.hold:
                self.hold = False
                self.entered.set()
                assert self.gate.wait(10)
            with self.lock:
                if self.fail_after is not None and self.count() >= self.fail_after:
                    raise OSError(28, "No space left on device")
                self.order.append(f"fsync {path}")
            real(fd)

        monkeypatch.setattr(os, "fsync", spy)

    def count(self) -> int:
        return sum(o.startswith("fsync") for o in self.order)

    def note(self, what: str) -> None:
        with self.lock:
            self.order.append(what)


def _event(i: int) -> Event:
    return Event("proposed", f"0-{i}", time=100.0 + i, batch_id=0, params={"a": i}, x=[i / 10])


def _segments(run_dir) -> list[list[str]]:
    """The trial ids of each segment of the log, in order."""
    store = RunStore.open(str(run_dir))
    names = sorted(n for n in os.listdir(run_dir / "events") if n.startswith("seg-"))
    out = []
    for name in names:
        first, last = (int(v) for v in name[4:-8].split("-"))
        out.append([e.trial_id for e in store.events()][first:last + 1])
    return out


def _log(tmp_path) -> tuple[RunLog, AbortCause]:
    store = RunStore.create(str(tmp_path / "r"), CONFIG)
    abort = AbortCause()
    return RunLog(store, str(tmp_path / "r"), threading.RLock(), abort, on_failure=lambda: None), abort


def _append_in_threads(log: RunLog, spy: FsyncSpy, batches: dict[str, list[Event]]):
    """Append the first batch and hold its fsync; append the others meanwhile (each waits queued), then let
    the fsync go. Returns {name: the exception its append raised, or None}."""
    outcome: dict[str, BaseException | None] = {}

    def append(name: str, events: list[Event]) -> None:
        try:
            log.append(events)
            outcome[name] = None
            spy.note(f"ack {name}")
        except Exception as exc:  # noqa: BLE001 -- the test reads it
            outcome[name] = exc
            spy.note(f"error {name}")

    (first, first_events), *rest = batches.items()
    spy.hold = True
    threads = [threading.Thread(target=append, args=(first, first_events))]
    threads[0].start()
    assert spy.entered.wait(10)
    for name, events in rest:
        threads.append(threading.Thread(target=append, args=(name, events)))
        threads[-1].start()
    deadline = time.time() + 10
    while log.queued < len(batches) and time.time() < deadline:  # every append waits in the queue
        time.sleep(0.01)
    assert log.queued == len(batches)
    assert [o for o in spy.order if o.startswith("ack")] == []  # nothing acknowledged while the fsync hangs
    spy.gate.set()
    for t in threads:
        t.join(10)
    return outcome


def test_appends_that_arrive_together_share_one_segment_and_one_fsync(tmp_path, monkeypatch):
    log, _ = _log(tmp_path)
    spy = FsyncSpy(monkeypatch)
    outcome = _append_in_threads(log, spy, {"a": [_event(0)], "b": [_event(1)], "c": [_event(2), _event(3)],
                                            "d": [_event(4)]})
    assert outcome == {"a": None, "b": None, "c": None, "d": None}
    segments = _segments(tmp_path / "r")
    assert segments[0] == ["0-0"]
    assert sorted(segments[1]) == ["0-1", "0-2", "0-3", "0-4"] and len(segments) == 2
    # two segments: each a file fsync and a folder fsync, four in all for five events of four appends
    assert spy.count() == 4
    order = spy.order
    assert order.index("ack a") > 1  # after the first segment's two fsyncs
    for name in "bcd":  # after the second segment's folder fsync, the last of the four
        assert order.index(f"ack {name}") > max(i for i, o in enumerate(order) if o.startswith("fsync"))


def test_a_malformed_append_in_a_group_fails_alone(tmp_path, monkeypatch):
    log, _ = _log(tmp_path)
    spy = FsyncSpy(monkeypatch)
    bad = Event("proposed", "0-9", time=100.0, batch_id=0, params={"a": object()}, x=[0.1])
    batches = {"a": [_event(0)], "b": [_event(1)], "bad": [bad], "c": [_event(2)]}
    outcome = _append_in_threads(log, spy, batches)
    assert outcome["a"] is None and outcome["b"] is None and outcome["c"] is None
    assert isinstance(outcome["bad"], StoreError) and "events[0].params['a']" in str(outcome["bad"])
    assert [sorted(s) for s in _segments(tmp_path / "r")] == [["0-0"], ["0-1", "0-2"]]
    assert not log.failed


def test_a_failed_group_write_acknowledges_none_of_its_appends(tmp_path, monkeypatch):
    log, abort = _log(tmp_path)
    spy = FsyncSpy(monkeypatch)
    spy.fail_after = 2  # the first segment is written; the group's file fsync fails (the disk is full)
    done = [Event("completed", f"0-{i}", time=100.0, batch_id=0, params={"a": i}, x=[0.1], value=1.0)
            for i in range(3)]
    outcome = _append_in_threads(log, spy, {"a": [_event(0)], "b": [done[0]], "c": [done[1], done[2]]})
    assert outcome["a"] is None
    assert isinstance(outcome["b"], LogWriteError) and isinstance(outcome["c"], LogWriteError)
    assert [o for o in spy.order if o.startswith("ack")] == ["ack a"]
    assert "No space left on device" in abort.message and "the 3 results being written were not recorded" in (
        abort.message)
    assert _segments(tmp_path / "r") == [["0-0"]]
    with pytest.raises(LogWriteError):  # nothing more is written
        log.append([_event(5)])


def _actor_with_results_ready(tmp_path, monkeypatch) -> tuple[CentralActor, list[int]]:
    """A central actor (no Ray) with the 4 trials of its initial design in flight and finished: `ray.wait`
    returns all of them and `ray.get` their results. Returns it and the sizes of the `ray.get` calls."""
    import ray

    cfg = {"name": "collect", "objective": {"name": "forrester", "options": {}}, "batch_size": 4,
           "initial_design": 4, "budget": 4, "max_concurrent": 4, "seed": 1, "run_dir": str(tmp_path / "run")}
    RunStore.create(cfg["run_dir"], load_config(cfg).to_dict())
    actor = CentralActor(cfg["run_dir"], max_concurrent=4, pool=None)
    refs = itertools.count()
    actor.dispatcher.submit = lambda batch: [f"ref{next(refs)}" for _ in batch]
    assert actor.planner.propose_step() is True  # the initial design, 4 Sobol points
    actor.dispatcher.dispatch()
    inflight = dict(actor.scheduler.inflight)
    assert len(inflight) == 4

    now = time.time()
    values = {ref: TrialResult("completed", value=float(i), started_at=now, ended_at=now,
                               trial_id=trial.trial_id)
              for i, (ref, (trial, _, _)) in enumerate(inflight.items())}
    gets: list[int] = []

    def get(refs, timeout=None):
        gets.append(len(refs) if isinstance(refs, list) else 1)
        return [values[r] for r in refs] if isinstance(refs, list) else values[refs]

    monkeypatch.setattr(ray, "wait", lambda refs, num_returns=1, timeout=None, **kw: (list(refs), []))
    monkeypatch.setattr(ray, "get", get)
    return actor, gets


def _spy_acknowledgements(actor: CentralActor, spy: FsyncSpy) -> None:
    """Note each tell and each freed slot in `spy.order`."""
    tell, free = actor.opt.tell, actor.scheduler.free

    def spied_tell(trial_id, *args, **kw):
        spy.note(f"tell {trial_id}")
        return tell(trial_id, *args, **kw)

    def spied_free(ref):
        spy.note(f"free {ref}")
        return free(ref)

    actor.opt.tell, actor.scheduler.free = spied_tell, spied_free


def test_results_collected_together_are_logged_in_one_fsync_before_any_is_told(tmp_path, monkeypatch):
    """`Dispatcher.collect`: every result ready at once is one segment (with the buffered "started" records),
    one file fsync, and no result is told, nor its slot freed, before it."""
    actor, gets = _actor_with_results_ready(tmp_path, monkeypatch)
    spy = FsyncSpy(monkeypatch)
    _spy_acknowledgements(actor, spy)
    spy.hold = True  # the write hangs in its first fsync: collect has returned, nothing is acknowledged
    actor.dispatcher.collect(1.0)
    assert spy.entered.wait(10)
    assert actor.n_done == 0 and len(actor.scheduler.inflight) == 4 and spy.order == []
    assert actor.scheduler.free_slots() == 0 and len(actor.dispatcher.arrived) == 4
    spy.gate.set()
    assert actor.dispatcher.settle(10)  # the log's writer has written and told them

    assert gets == [4]  # one fetch for the four results
    assert spy.count() == 2  # one segment: its file and the events folder
    order = spy.order
    acks = [i for i, o in enumerate(order) if o.startswith(("tell", "free"))]
    assert len(acks) == 8 and min(acks) > max(i for i, o in enumerate(order) if o.startswith("fsync"))
    events = actor.store.events()
    assert [e.kind for e in events].count("completed") == 4 and [e.kind for e in events].count("started") == 4
    assert len(_segments(tmp_path / "run")) == 2  # the proposals; then the "started" records and the results
    assert actor.n_done == 4 and not actor.scheduler.inflight and not actor.dispatcher.arrived
    actor.store.unlock_writer()


def test_results_whose_write_fails_are_never_told(tmp_path, monkeypatch):
    """A full disk under the writer: none of the results is told or counted, the abort says how many were not
    recorded, and the next collect stops the loop (`LogWriteError`)."""
    actor, _ = _actor_with_results_ready(tmp_path, monkeypatch)
    spy = FsyncSpy(monkeypatch)
    _spy_acknowledgements(actor, spy)
    spy.fail_after = 0
    actor.dispatcher.collect(1.0)
    assert actor.dispatcher.settle(10)
    assert actor.log.failed and actor.n_done == 0 and [o for o in spy.order if o.startswith("tell")] == []
    assert "No space left on device" in actor.abort.message
    assert "the 4 results being written were not recorded" in actor.abort.message
    with pytest.raises(LogWriteError):
        actor.dispatcher.collect(0.1)
    assert [e.kind for e in actor.store.events()].count("completed") == 0
    actor.store.unlock_writer()
