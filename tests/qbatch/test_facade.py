"""`import qbatch` (qbatch/__init__.py): one import for the public API, light (neither torch nor Ray nor
pandas), and unbroken by a user's module named like one of the layout's packages in the working folder. The
shadowing tests run Python in a temporary folder holding `objectives.py`, `workers.py` and `orchestrator.py`,
with the repository on `PYTHONPATH` as an installed package is on the path, and the repository root not the
working folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import qbatch

REPO = Path(__file__).resolve().parents[2]
SHADOWS = ("objectives", "workers", "orchestrator")


def test_every_exported_name_is_the_object_of_its_module():
    from objectives import base
    from orchestrator import ask_tell, runner
    from orchestrator.runner import optimize
    from orchestrator.store import frame

    expected = {
        "AskTellOptimizer": ask_tell.AskTellOptimizer,
        "run_experiment": runner.run_experiment,
        "resume_experiment": runner.resume_experiment,
        "read_trials": frame.read_trials,
        "optimize": optimize.optimize,
        "OptimizeResult": optimize.OptimizeResult,
        "Recommendation": optimize.Recommendation,
        "Objective": base.Objective,
        "EvalResult": base.EvalResult,
        "Resources": base.Resources,
    }
    assert set(qbatch.__all__) == set(expected)
    for name, obj in expected.items():
        assert getattr(qbatch, name) is obj, name
    assert set(qbatch.__all__) <= set(dir(qbatch))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        qbatch.nope  # noqa: B018


def _python(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Python in `cwd` with the repository on PYTHONPATH, as a pip-installed user has the library."""
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_importing_qbatch_loads_neither_torch_nor_ray_nor_pandas(tmp_path):
    code = ("import sys, qbatch; print(sorted(m for m in ('torch', 'ray', 'pandas', 'numpy', 'orchestrator') "
            "if m in sys.modules))")
    proc = _python(tmp_path, "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.fixture
def shadowed(tmp_path) -> Path:
    """A working folder with a user's module named like each of the layout's packages, and a package folder
    too."""
    for name in SHADOWS:
        (tmp_path / f"{name}.py").write_text(f"WHO = 'the user module {name}'\n")
    return tmp_path


_USES = textwrap.dedent("""
    import json, sys
    import qbatch
    used = [qbatch.optimize, qbatch.read_trials, qbatch.AskTellOptimizer, qbatch.run_experiment,
            qbatch.Objective]
    from orchestrator.runner import run_experiment
    from workers.by_value import CallableObjective
    files = sorted({sys.modules[m].__file__ for m in ("objectives", "workers", "orchestrator")})
    print(json.dumps({"files": files, "optimize": qbatch.optimize.__module__}))
""")


def test_the_shadowing_modules_break_a_plain_import(shadowed):
    """The setting is real: without qbatch's binding, the library cannot be imported from this folder."""
    proc = _python(shadowed, "-c", "import orchestrator.runner")
    assert proc.returncode != 0 and "is not a package" in proc.stderr


@pytest.mark.parametrize("how", ["-c", "script"])
def test_import_qbatch_and_qbatch_optimize_work_beside_shadowing_modules(shadowed, how):
    if how == "-c":  # sys.path[0] is '' (the working folder)
        proc = _python(shadowed, "-c", _USES)
    else:  # sys.path[0] is the script's folder
        (shadowed / "use.py").write_text(_USES)
        proc = _python(shadowed, "use.py")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["files"] == sorted(str(REPO / name / "__init__.py") for name in SHADOWS)
    assert out["optimize"] == "orchestrator.runner.optimize"
    assert "UserWarning" not in proc.stderr


def test_a_user_module_imported_first_stays_usable_and_is_named_in_a_warning(shadowed):
    code = textwrap.dedent("""
        import objectives as mine
        import qbatch
        print(mine.WHO)
        print(qbatch.Objective.__module__)
        import objectives
        print(objectives.__file__)
    """)
    proc = _python(shadowed, "-c", code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    who, module, file = proc.stdout.split("\n")[:3]
    assert who == "the user module objectives" and module == "objectives.base"
    assert file == str(REPO / "objectives" / "__init__.py")
    assert "UserWarning" in proc.stderr and str(shadowed / "objectives.py") in proc.stderr
    assert "Rename yours" in proc.stderr


def test_a_user_package_folder_is_shadowed_as_a_module_is(tmp_path):
    (tmp_path / "workers").mkdir()
    (tmp_path / "workers" / "__init__.py").write_text("WHO = 'the user package'\n")
    proc = _python(tmp_path, "-c", _USES)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert str(REPO / "workers" / "__init__.py") in json.loads(proc.stdout)["files"]


def test_the_runner_names_the_shadowing_modules_its_ray_workers_would_import(shadowed, monkeypatch):
    """Ray puts the driver's working folder and script folder first on its workers' paths: the runner finds
    the modules there that are named like the packages (and gives the Ray it starts a setup hook); in the
    repository root, whose packages are the library's own, it finds none and leaves `ray.init` as it is."""
    from orchestrator.runner import session

    monkeypatch.setattr(sys, "argv", [str(shadowed / "script.py")])
    monkeypatch.chdir(shadowed)
    assert sorted(session._shadowing_modules()) == sorted(str(shadowed / f"{n}.py") for n in SHADOWS)
    hook = session._worker_setup()["runtime_env"]["worker_process_setup_hook"]
    assert callable(hook)
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "argv", [str(REPO / "script.py")])
    assert session._shadowing_modules() == [] and session._worker_setup() == {}


def test_the_worker_setup_hook_binds_the_packages_in_a_fresh_process(shadowed):
    """The hook, pickled by value as Ray sends it, run in a process whose path then gets the shadowing folder
    first (what Ray does to a worker after the hook): the library's packages still import."""
    import ray.cloudpickle as cloudpickle

    from orchestrator.runner import session

    hook = cloudpickle.dumps(session._packages_first(session.PACKAGES))
    (shadowed / "hook.pkl").write_bytes(hook)
    code = textwrap.dedent(f"""
        import pickle, sys
        sys.path = [p for p in sys.path if p not in ('', {str(shadowed)!r})]
        pickle.loads(open({str(shadowed / 'hook.pkl')!r}, 'rb').read())()
        assert 'orchestrator.runner' not in sys.modules  # sent by value: the runner is not imported
        sys.path.insert(0, {str(shadowed)!r})
        import workers.evaluate, orchestrator.store, objectives.base
        print(workers.__file__)
    """)
    proc = _python(REPO, "-c", code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == str(REPO / "workers" / "__init__.py")


def test_a_run_on_the_callers_ray_names_the_shadowing_modules(shadowed, monkeypatch, capsys):
    """The Ray a caller started has its workers already: no hook can reach them, so the run says what to
    change."""
    import ray

    from orchestrator.runner import session

    monkeypatch.chdir(shadowed)
    monkeypatch.setattr(sys, "argv", [""])
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(session, "_check_same_ray", lambda address, num_cpus: None)
    assert session.OwnRay()._acquire_unlocked(None, None) is False
    err = capsys.readouterr().err
    for name in SHADOWS:
        assert f"{shadowed / name}.py is named like one of qbatch's packages" in err
    assert "rename it" in err
