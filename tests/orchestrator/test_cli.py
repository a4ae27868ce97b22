"""Tests of the `qbatch` command line (orchestrator/cli.py).

Acceptance: a bad config (unknown key, tau = 1.5, batch size 0, unknown objective) exits non-zero
with one line naming the problem and creates no run directory -- through `main([...])` and through a real
`python -m orchestrator.cli` process. `status`/`report`/`objectives` never import Ray. The wiring of
`run`/`resume` to orchestrator.runner is checked with a recording stand-in here; the real end-to-end run on
Runs on Ray are tested in tests/integration/.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest
import yaml

from orchestrator import cli
from orchestrator.errors import QbatchError
from orchestrator.store import Event, RunStore

REPO = Path(__file__).resolve().parents[2]


def own_pid_namespace() -> list[str]:
    """A command prefix that runs a process in a PID namespace of its own (with its own /proc), so it sees no
    other process of the machine; empty where namespaces cannot be made (no root or user namespaces)."""
    prefix = ["unshare", "--pid", "--fork", "--mount-proc"]
    if shutil.which("unshare") and subprocess.run([*prefix, "true"], capture_output=True).returncode == 0:
        return prefix
    return []

GOOD = {"name": "cli-test", "objective": {"name": "forrester"}, "tau": 0.2, "budget": 6, "batch_size": 3,
        "initial_design": 3, "direction": "maximize"}
BAD = {
    "unknown-key": ({"bogus_key": 1}, "unknown key `bogus_key`"),
    "tau": ({"tau": 1.5}, "`tau` must be a number in (0, 1); got 1.5"),
    "batch-size": ({"batch_size": 0}, "`batch_size` must be an integer in [1, 4096]; got 0"),
    "objective": ({"objective": {"name": "no-such-objective"}}, "`objective.name` must be a built-in "
                                                                "objective"),
}
#: bad configs found only against the objective, by the runner: the error names the file
BAD_FOR_OBJECTIVE = {
    "space": ({"space": {"x0": {"type": "float", "low": 0.5, "high": 0.2}}}, "low must be < high"),
    "model-options": ({"model": {"type": "quantile", "options": {"bogus": 1}}}, "`model.options`"),
}


def _write(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("case", sorted(BAD | BAD_FOR_OBJECTIVE))
def test_bad_config_one_line_exit_2_no_run_dir(case, tmp_path, monkeypatch, capsys):
    patch, expected = (BAD | BAD_FOR_OBJECTIVE)[case]
    monkeypatch.chdir(tmp_path)
    cfg_path = _write(tmp_path / "bad.yaml", GOOD | patch | {"run_dir": str(tmp_path / "explicit-run")})
    before = sorted(os.listdir(tmp_path))
    rc = cli.main(["run", str(cfg_path)])
    out, err = capsys.readouterr()
    assert rc == cli.EXIT_USAGE == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"qbatch: error: {cfg_path}: ") and expected in lines[0], (
        err
    )
    assert sorted(os.listdir(tmp_path)) == before  # neither runs/ nor the explicit run_dir was created
    rc = cli.main(
        ["run", str(_write(tmp_path / "bad2.yaml", GOOD | patch)), "--run-dir", str(tmp_path / "x")]
    )
    assert rc == 2 and not (tmp_path / "x").exists() and not (tmp_path / "runs").exists()


def test_bad_config_in_a_real_process(tmp_path):
    """`python -m orchestrator.cli run` with each bad config: exit 2, exactly one stderr line, no folder."""
    script = (
        "import sys, yaml\nfrom orchestrator.cli import main\n"
        f"cases = {[GOOD | p for p, _ in BAD.values()]!r}\nfor i, c in enumerate(cases):\n"
        "    open(f'c{i}.yaml', 'w').write(yaml.safe_dump(c))\n"
        "    assert main(['run', f'c{i}.yaml']) == 2\nassert main(['objectives']) == 0\n"
        "print('RAY_IMPORTED', 'ray' in sys.modules, 'orchestrator.runner' in sys.modules)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    err_lines = proc.stderr.splitlines()
    assert len(err_lines) == len(BAD), proc.stderr  # one line per bad config, no traceback
    for line, (_, expected) in zip(err_lines, BAD.values()):
        assert line.startswith("qbatch: error: ") and expected in line
    assert "RAY_IMPORTED False False" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"c{i}.yaml" for i in range(len(BAD))]
    # the module entry point itself (what the console script runs)
    bad = _write(tmp_path / "tau.yaml", GOOD | {"tau": 1.5})
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", str(bad)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"qbatch: error: {bad}: `tau` must be a number in (0, 1); got 1.5"]
    assert not (tmp_path / "runs").exists()


class _FakeRunner(types.ModuleType):
    """Records how the CLI calls orchestrator.runner and behaves as told."""

    def __init__(self, behaviour: str = "ok") -> None:
        super().__init__("orchestrator.runner")
        self.calls: list[tuple] = []
        self.behaviour = behaviour

    def _act(self, run_dir: str) -> dict:
        if self.behaviour == "interrupt":  # after the run was created
            if not RunStore.exists(run_dir):
                RunStore.create(run_dir, GOOD)
            raise KeyboardInterrupt
        if self.behaviour == "interrupt-early":  # while Ray was starting: nothing written yet
            raise KeyboardInterrupt
        if self.behaviour == "abort":
            raise QbatchError("failure rate 0.80 > 0.5 after 10 trials: stopping")
        return {"run_dir": run_dir}

    def run_experiment(self, config, address=None, run_dir=None):
        self.calls.append(("run", config, address, run_dir))
        return self._act(run_dir)

    def resume_experiment(self, run_dir, address=None):
        self.calls.append(("resume", run_dir, address))
        return self._act(run_dir)


def test_run_and_resume_call_the_runner(tmp_path, monkeypatch, capsys):
    fake = _FakeRunner()
    monkeypatch.setitem(sys.modules, "orchestrator.runner", fake)
    monkeypatch.chdir(tmp_path)
    cfg_path = _write(tmp_path / "good.yaml", GOOD)
    assert cli.main(["run", str(cfg_path), "--address", "auto"]) == 0
    kind, cfg, address, run_dir = fake.calls[-1]
    # the path: the runner's errors name it
    assert kind == "run" and cfg == str(cfg_path) and address == "auto"
    assert os.path.dirname(run_dir) == "runs" and os.path.basename(run_dir).startswith("cli-test-")
    assert cli.main(["run", str(cfg_path), "--run-dir", str(tmp_path / "mine")]) == 0
    assert fake.calls[-1][3] == str(tmp_path / "mine")
    # a folder that already holds a run is refused before the runner is called
    RunStore.create(str(tmp_path / "taken"), GOOD)
    n = len(fake.calls)
    assert cli.main(["run", str(cfg_path), "--run-dir", str(tmp_path / "taken")]) == 2
    err = capsys.readouterr().err
    assert len(fake.calls) == n and "already holds a run; continue it with `qbatch resume" in err
    # one a process writes now: a resume would be refused too
    writer = RunStore.open(str(tmp_path / "taken"))
    writer.lock_writer()
    try:
        assert cli.main(["run", str(cfg_path), "--run-dir", str(tmp_path / "taken")]) == 2
    finally:
        writer.unlock_writer()
    err = capsys.readouterr().err
    assert "which a process is writing now" in err and "qbatch resume" not in err, err
    assert cli.main(["run", str(cfg_path), "--run-dir", "../escape"]) == 2
    assert "`--run-dir` must be" in capsys.readouterr().err
    assert cli.main(["resume", str(tmp_path / "taken"), "--address", "10.0.0.1:6379"]) == 0
    assert fake.calls[-1] == ("resume", str(tmp_path / "taken"), "10.0.0.1:6379")


def test_run_finds_the_example_shipped_with_qbatch_outside_a_checkout(tmp_path, monkeypatch, capsys):
    """`qbatch run examples/quickstart.yaml` (the README's command) in a folder without examples/ runs the
    copy the package carries (a wheel install has no checkout), and says so; a file that exists
    wins, and other folders or unknown names stay "not found"."""
    fake = _FakeRunner()
    monkeypatch.setitem(sys.modules, "orchestrator.runner", fake)
    monkeypatch.chdir(tmp_path)
    bundled = (Path(cli.__file__).resolve().parent / "examples" / "quickstart.yaml").resolve()
    assert bundled.read_text() == (REPO / "examples" / "quickstart.yaml").read_text()
    for arg in ("examples/quickstart.yaml", "quickstart.yaml", "quickstart"):
        assert cli.main(["run", arg, "--run-dir", str(tmp_path / arg.replace("/", "_"))]) == 0
        assert Path(fake.calls[-1][1]).resolve() == bundled
        assert "running the example shipped with qbatch" in capsys.readouterr().err
    (tmp_path / "examples").mkdir()
    own = _write(tmp_path / "examples" / "quickstart.yaml", GOOD)
    assert cli.main(["run", "examples/quickstart.yaml", "--run-dir", str(tmp_path / "own")]) == 0
    assert fake.calls[-1][1] == "examples/quickstart.yaml" and Path(fake.calls[-1][1]).resolve() == own
    n = len(fake.calls)
    for arg in ("elsewhere/quickstart.yaml", "examples/no-such-example.yaml"):
        assert cli.main(["run", arg]) == 2
        assert f"config file not found: {arg}" in capsys.readouterr().err
    assert len(fake.calls) == n


@pytest.mark.parametrize("behaviour, code, text", [
    ("interrupt", 130, "qbatch resume"), ("abort", 1, "failure rate"),
    ("interrupt-early", 130, "interrupted before the run was created at "),
])
def test_run_failures_map_to_exit_codes(behaviour, code, text, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "orchestrator.runner", _FakeRunner(behaviour))
    rc = cli.main(["run", str(_write(tmp_path / "good.yaml", GOOD)), "--run-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == code and text in err and len(err.splitlines()) == 1


def _finished_run(root: Path) -> None:
    store = RunStore.create(str(root), GOOD)
    evs = []
    for i in range(6):
        tid = f"{i // 3}-{i % 3}"
        evs.append(Event("proposed", tid, time=10.0 + i, batch_id=i // 3, params={"x": i / 10}, x=[i / 10]))
        evs.append(Event("started", tid, time=11.0 + i, started_at=11.0 + i, node_id="n"))
        if i == 4:
            evs.append(
                Event("failed", tid, time=12.0 + i, started_at=11.0 + i, ended_at=12.0 + i, error="nan")
            )
        else:
            evs.append(
                Event("completed", tid, time=12.0 + i, value=float(i), started_at=11.0 + i, ended_at=12.0 + i)
            )
    evs.append(
        Event(
            "refit",
            time=20.0,
            info={"seconds": 0.5, "best_predicted": 4.2, "best_params": {"x": 0.5}, "slots": 2},
        )
    )
    store.append(evs)


def test_status_report_objectives(tmp_path, capsys):
    _finished_run(tmp_path / "run")
    assert cli.main(["status", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "6/6 (100.0%)" in out and "completed 5, failed 1" in out
    assert "best so far  5 (observed, trial 1-2)" in out and "recommendation 4.2" in out
    assert "U=0.5 over 6 s with 2 slots (recorded)" in out and "failures     nan: 1" in out
    assert cli.main(["report", str(tmp_path / "run"), "--out", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    assert "utilization U" in out and f"wrote {tmp_path / 'rep' / 'utilization.png'}" in out
    for name in ("best_vs_evaluations.png", "best_vs_time.png", "utilization.png"):
        assert (tmp_path / "rep" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for cmd in ("status", "report"):
        assert cli.main([cmd, str(tmp_path / "missing")]) == 2
        assert capsys.readouterr().err.startswith("qbatch: error: no run at ")
    assert cli.main(["objectives"]) == 0
    from objectives.registry import BUILTIN_OBJECTIVES

    listed = {
        line.split()[0]
        for line in capsys.readouterr().out.splitlines()
        if line.strip() and not line.startswith("or ")
    }
    assert listed == set(BUILTIN_OBJECTIVES)
    with pytest.raises(SystemExit) as exc:
        cli.main([])
    assert exc.value.code == 2


def _stopped_run(root: Path, budget: int) -> None:
    """Two results, one trial started and one proposed without a result, and no process writing the run."""
    store = RunStore.create(str(root), {**GOOD, "budget": budget})
    evs = [
        Event("proposed", f"0-{i}", time=10.0, batch_id=0, params={"x": i / 10}, x=[i / 10]) for i in range(3)
    ]
    evs.append(Event("proposed", "1-0", time=13.0, batch_id=1, params={"x": 0.5}, x=[0.5]))
    for i in range(3):
        evs.append(Event("started", f"0-{i}", time=11.0, started_at=11.0, node_id="n"))
    for i in range(2):
        evs.append(Event("completed", f"0-{i}", time=12.0, value=float(i), started_at=11.0, ended_at=12.0))
    store.append(evs)


def test_status_tells_unfinished_trials_from_running_ones(tmp_path, capsys):
    """A run stopped (or resumed with a budget lowered below its results) shows its trials without a result as
    unfinished, not as running and queued for good: no process writes the run."""
    root = tmp_path / "run"
    _stopped_run(root, budget=6)
    assert cli.main(["status", str(root)]) == 0
    out = capsys.readouterr().out
    assert (f"running 0, queued 0, unfinished 2 (no process is writing this run; `qbatch resume {root}` runs "
            "them)"
            in out), out
    assert cli.main(["report", str(root), "--out", str(tmp_path / "rep")]) == 0
    capsys.readouterr()
    import csv

    rows = {r["metric"]: r["value"] for r in csv.DictReader(open(tmp_path / "rep" / "summary.csv"))}
    assert (
        rows["running"] == "0"
        and rows["queued"] == "0"
        and rows["unfinished (no process writes the run)"] == "2"
    )
    writer = RunStore.open(str(root))  # the central actor of a live run holds the writer lock
    writer.lock_writer()
    try:
        assert RunStore.is_being_written(str(root)) is True
        assert cli.main(["status", str(root)]) == 0
        out = capsys.readouterr().out
        assert "running 1, queued 1\n" in out and ", unfinished" not in out
    finally:
        writer.unlock_writer()
    assert RunStore.is_being_written(str(root)) is False
    _stopped_run(tmp_path / "lowered", budget=2)  # the budget was lowered below the results: they never run
    assert cli.main(["status", str(tmp_path / "lowered")]) == 0
    assert "unfinished 2 (no process is writing this run; the budget is reached)" in capsys.readouterr().out


# ------------------------------------------------------------------ property: hostile configs
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    key=st.sampled_from(
        ["tau", "batch_size", "budget", "objective", "model", "name", "run_dir", "seed", "extra", "space"]
    ),
    value=_junk,
)
def test_property_hostile_config_never_half_made(key, value, tmp_path_factory, monkeypatch, capsys):
    root = tmp_path_factory.mktemp("cli")
    fake = _FakeRunner()
    monkeypatch.setitem(sys.modules, "orchestrator.runner", fake)
    monkeypatch.chdir(root)
    cfg = dict(GOOD)
    cfg[key] = value
    path = root / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    capsys.readouterr()
    rc = cli.main(["run", str(path)])
    err = capsys.readouterr().err
    if rc == 0:
        assert len(fake.calls) == 1  # a valid config reached the runner exactly once
    else:
        assert rc == 2 and not fake.calls
        assert len(err.splitlines()) == 1 and err.startswith("qbatch: error: ")
        assert [p.name for p in root.iterdir()] == ["c.yaml"]  # no run directory, nothing half-made


def test_bad_paths_options_and_busy_runs_are_usage_errors(tmp_path, monkeypatch, capsys):
    """Each of these is one line naming the problem and a usage exit, not a traceback with exit 1 (and a bad
    run_dir is refused before Ray starts)."""
    monkeypatch.chdir(tmp_path)
    good = _write(tmp_path / "good.yaml", GOOD)

    def one_line(rc, *texts):
        err = capsys.readouterr().err
        assert rc == 2 and len(err.splitlines()) == 1 and err.startswith("qbatch: error: "), err
        for t in texts:
            assert t in err, err

    (tmp_path / "afile").write_text("x")
    one_line(cli.main(["run", str(good), "--run-dir", str(tmp_path / "afile")]), "is a file, not a folder")
    one_line(cli.main(["run", str(good), "--run-dir", "/proc/qbatch-run"]), "/proc/qbatch-run cannot be "
                                                                            "created")
    assert not os.path.exists("/proc/qbatch-run")
    bad_obj = _write(
        tmp_path / "cnn.yaml", GOOD | {"objective": {"name": "cnn", "options": {"num_cpus": float("inf")}}}
    )
    one_line(cli.main(["run", str(bad_obj)]), "`objective`: option 'num_cpus' must be a finite number > 0; "
                                              "got inf")
    # a user objective whose constructor raises something other than ValueError: one line naming the options
    (tmp_path / "user_obj.py").write_text(
        "from objectives.functions import Forrester\ndef make(width=1.0):\n"
        "    return Forrester(bounds=[(0.0, 10.0 ** width)])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    user = _write(
        tmp_path / "user.yaml", GOOD | {"objective": {"name": "user_obj:make", "options": {"width": 400}}}
    )
    one_line(
        cli.main(["run", str(user)]),
        "`objective.options` of 'user_obj:make'",
        "'width': 400",
        "OverflowError",
    )
    assert not (tmp_path / "runs").exists()
    one_line(cli.main(["run", str(good), "--address", "not an address"]), "`--address` 'not an address'")
    # nothing listens there: Ray would retry for minutes; one connect attempt refuses it at once
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"
    t0 = time.monotonic()
    for addr in (dead, "ray://" + dead):
        one_line(cli.main(["run", str(good), "--address", addr]), f"`--address` '{addr}': nothing answers at "
                                                                  f"{dead}")
    assert time.monotonic() - t0 < 30
    one_line(cli.main(["run", str(good), "--address", "127.0.0.1:70000"]), "port 70000 is not in 1-65535")
    # a web server there (Ray's dashboard, the port `ray job submit` takes): Ray's GCS client would wait 14
    # minutes; one exchange tells HTTP/1 from the gRPC Ray speaks
    import http.server

    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):  # not on the stderr the test reads
            pass

    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        site = f"127.0.0.1:{web.server_address[1]}"
        t0 = time.monotonic()
        for addr in (site, "ray://" + site):
            one_line(cli.main(["run", str(good), "--address", addr]), f"`--address` '{addr}': {site} answers "
                                                                      "as a web server (HTTP/1)",
                     "Ray's dashboard", "6379")
        assert time.monotonic() - t0 < 30
    finally:
        web.shutdown()
        web.server_close()
    # `auto` resolving to a Ray that is gone (RAY_ADDRESS here; a killed run's record or a GCS process of
    # another network namespace alike) hung for minutes in Ray's GCS client: found in a full test run
    monkeypatch.setenv("RAY_ADDRESS", dead)
    t0 = time.monotonic()
    one_line(cli.main(["run", str(good), "--address", "auto"]), "`--address` 'auto': the Ray it finds "
                                                                f"({dead}")
    assert time.monotonic() - t0 < 30
    monkeypatch.delenv("RAY_ADDRESS")
    # `auto` with no Ray on this machine (the README's cluster command): one line, status 2, not a traceback.
    # Ray's `auto` also scans the machine's processes for a GCS server: another test process's Ray
    # (pytest-xdist) was found and the run went there, so the child sees only its own processes where a PID
    # namespace can be made
    env = {**os.environ, "RAY_TMPDIR": str(tmp_path / "no-ray"), "PYTHONPATH": str(Path(__file__).parents[2])}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [
            *own_pid_namespace(),
            sys.executable,
            "-m",
            "orchestrator.cli",
            "run",
            str(good),
            "--address",
            "auto",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "qbatch: error: `--address` 'auto': Could not find any running Ray instance. Please specify the one "
        "to connect to by setting `--address` flag or `RAY_ADDRESS` environment "
        "variable."], proc.stderr[-2000:]
    assert not (tmp_path / "runs").exists()

    _finished_run(tmp_path / "run")
    one_line(cli.main(["report", str(tmp_path / "run"), "--out", str(tmp_path / "afile")]), "`--out`")
    one_line(cli.main(["report", str(tmp_path / "run"), "--out", ""]), "`--out` must name a folder; got ''")
    holder = RunStore.open(str(tmp_path / "run"))
    holder.lock_writer()
    one_line(cli.main(["resume", str(tmp_path / "run")]), "being written by another run")
    one_line(cli.main(["resume", str(tmp_path / "nothing-here")]),
             f"qbatch: error: no run at {tmp_path / 'nothing-here'}: config.yaml not found")
    import ray

    assert not ray.is_initialized()  # each resume above was refused by the real runner before Ray started
    holder.unlock_writer()
    (tmp_path / "run" / "config.yaml").write_text("objective: [")
    one_line(cli.main(["resume", str(tmp_path / "run")]), "config.yaml is not valid YAML")


def test_damaged_run_directories_are_usage_errors(tmp_path, capsys):
    """None of these ends in a traceback with exit 1. A config.yaml that this version refuses (hand-edited, or
    written by an older version) is shown as recorded with a one-line warning naming the key: refusing it
    would hide runs that `status` and `report` can show."""

    def one_line(rc, text):
        err = capsys.readouterr().err
        assert rc == 2 and len(err.splitlines()) == 1 and err.startswith("qbatch: "
                                                                         "error: ") and text in err, err

    good = _write(tmp_path / "good.yaml", GOOD)
    (tmp_path / "afile").write_text("x")
    one_line(cli.main(["run", str(good), "--run-dir", str(tmp_path / "afile" / "run")]),
             f"`run_dir` {tmp_path / 'afile' / 'run'} cannot be created: Not a directory")
    _finished_run(tmp_path / "run")
    config = (tmp_path / "run" / "config.yaml").read_text()
    for key, bad, text in (
        ("budget", "six", "`budget` must be an integer"),
        ("budget", float("inf"), "`budget`"),
        ("tau", "abc", "`tau` must be a number"),
        ("objective", [1], "`objective`"),
        ("timeout_s", 2e6, "`timeout_s` must be"),
    ):
        edited = yaml.safe_load(config)
        (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump({**edited, key: bad}))
        for cmd in ("status", "report"):
            assert cli.main([cmd, str(tmp_path / "run")]) == 0, (key, bad, cmd)
            out, err = capsys.readouterr()
            assert err.startswith(f"qbatch: warning: {tmp_path / 'run' / 'config.yaml'}: {text}") and \
                "shown as recorded" in err and len(err.splitlines()) == 1, err
            assert "completed 5, failed 1" in out or "wrote " in out, out
    (tmp_path / "run" / "config.yaml").write_text(config)
    assert cli.main(["status", str(tmp_path / "run")]) == 0
    assert capsys.readouterr().err == ""
    shutil.rmtree(tmp_path / "run" / "events")
    (tmp_path / "run" / "events").write_text("x")
    for cmd in ("status", "report", "resume"):
        one_line(cli.main([cmd, str(tmp_path / "run")]), f"{tmp_path / 'run' / 'events'} is a file where the "
                                                         "run")
    # a file of the run that cannot be read: one line naming it, exit 1, not an OSError traceback
    (tmp_path / "run" / "events").unlink()
    (tmp_path / "run" / "events").mkdir()
    (tmp_path / "run" / "config.yaml").unlink()
    (tmp_path / "run" / "config.yaml").mkdir()
    for cmd in ("status", "report", "resume"):
        rc = cli.main([cmd, str(tmp_path / "run")])
        err = capsys.readouterr().err
        assert rc == 1 and err == (f"qbatch: error: {tmp_path / 'run' / 'config.yaml'}: Is a "
                                   "directory\n"), (cmd, err)


def test_resume_refuses_a_space_edited_since_the_run_began(tmp_path, monkeypatch, capsys):
    """After `space.x.high` is edited in config.yaml from 1 to 0.5, a resume would train the model on
    relabelled points (the logged x = 0.8 read as 0.4). Every logged point must map back to its logged
    coordinates under the stored space, else the resume is refused before Ray starts."""
    from orchestrator.runner import api

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started")

    monkeypatch.setattr(api, "ray_session", no_ray)
    run = tmp_path / "run"
    cfg = GOOD | {"space": {"x0": {"type": "float", "low": 0.0, "high": 1.0}}}  # as `run` stores it
    store = RunStore.create(str(run), cfg)
    store.append([Event("proposed", f"0-{i}", time=1.0, batch_id=0, params={"x0": v}, x=[v])
                  for i, v in enumerate([0.1, 0.8, 0.35])])
    (run / "config.yaml").write_text(yaml.safe_dump(cfg | {"budget": 12}))  # more budget: allowed
    with pytest.raises(AssertionError, match="Ray was started"):
        cli.main(["resume", str(run)])
    for space, text in [({"x0": {"type": "float", "low": 0.0, "high": 0.5}}, "`space.x0`"),
                        ({"x0": {"type": "float", "low": 0.01, "high": 1.0, "log": True}}, "`space.x0`"),
                        ({"x0": {"type": "int", "low": 0, "high": 1}}, "`space.x0`")]:
        (run / "config.yaml").write_text(yaml.safe_dump(cfg | {"budget": 12, "space": space}))
        assert cli.main(["resume", str(run)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("qbatch: error: ") and text in err and "config.yaml" in err, err


def test_the_space_check_accepts_every_parameter_kind_after_a_parquet_round_trip(tmp_path):
    """No false alarm from `_check_log_matches_space`: points of int (stepped, log), log-float and choice
    parameters (str, bool, None, list, mixed numbers), logged and read back, match their own space."""
    import numpy as np

    from orchestrator.runner import _check_log_matches_space
    from orchestrator.space import SearchSpace

    desc = {"lr": {"type": "float", "low": 1e-5, "high": 1e-1, "log": True},
            "units": {"type": "int", "low": 32, "high": 512, "step": 32},
            "depth": {"type": "int", "low": 1, "high": 1000, "log": True},
            "act": {"type": "choice", "choices": ["relu", True, None, [1, 2], 1, 2.5]},
            # (tuples are refused by the space)
            "kernel": {"type": "choice", "choices": [[3, 3], {"k": [5, 5]}]}}
    space = SearchSpace.from_description(desc)
    X = np.random.default_rng(0).random((200, 5))
    X[0], X[1] = 0.0, 1.0
    points = space.from_unit(X)
    store = RunStore.create(str(tmp_path / "run"), GOOD | {"space": desc})
    store.append([Event("proposed", f"0-{i}", time=1.0, batch_id=0, params=p, x=x.tolist())
                  for i, (p, x) in enumerate(zip(points, X))])
    _check_log_matches_space(RunStore.open(str(tmp_path / "run")).events(), space)


def test_the_end_of_run_lines_keep_a_uri_run_directory():
    """`results in` prints a URI run directory as given, not made 'absolute' against the working directory
    (`/cwd/file:/tmp/r1`), and a local path made absolute."""
    import io

    from orchestrator.runner import _report

    base = {"status": "finished", "done": 4, "completed": 4, "failed": 0, "utilization": 0.5}
    out = io.StringIO()
    _report({**base, "run_dir": "s3://bucket/qbatch-runs/r1"}, out)
    assert "qbatch: results in s3://bucket/qbatch-runs/r1\n" in out.getvalue()
    out = io.StringIO()
    _report({**base, "run_dir": "runs/r1"}, out)
    assert f"qbatch: results in {os.path.abspath('runs/r1')}\n" in out.getvalue()


def test_a_connection_error_keeps_the_cause_ray_chains():
    """A cluster with token authentication that refuses this process fails with Ray's cause (an
    AuthenticationError naming RAY_AUTH_MODE), not only "Failed to connect to Ray cluster at ..."."""
    from orchestrator.runner import _connection_error_line

    class AuthenticationError(Exception):
        pass

    try:
        try:
            raise AuthenticationError("Token authentication is enabled; set RAY_AUTH_MODE=token\nmore")
        except AuthenticationError as cause:
            raise ConnectionError("Failed to connect to Ray cluster at 127.0.0.1:6390\nretried") from cause
    except ConnectionError as exc:
        line = _connection_error_line(exc)
    assert line == ("Failed to connect to Ray cluster at 127.0.0.1:6390; AuthenticationError: Token "
                    "authentication is enabled; set RAY_AUTH_MODE=token")
    assert _connection_error_line(ConnectionError("Could not find any running Ray instance.")) == \
        "Could not find any running Ray instance."


def test_a_reader_that_leaves_the_pipe_ends_the_command_quietly(tmp_path, monkeypatch, capsys):
    """With `qbatch objectives | head`, the reader closing the pipe does not make the OSError catch print
    "qbatch: error: BrokenPipeError"; it ends quietly (exit 1), with no second error at exit."""
    sink = open(tmp_path / "sink", "w")

    class Closed:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

        def fileno(self):
            return sink.fileno()

    monkeypatch.setattr(sys, "stdout", Closed())
    assert cli.main(["objectives"]) == 1
    assert capsys.readouterr().err == ""
    sink.close()


def test_an_unreachable_gcs_run_directory_is_one_line_within_the_retry_limit(monkeypatch, capsys):
    """pyarrow retries a gs:// request for google-cloud-cpp's 15 minutes by default, so `qbatch status` (and
    run, resume) of a bucket it cannot reach would say nothing for that long. The store caps the retries
    (`GCS_RETRY_LIMIT_S`, 60 s; 2 s here) and the command ends with one line naming the URI."""
    import time

    from orchestrator.store import filesystems

    monkeypatch.setattr(filesystems, "GCS_RETRY_LIMIT_S", 2.0)
    started = time.time()
    rc = cli.main(["status", "gs://qbatch-no-such-bucket-for-tests/run"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.splitlines()) == 1 and "gs://qbatch-no-such-bucket-for-tests/run" in err, err
    assert time.time() - started < 45


def test_the_librarys_logged_warnings_reach_stderr_as_the_lines_it_words(capsys):
    """The library logs its diagnostics (`logging.getLogger(__name__)`); the command line shows each warning
    on stderr as the line the library wrote, `qbatch: ...` with nothing added, however often `main` runs."""
    import logging

    assert cli.main(["objectives"]) == 0
    assert cli.main(["objectives"]) == 0
    capsys.readouterr()
    logging.getLogger("orchestrator.store.lock").warning(
        "qbatch: no writer lock on the filesystem of %s", "R"
    )
    logging.getLogger("workers.pool").warning("qbatch: the Ray node is gone")
    logging.getLogger("orchestrator.acquisition.optimize").info("not a warning: not shown")
    assert capsys.readouterr().err == ("qbatch: no writer lock on the filesystem of R\nqbatch: the Ray node "
                                       "is gone\n")
