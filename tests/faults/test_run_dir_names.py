"""Run-directory names from configs cannot escape their parent folder.

A run's folder is `run_dir` if the config (or ``--run-dir``) gives one, else ``runs/<name>-<timestamp>``.
A `name` that is a path ("../x", "/abs/x", "a/../../b") and a `run_dir` with a ".." component are refused
with one error naming the key, before Ray starts, and nothing is created anywhere: checked through
`run_experiment` and through the CLI in a scratch working directory, and as a property over arbitrary names.
No Ray is started by these tests (a refused config never reaches it).
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator import cli
from orchestrator.config import load_config
from orchestrator.errors import ConfigError
from orchestrator.runner import run_experiment
from orchestrator.store import RunStore, StoreError

BASE = {"objective": {"name": "forrester"}, "budget": 4, "batch_size": 2, "initial_design": 2}

BAD_NAMES = [
    "../x",
    "..",
    ".",
    "/tmp/qbatch-escape",
    "a/../../b",
    "a/b",
    "..\\x",
    "~/x",
    "-x",
    " x",
    "x\x00y",
    "",
]
BAD_RUN_DIRS = ["../x", "a/../../b", "runs/../../x", "..", "./..", "x/..", "..\\x", "a\\..\\..\\b",
                "file://../x", "file:///tmp/a/../../etc", "s3://bucket/../x", "", " ", "x\x00y", "a\nb"]


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A working directory `sandbox/work` inside a parent `sandbox`: whatever a run creates must be seen
    here."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    before = _tree(tmp_path)
    yield tmp_path
    assert _tree(tmp_path) == before, "a refused config created files"


def _assert_refused(cfg, key, sandbox):
    with pytest.raises(ConfigError) as info:
        run_experiment(cfg, progress=False)
    msg = str(info.value)
    assert f"`{key}`" in msg and len(msg.splitlines()) == 1, msg
    import ray

    assert not ray.is_initialized(), "Ray was started for a refused config"


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_path_like_name_is_refused_and_creates_nothing(name, sandbox):
    _assert_refused(BASE | {"name": name}, "name", sandbox)


@pytest.mark.parametrize("run_dir", BAD_RUN_DIRS, ids=repr)
def test_escaping_run_dir_is_refused_and_creates_nothing(run_dir, sandbox):
    _assert_refused(BASE | {"name": "ok", "run_dir": run_dir}, "run_dir", sandbox)


@pytest.mark.parametrize("run_dir", ["../x", "a/../../b"])
def test_escaping_run_dir_override_is_refused(run_dir, sandbox):
    with pytest.raises(ConfigError, match="`--run-dir`"):
        run_experiment(BASE | {"name": "ok"}, run_dir=run_dir, progress=False)


@pytest.mark.parametrize(
    "patch,key",
    [
        ({"name": "../escape"}, "name"),
        ({"run_dir": "a/../../escape"}, "run_dir"),
        ({"name": "/tmp/qbatch-escape"}, "name"),
    ],
)
def test_cli_refuses_with_one_line_exit_2_and_creates_nothing(patch, key, sandbox, capsys):
    path = sandbox / "work" / "cfg.yaml"
    path.write_text(yaml.safe_dump(BASE | patch))
    before = _tree(sandbox)
    rc = cli.main(["run", str(path)])
    out, err = capsys.readouterr()
    assert rc == cli.EXIT_USAGE and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"`{key}`" in lines[0], err
    assert _tree(sandbox) == before
    path.unlink()
    rc = cli.main(["run", str(sandbox / "work" / "missing.yaml"), "--run-dir", "../escape"])
    capsys.readouterr()
    assert rc == cli.EXIT_USAGE and not (sandbox / "escape").exists()


def test_the_default_run_dir_stays_under_runs(sandbox):
    cfg = load_config(BASE | {"name": "a..b.-c"})
    path = cfg.resolve_run_dir(now=0.0)
    assert Path(path).parent == Path("runs") and Path(path).name.startswith("a..b.-c-")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text(max_size=40))
def test_property_any_name_is_refused_or_stays_inside_runs(name):
    """Whatever the name: a ConfigError naming `name`, or a folder directly inside runs/."""
    try:
        cfg = load_config(BASE | {"name": name})
    except ConfigError as exc:
        assert "`name`" in str(exc)
        return
    path = cfg.resolve_run_dir(now=0.0)
    assert not os.path.isabs(path)
    parts = Path(os.path.normpath(path)).parts
    assert len(parts) == 2 and parts[0] == "runs" and parts[1] not in (".", ".."), path


@settings(max_examples=300, deadline=None)
@given(
    run_dir=st.lists(st.sampled_from(["..", ".", "a", "b.c", "", "...", "x..", "~"]), min_size=1, max_size=5)
    .map("/".join)
    .filter(lambda p: not p.startswith(("/", "~")))
)
def test_property_relative_run_dir_never_climbs_out(run_dir):
    """A relative run_dir is refused (naming `run_dir`) or stays below the working directory (a leading `~` is
    the home folder, as in a shell: the test below)."""
    try:
        cfg = load_config(BASE | {"name": "ok", "run_dir": run_dir})
    except ConfigError as exc:
        assert "`run_dir`" in str(exc)
        return
    norm = os.path.normpath(cfg.resolve_run_dir())
    assert not os.path.isabs(norm) and norm.split(os.sep)[0] != "..", (run_dir, norm)



@pytest.mark.ray
def test_run_dir_that_is_a_non_empty_folder_is_refused(tmp_path):
    import ray

    home = tmp_path / "home"  # e.g. run_dir: "." or "~" resolved by the user's shell
    home.mkdir()
    (home / "notes.txt").write_text("the user's own file\n")
    cfg = BASE | {"name": "ok", "run_dir": str(home), "proposer": "sobol", "budget": 2, "initial_design": 2}
    error = None
    try:
        run_experiment(cfg, num_cpus=1, progress=False, out=io.StringIO())
    except Exception as exc:  # noqa: BLE001 -- inspected below
        error = exc
    finally:
        if ray.is_initialized():
            ray.shutdown()
    written = sorted(_tree(home) - {"notes.txt"})
    assert isinstance(error, (ConfigError, StoreError)) and "run_dir" in str(error), (
        f"the run went ahead ({error!r}) and wrote {written[:5]} into the user's folder"
    )
    assert not written


def test_a_run_dir_under_the_home_folder_is_expanded_not_made_below_the_working_directory(
    tmp_path, monkeypatch
):
    """`run_dir: ~/runs/x` expands `~`, as objective paths do, rather than making a folder named `~` in the
    working directory. Here the home run directory already holds a run, so the run is refused naming the
    expanded path, before Ray starts (unexpanded, it would go on to `./~/runs/x`)."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    cfg = BASE | {"name": "ok", "run_dir": "~/runs/x", "proposer": "sobol", "budget": 2, "initial_design": 2}
    assert load_config(cfg).resolve_run_dir() == str(home / "runs" / "x")  # what `qbatch run` checks first
    assert load_config(cfg).resolve_run_dir("~/y") == str(home / "y")  # --run-dir
    RunStore.create(str(home / "runs" / "x"), load_config(cfg).to_dict())
    with pytest.raises(ConfigError, match=f"`run_dir` '{home / 'runs' / 'x'}' already holds a run"):
        run_experiment(cfg, num_cpus=1, progress=False, out=io.StringIO())
    assert not (work / "~").exists()
