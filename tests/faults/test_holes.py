"""Reliability holes found by hostile use, each reproduced here: two runs claiming one new run directory, a
disk full at `qbatch run`, a log row whose JSON fields decode to the wrong type, work dispatched after the
user said stop, an unbounded number of metrics per result, and the smaller ones of the same kind.

Run inside `scripts/loopback`: the test of the central actor's warnings runs a real `qbatch run`, which starts
a local Ray of its own (marked `ray`); the others never start Ray. Where the fault is a race, the test holds
one side at the racy step with a patched hook.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import subprocess
import sys
import threading
import time
import types
import warnings
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from objectives.base import Objective
from orchestrator import cli
from orchestrator import store as store_mod
from orchestrator.errors import UsageError
from orchestrator.store import Event, RunDirError, RunStore, trials_table
from orchestrator.store import run_store as run_store_mod

REPO = Path(__file__).resolve().parents[2]


class RandomSpace(Objective):
    """A user objective whose constructor draws the upper bound of its space at random."""

    name = "random-space"
    direction = "maximize"
    noisy = False

    def __init__(self) -> None:
        import random

        from objectives.base import Resources

        self.space = {"x": {"type": "float", "low": 0.0, "high": random.uniform(1.0, 2.0)}}
        self.resources = Resources(num_cpus=0.5)

    def evaluate(self, params, seed):
        return float(params["x"])


GOOD = {"name": "holes", "objective": {"name": "forrester"}, "tau": 0.2, "budget": 6, "batch_size": 3,
        "initial_design": 3, "direction": "maximize"}


def _write(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


# ---------------------------------------------------------------------------------------- F2: one claim
def _create_in_threads(run_dir: str, hold_a: threading.Event, release_a: threading.Event):
    """`RunStore.create` of config A (held by the caller's patch) and then of config B, on one new folder."""
    results: dict[str, object] = {}

    def create(tag: str) -> None:
        try:
            results[tag] = RunStore.create(run_dir, {**GOOD, "name": f"run-{tag}"})
        except Exception as exc:  # noqa: BLE001 - the test looks at which side lost
            results[tag] = exc

    a = threading.Thread(target=create, args=("a",), name="create-a")
    a.start()
    assert hold_a.wait(10), "thread A never reached the racy step"
    create("b")
    release_a.set()
    a.join(10)
    assert not a.is_alive()
    return results


def _assert_one_claim(run_dir: str, results: dict) -> None:
    losers = [t for t, r in results.items() if isinstance(r, Exception)]
    winners = [t for t, r in results.items() if isinstance(r, RunStore)]
    assert len(losers) == 1 and len(winners) == 1, results
    loser = results[losers[0]]
    assert isinstance(loser, RunDirError), repr(loser)
    line = str(loser)
    assert "\n" not in line and run_dir in line and f"pid {os.getpid()} on " in line, line  # names the winner
    on_disk = yaml.safe_load(Path(run_dir, "config.yaml").read_text())
    assert on_disk["name"] == f"run-{winners[0]}" == results[winners[0]].config["name"]
    assert RunStore.open(run_dir).config["name"] == f"run-{winners[0]}"  # what the winner's actor reads back


def test_two_creates_held_between_the_check_and_the_write_claim_the_folder_once(tmp_path, monkeypatch):
    run_dir = str(tmp_path / "new-run")
    hold_a, release_a = threading.Event(), threading.Event()
    real_check = store_mod._check_new

    def check_then_hold(backend, shown):
        real_check(backend, shown)
        if threading.current_thread().name == "create-a":  # A has seen a new folder; B runs now
            hold_a.set()
            assert release_a.wait(10)

    monkeypatch.setattr(run_store_mod, "_check_new", check_then_hold)
    _assert_one_claim(run_dir, _create_in_threads(run_dir, hold_a, release_a))


def test_two_creates_held_at_the_config_write_claim_the_folder_once(tmp_path, monkeypatch):
    run_dir = str(tmp_path / "new-run")
    hold_a, release_a = threading.Event(), threading.Event()
    real_write = store_mod._Local.write_atomic

    def hold_then_write(self, rel, data, exclusive=False):
        if rel == "config.yaml" and threading.current_thread().name == "create-a":
            hold_a.set()
            assert release_a.wait(10)
        return real_write(self, rel, data, exclusive)

    monkeypatch.setattr(store_mod._Local, "write_atomic", hold_then_write)
    _assert_one_claim(run_dir, _create_in_threads(run_dir, hold_a, release_a))


# ---------------------------------------------------------------------------------------- F3: disk full
def _full_disk(monkeypatch) -> None:
    """Every `os.write` to a file other than stdout and stderr fails as on a full disk."""
    real_write = os.write

    def write(fd, data):
        if fd in (1, 2):
            return real_write(fd, data)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", write)


def test_a_full_disk_at_create_is_one_line_naming_the_run_dir_and_leaves_nothing(tmp_path, monkeypatch):
    parent = tmp_path / "runs"
    run_dir = parent / "deep" / "r"
    _full_disk(monkeypatch)
    with pytest.raises(RunDirError) as exc:
        RunStore.create(str(run_dir), GOOD)
    line = str(exc.value)
    assert "\n" not in line and str(run_dir) in line and "No space left on device" in line, line
    assert isinstance(exc.value, UsageError)  # exit 2 at the command line
    assert not parent.exists(), sorted(str(p) for p in parent.rglob("*"))  # nothing left behind


def test_a_full_disk_at_qbatch_run_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    from orchestrator.runner import api

    # no Ray needed to reach create: the session of a Ray the caller started, which stays up
    monkeypatch.setattr(api, "ray_session", lambda address, num_cpus: contextlib.nullcontext(False))
    monkeypatch.setattr(api, "_check_feasible", lambda resources: None)
    _full_disk(monkeypatch)
    cfg = _write(tmp_path / "good.yaml", GOOD)
    run_dir = tmp_path / "r"
    rc = cli.main(["run", str(cfg), "--run-dir", str(run_dir)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and str(run_dir) in err and "No space left" in err, err
    assert not run_dir.exists()


# ---------------------------------------------------------------------------------------- F4: bad JSON field
def _run_with_rows(root: Path, bad: dict[int, tuple[str, str]]):
    """A finished run of 3 trials whose rows (by sequence number) get a raw JSON text in one field."""
    store = RunStore.create(str(root), GOOD)
    evs = []
    for i in range(3):
        tid = f"0-{i}"
        evs.append(Event("proposed", tid, time=10.0 + i, batch_id=0, params={"x": i / 10}, x=[i / 10]))
        evs.append(Event("started", tid, time=11.0 + i, started_at=11.0 + i, node_id="n"))
        evs.append(
            Event(
                "completed",
                tid,
                time=12.0 + i,
                value=float(i),
                started_at=11.0 + i,
                ended_at=12.0 + i,
                info={"metrics": {}},
            )
        )
    evs.append(Event("refit", time=20.0, info={"seconds": 0.5, "slots": 2}))
    table = store_mod._encode(evs, 0)
    for column in {c for c, _ in bad.values()}:
        values = table.column(column).to_pylist()
        for seq, (c, text) in bad.items():
            if c == column:
                values[seq] = text
        table = table.set_column(table.schema.get_field_index(column), column, pa.array(values, pa.string()))
    name = f"seg-{0:012d}-{len(evs) - 1:012d}.parquet"
    store._fs.write_atomic(f"events/{name}", store_mod._parquet_bytes(table), exclusive=True)
    return name, evs


@pytest.mark.parametrize("column, text", [("info", "[1,2,3]"), ("info", '"a string"'), ("params", "7"),
                                          ("forecast", "[0.5]"), ("info", "{not json")])
def test_a_row_whose_json_field_is_not_an_object_is_damage_of_that_row_only(tmp_path, capsys, column, text):
    root = tmp_path / "run"
    completed_1 = 5  # the completed row of trial 0-1
    name, evs = _run_with_rows(root, {completed_1: (column, text), 9: ("info", '"a refit string"')})
    store = RunStore.open(str(root))
    kept = store.events()
    assert len(kept) == len(evs) - 2
    assert len(store.damage) == 1, store.damage
    line = store.damage[0]
    assert f"events/{name}" in line and "sequence number(s) 5, 9" in line and f"`{column}`" in line, line
    trials = {t.trial_id: t for t in trials_table(kept)}
    assert trials["0-0"].status == trials["0-2"].status == "completed"
    assert trials["0-1"].status == "running"  # its result is gone: a resume runs it again
    for cmd in (["status", str(root)], ["report", str(root), "--out", str(tmp_path / "rep")]):
        assert cli.main(cmd) == 0, capsys.readouterr()
        out = capsys.readouterr().out
        assert cmd[0] == "report" or f"log damage   events/{name}" in out


# ---------------------------------------------------------------------------------------- F7: metrics
def test_the_metrics_of_one_result_are_capped_in_count_and_bytes_and_the_dropped_named():
    from workers.metrics import MAX_METRICS, MAX_METRICS_BYTES
    from workers.metrics import clean_metrics as _clean_metrics

    metrics = {f"m{i:05d}": "v" * 900 for i in range(30_000)}
    kept, dropped = _clean_metrics(metrics)
    assert len(kept) <= MAX_METRICS
    assert len(json.dumps(kept, separators=(",", ":"))) <= MAX_METRICS_BYTES  # as the log encodes it
    assert 0 < len(kept) and list(kept) == sorted(kept)  # the first ones, in the objective's order
    text = " ".join(dropped)
    assert len(dropped) <= 21 and f"m{len(kept):05d}" in text and f"{30_000 - len(kept)}" in text, dropped
    few = {f"k{i}": float(i) for i in range(50)}
    assert _clean_metrics(few) == (few, [])
    many_small = {f"k{i}": i for i in range(MAX_METRICS + 5)}
    kept, dropped = _clean_metrics(many_small)
    assert len(kept) == MAX_METRICS and "5 metrics" in " ".join(dropped), dropped


# ---------------------------------------------------------------------------------------- F5: stop means stop
def _stub_actor(tmp_path):
    """A central actor in this process whose Ray submissions are recorded, not made (no Ray needed)."""
    import itertools

    from orchestrator.actor import CentralActor
    from orchestrator.config import load_config

    cfg = {
        "name": "stop",
        "objective": {"name": "forrester", "options": {}},
        "batch_size": 4,
        "proposer": "sobol",
        "initial_design": 4,
        "budget": 16,
        "max_concurrent": 4,
        "seed": 1,
        "run_dir": str(tmp_path / "run"),
    }
    RunStore.create(cfg["run_dir"], load_config(cfg).to_dict())
    actor = CentralActor(cfg["run_dir"], max_concurrent=4, pool=None)
    refs = itertools.count()
    submitted: list[tuple[bool, list[str]]] = []  # (stop asked before the submission, trial ids)

    def submit(batch):
        submitted.append((actor._stop.is_set(), [t.trial_id for t, _ in batch]))
        return [f"ref{next(refs)}" for _ in batch]

    actor.dispatcher.submit = submit
    return actor, submitted


def test_nothing_is_dispatched_once_the_actor_is_told_to_stop(tmp_path):
    """The stop lands between the loop's check and a dispatch (a result frees a slot just after it)."""
    actor, submitted = _stub_actor(tmp_path)
    actor.planner.propose(4)
    actor.dispatcher.dispatch()
    actor.planner.propose(4)  # queued behind the four in flight
    assert len(submitted) == 1 and len(actor.scheduler.queue) == 4
    actor.stop()
    actor.dispatcher.dispatch(freed=4)  # what `Dispatcher.collect` does when results arrive after the stop
    actor._fill_before_first_model()
    assert [stopped for stopped, _ in submitted] == [False], submitted
    n_proposed = len(actor.store.events(["proposed"]))
    actor.planner.propose(4)  # a proposer thread that wakes after the stop
    assert len(actor.store.events(["proposed"])) == n_proposed


def test_a_stop_during_a_submission_returns_once_it_is_done_and_nothing_follows(tmp_path):
    actor, submitted = _stub_actor(tmp_path)
    actor.planner.propose(4)
    inside, release = threading.Event(), threading.Event()
    plain = actor.dispatcher.submit

    def slow_submit(batch):
        inside.set()
        assert release.wait(10)
        return plain(batch)

    actor.dispatcher.submit = slow_submit
    t = threading.Thread(target=actor.dispatcher.dispatch)
    t.start()
    assert inside.wait(10)
    stopper = threading.Thread(target=actor.stop)
    stopper.start()
    time.sleep(0.2)
    assert stopper.is_alive()  # stop waits for the submission under way
    release.set()
    stopper.join(10)
    t.join(10)
    assert not stopper.is_alive() and len(actor.scheduler.inflight) == 4
    actor.dispatcher.submit = plain
    actor.planner.propose(4)
    actor.dispatcher.dispatch(freed=4)
    assert len(submitted) == 1


# ---------------------------------------------------------------------------------------- smaller ones
def test_a_huge_bad_option_value_gives_a_short_error_line(tmp_path, capsys):
    from orchestrator.config import load_config
    from orchestrator.errors import ConfigError
    from orchestrator.runner import _check_objective

    big = "a" * 2_000_000
    with pytest.raises(ConfigError) as exc:
        _check_objective(
            load_config({**GOOD, "objective": {"name": "forrester", "options": {"noise_std": big}}})
        )
    assert "noise_std" in str(exc.value) and "characters cut" in str(exc.value) and len(str(exc.value)) < 1000
    under_the_size_cap = big[:900_000]
    cfg = _write(tmp_path / "big.yaml", {**GOOD, "objective": {"name": "forrester",
                                                               "options": {"noise_std": under_the_size_cap}}})
    assert cli.main(["run", str(cfg), "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "noise_std" in err and len(err) < 2500, len(err)


def test_yaml_merge_keys_whole_exponents_and_an_oversized_config(tmp_path):
    from orchestrator.config import MAX_CONFIG_BYTES, load_config, load_config_text
    from orchestrator.errors import ConfigError

    cfg = load_config_text("objective: &obj {name: forrester, options: {noise_std: 0.1}}\nname: m\n"
                           "model: {type: quantile}\nbudget: 1e3\ntau: 1e-1\nbatch_size: 2E1\n")
    assert cfg.budget == 1000 and cfg.batch_size == 20 and cfg.tau == 0.1
    merged = load_config_text("objective:\n  <<: {name: gld, options: {dim: 2}}\n  name: forrester\n  "
                              "options: {}\nname: m\n")
    assert merged.objective.name == "forrester"
    with pytest.raises(ConfigError, match=r"`budget` must be an integer"):
        load_config_text("objective: {name: forrester}\nbudget: 1.5e3\n")  # not a whole number as written
    huge = tmp_path / "huge.yaml"
    huge.write_text("objective: {name: forrester}\n" + "# padding\n" * (MAX_CONFIG_BYTES // 10 + 10))
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"huge\.yaml: the config file is over \d+ bytes"):
        load_config(str(huge))
    assert time.monotonic() - t0 < 1.0


def test_an_aborted_run_says_its_message_once(capsys):
    import io

    from orchestrator import runner

    message = "writing the run log in /r failed (OSError: [Errno 28] No space left on device)"
    out = io.StringIO()
    runner._report({"status": "aborted", "message": message, "done": 3, "completed": 3, "failed": 0,
                    "utilization": 0.5, "run_dir": "/r"}, out)
    assert message not in out.getvalue()  # the RunAbortedError carrying it is printed by the CLI, once


def test_report_files_have_the_mode_of_the_rest_of_the_run(tmp_path):
    from orchestrator.report import write_report

    root = tmp_path / "run"
    _run_with_rows(root, {})
    _, paths = write_report(str(root))
    want = os.stat(root / "config.yaml").st_mode & 0o777
    assert want & 0o044  # readable by others under this umask, as the run's own files are
    for path in paths.values():
        assert os.stat(path).st_mode & 0o777 == want, path


def test_a_budget_lowered_below_the_results_reads_as_reached(tmp_path, capsys):
    from orchestrator.runner import _show

    root = tmp_path / "run"
    _run_with_rows(root, {})
    config = yaml.safe_load((root / "config.yaml").read_text())
    (root / "config.yaml").write_text(yaml.safe_dump({**config, "budget": 2}))
    assert cli.main(["status", str(root)]) == 0
    out = capsys.readouterr().out
    assert "3/2" not in out and "3 done, budget 2 reached" in out, out

    class Bar:
        total, n = 2, 0

        def set_postfix(self, fields, refresh=False):
            self.fields = fields

        def refresh(self):
            pass

    bar = Bar()
    _show(bar, {"done": 3, "evals_per_s": 1.0, "utilization": 0.5, "inflight": 0, "failed": 0})
    assert bar.n == 2 and bar.fields["budget"] == "reached" and bar.fields["done"] == 3


def test_another_programs_folder_with_an_events_folder_is_not_shown_as_a_run(tmp_path, capsys):
    other = tmp_path / "other"
    (other / "events").mkdir(parents=True)
    (other / "events" / "2024-01-01.log").write_text("not ours")
    (other / "config.yaml").write_text("learning_rate: 0.1\nepochs: 3\n")
    for cmd in ("status", "report"):
        assert cli.main([cmd, str(other)]) == 2
        out, err = capsys.readouterr()
        assert (
            out == "" and len(err.splitlines()) == 1 and "is not a qbatch run" in err and str(other) in err
        ), err
    assert not (other / "report").exists()


def test_an_objective_whose_space_changes_between_builds_is_named(tmp_path, capsys):
    from orchestrator.config import load_config
    from orchestrator.errors import ConfigError
    from orchestrator.runner import _check_objective

    cfg = load_config({**GOOD, "objective": {"name": "tests.faults.test_holes:RandomSpace"}})
    with pytest.raises(ConfigError, match=r"RandomSpace' declares a different search space each time it is "
                                          r"built \(parameter 'x': "):
        _check_objective(cfg)


# --- F1: a direction flipped at resume must not reuse the old model
# ----------------------------------------------
def _fitted_optimizer(direction: str):
    from orchestrator.ask_tell import AskTellOptimizer

    opt = AskTellOptimizer({"a": {"type": "float", "low": 0.0, "high": 1.0}}, model="exact-gp", tau=0.5,
                           direction=direction, initial_design=4)
    for i in range(8):
        x = i / 7
        opt.tell_point({"a": x}, -(x - 0.3) ** 2)
    opt.fit()
    return opt


def test_a_model_checkpoint_of_the_other_direction_is_refused_at_tau_one_half():
    from orchestrator.errors import QbatchError

    ckpt = _fitted_optimizer("maximize").model_checkpoint()
    flipped = _fitted_optimizer("minimize")
    with pytest.raises(QbatchError, match="direction"):
        flipped.restore_model(ckpt)
    same = _fitted_optimizer("maximize")
    same.restore_model(ckpt)  # the same direction still restores


# --- F6: more inducing points than observations
# ------------------------------------------------------------------
def test_more_inducing_points_than_observations_uses_the_observations():
    import torch

    from orchestrator.models import build_model

    X = torch.rand(50, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    Y = torch.sin(6 * X[:, 0]) + 0.1 * torch.randn(
        50, generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )
    model = build_model("quantile", tau=0.1, num_inducing=8192)
    t0 = time.perf_counter()
    info = model.fit(X, Y)
    assert info["num_inducing"] == 50  # every observation, no random padding
    assert time.perf_counter() - t0 < 60


# --- F6: a fit that takes unusually long for its n warns once
# ----------------------------------------------------
@pytest.mark.parametrize("model, option", [("quantile", "num_inducing"), ("exact-gp", "fit_maxiter")])
def test_a_fit_slow_for_its_n_warns_once_naming_the_seconds_the_n_and_the_option(monkeypatch, model, option):
    """Each model fit takes `slow_s[0]` seconds on the optimizer's clock (the fits themselves are real): fast
    fits say nothing; once they take 100 s on 7 to 9 results, the first says so and the later ones (warm, and
    a restart that also fits cold) do not say it again."""
    from orchestrator.ask_tell import AskTellOptimizer, fitting
    from orchestrator.errors import ModelWarning

    clock, slow_s = [0.0], [0.0]
    monkeypatch.setattr(fitting, "time", types.SimpleNamespace(perf_counter=lambda: clock[0], time=time.time,
                                                               monotonic=time.monotonic, sleep=time.sleep))
    real_build = AskTellOptimizer._build_model

    def build(self):
        built = real_build(self)
        fit = built.fit

        def fit_on_the_clock(X, Y):
            out = fit(X, Y)
            clock[0] += slow_s[0]
            return out

        built.fit = fit_on_the_clock
        return built

    monkeypatch.setattr(AskTellOptimizer, "_build_model", build)
    options = {"max_steps": 100, "warm_max_steps": 20} if model == "quantile" else {}  # short real fits
    opt = AskTellOptimizer({"a": {"type": "float", "low": 0.0, "high": 1.0},
                            "b": {"type": "float", "low": 0.0, "high": 1.0}}, model=model, tau=0.3,
                           initial_design=6, seed=0, model_options=options)
    rng = random.Random(0)

    def tell(k: int) -> None:
        for _ in range(k):
            a, b = rng.random(), rng.random()
            opt.tell_point({"a": a, "b": b}, -(a - 0.3) ** 2 - (b - 0.6) ** 2 + 0.05 * rng.gauss(0, 1))

    def slow_warnings(caught) -> list[str]:
        return [
            str(w.message)
            for w in caught
            if issubclass(w.category, ModelWarning) and " took " in str(w.message)
        ]

    tell(6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.fit()
        assert slow_warnings(caught) == []
        slow_s[0] = 100.0
        for _ in range(3):
            tell(1)
            opt.fit()
        opt.fit(restart=True)
    said = slow_warnings(caught)
    assert len(said) == 1, said
    assert f"the {model} fit on 7 results took 100 s" in said[0], said[0]
    assert f"`{option}`" in said[0] and "model: {type: " in said[0], said[0]


# --- C6: the central actor's warnings reach the user as one clean line
# -------------------------------------------
def _screen(text: str) -> list[str]:
    """The rows a terminal shows for `text`: a carriage return goes back to the start of the row, and what
    follows it overwrites what was there."""
    rows = []
    for raw in text.split("\n"):
        row = ""
        for part in raw.split("\r"):
            row = part + row[len(part):]
        rows.append(row.rstrip())
    return rows


@pytest.mark.ray
def test_a_warning_of_the_central_actor_is_one_row_of_its_own_beside_the_progress_bar(tmp_path):
    """A real `qbatch run` with its progress bar on stderr, whose model fit warns in the central actor: the
    spec's lengthscale prior in 8 dimensions leaves every lengthscale at its mode on the design's results (a
    `ModelWarning`). Ray forwards what the actor's process prints, prefixed with its pid and glued to the
    bar."""
    cfg = {"name": "c6", "objective": {"name": "ackley", "options": {"dim": 8}},
           "model": {"type": "quantile", "options": {"lengthscale_prior": "spec"}}, "tau": 0.2, "budget": 8,
           "batch_size": 2, "initial_design": 6, "seed": 1, "run_dir": str(tmp_path / "run")}
    path = _write(tmp_path / "c6.yaml", cfg)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", str(path)], cwd=tmp_path, env=env,
                          capture_output=True, timeout=600)  # bytes: text mode reads each "\r" as a newline
    stderr = proc.stderr.decode(errors="replace")
    assert proc.returncode == 0, stderr[-4000:]
    rows = _screen(stderr)
    assert any(r.startswith("c6: 100%") for r in rows), rows  # the bar was drawn
    said = [r for r in rows if "ModelWarning" in r or "learned no lengthscale" in r]
    assert len(said) == 1, said
    assert said[0].startswith("qbatch: warning: ModelWarning: the quantile model learned no lengthscale "
                              "from "), said
    assert not [r for r in rows if "self._fit" in r or "self.opt.fit" in r], rows  # no source line
