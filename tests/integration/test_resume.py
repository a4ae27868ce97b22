"""Acceptance: SIGKILL the driver and the central actor mid-run, then
`resume_experiment` finishes it; no completed result is lost or duplicated and the count equals the budget."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.runner import NAMESPACE, actor_name, resume_experiment
from orchestrator.store import RunStore
from tests.faults.conftest import wait_for
from tests.integration.conftest import finished_counts, run_config

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]
BUDGET = 40

def _events(run_dir):
    try:
        return RunStore.open(run_dir).events()
    except Exception:
        return []



def test_sigkill_driver_and_actor_then_resume(ray_local, tmp_path):
    import ray

    cfg = run_config(tmp_path, "killed", objective={"name": "sleep", "options": {"mean_s": 0.2, "cv": 0.5,
                     "num_cpus": 1}}, tau=0.3, batch_size=10, initial_design=12, budget=BUDGET)
    run_dir = cfg["run_dir"]
    code = (
        "import json, sys; from orchestrator.runner import run_experiment; "
        f"run_experiment(json.loads(sys.argv[1]), address={ray_local!r}, progress=False)"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    driver = subprocess.Popen([sys.executable, "-c", code, json.dumps(cfg)], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        # mid-run: after the model has taken over and some of its proposals are done
        wait_for(lambda: len(finished_counts(_events(run_dir))) >= 18, 120, "18 finished "
                                                                            "evaluations", period=0.2)
        actor = ray.get_actor(actor_name(run_dir), namespace=NAMESPACE)
        actor_pid = ray.get(actor.pid.remote(), timeout=30)
    finally:
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
    try:
        os.kill(actor_pid, signal.SIGKILL)  # Ray may already have reaped it with its driver's job
    except ProcessLookupError:
        pass
    wait_for(
        lambda: (
            not Path(f"/proc/{actor_pid}").exists()
            or "zombie" in Path(f"/proc/{actor_pid}/status").read_text()
        ),
        30,
        "the actor process to die",
        period=0.2,
    )
    time.sleep(1.0)  # let in-flight events of the dead actor settle (none can be written any more)

    before = _events(run_dir)
    done_before = {e.trial_id: e for e in before if e.kind in ("completed", "failed")}
    unfinished = {e.trial_id for e in before if e.kind == "proposed"} - set(done_before)
    assert 0 < len(done_before) < BUDGET, "the kill happened mid-run"

    summary = resume_experiment(run_dir, progress=False, out=io.StringIO())
    assert summary["status"] == "finished"
    # a model fitted before the kill (if its first fit ended in time) is restored from checkpoints/model, and
    # none is made up when there was none (tests/orchestrator/test_actor_checkpoint.py tests the restore
    # itself)
    fitted_before = any(e.kind == "refit" and not (e.info or {}).get("failed") for e in before)
    assert summary["model_restored"] is fitted_before

    after = _events(run_dir)
    counts = finished_counts(after)
    assert len(counts) == BUDGET and set(counts.values()) == {1}, "no loss, no duplicate, count == budget"
    for e in after:  # every result recorded before the kill is still there, unchanged
        if e.kind in ("completed", "failed") and e.trial_id in done_before:
            assert e.value == done_before[e.trial_id].value and e.time == done_before[e.trial_id].time
    finished_after = {e.trial_id for e in after if e.kind in ("completed", "failed")}
    assert unfinished <= finished_after, "trials proposed before the kill were re-dispatched"
    proposed_ids = [e.trial_id for e in after if e.kind == "proposed"]
    assert len(proposed_ids) == len(set(proposed_ids)), "trial ids stay unique across the resume"
    refits = [e for e in after if e.kind == "refit" and e.time > max(x.time for x in before)]
    assert refits and refits[-1].info["n"] >= len([e for e in done_before.values() if e.kind == "completed"])


def test_a_driver_killed_with_its_own_local_ray_leaves_the_run_free_to_resume(ray_local, tmp_path):
    """`qbatch run` with its own local Ray, SIGKILLed: its leftover actors end with their raylet (a central
    actor living on would hold the writer lock, and `qbatch resume` would be refused as if another run were
    writing; `tests/workers/test_node_watch.py` tests the watch that ends them), and the run resumes to its
    budget with every result once."""
    budget = 24
    cfg = run_config(tmp_path, "own-ray", objective={"name": "sleep", "options": {"mean_s": 0.1, "cv": 0.5,
                     "num_cpus": 0.5}}, tau=0.3, batch_size=8, initial_design=8, budget=budget)
    run_dir = cfg["run_dir"]
    path = tmp_path / "own-ray.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(REPO)
    driver = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", str(path)],
                              cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: len(finished_counts(_events(run_dir))) >= 10, 120, "10 finished "
                                                                            "evaluations", period=0.1)
    finally:
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()

    def free() -> bool:
        try:
            RunStore.check_writer_free(run_dir)
            return True
        except Exception:
            return False

    wait_for(free, 15, "the writer lock to be freed (the leftover central actor to exit)", period=0.1)
    summary = resume_experiment(run_dir, progress=False, out=io.StringIO())
    counts = finished_counts(_events(run_dir))
    assert summary["status"] == "finished" and len(counts) == budget and set(counts.values()) == {1}


def test_resume_proposes_from_the_checkpointed_model(ray_local, tmp_path):
    """Every refit saves checkpoints/model; an actor rebuilt on the run directory restores it (through Ray, as
    `qbatch resume` builds it) instead of refitting cold. Here the run has finished, so the resume only
    rebuilds the actor and reports."""
    from orchestrator.runner import run_experiment

    cfg = run_config(tmp_path, "ckpt", objective={"name": "sleep", "options": {"mean_s": 0.05, "cv": 0.5,
                     "num_cpus": 1}}, batch_size=5, initial_design=8, budget=30)
    first = run_experiment(cfg, address=ray_local, progress=False, out=io.StringIO())
    assert first["status"] == "finished" and first["model_restored"] is False
    assert (Path(cfg["run_dir"]) / "checkpoints" / "model.pt").is_file()
    again = resume_experiment(cfg["run_dir"], address=ray_local, progress=False, out=io.StringIO())
    assert again["status"] == "finished" and again["model_restored"] is True and again["done"] == 30


def test_a_second_resume_of_a_running_run_is_refused_and_loses_nothing(ray_local, tmp_path):
    """Two writers of one log would lose results silently; the central actor holds the run's writer lock, so a
    resume while the run goes on is one error naming the holder, before Ray is touched."""
    import threading

    from orchestrator.runner import run_experiment
    from orchestrator.store import StoreError

    cfg = run_config(tmp_path, "busy", budget=12, batch_size=4, initial_design=4,
                     objective={"name": "sleep", "options": {"mean_s": 0.5, "cv": 0.0, "num_cpus": 1}})
    done = {}
    t = threading.Thread(target=lambda: done.update(run_experiment(cfg, progress=False, out=io.StringIO())))
    t.start()
    try:
        wait_for(
            lambda: any(e.kind == "started" or e.kind == "completed" for e in _events(cfg["run_dir"])),
            60,
            "the run to start",
        )
        with pytest.raises(StoreError, match="being written by another run \\(pid \\d+ on "):
            resume_experiment(cfg["run_dir"], progress=False, out=io.StringIO())
    finally:
        t.join(120)
    assert done["status"] == "finished" and done["completed"] == 12
    counts = finished_counts(RunStore.open(cfg["run_dir"]).events())
    assert len(counts) == 12 and set(counts.values()) == {1}
    RunStore.check_writer_free(cfg["run_dir"])  # the finished run's actor let go of it


def test_a_bad_stored_config_names_its_file(ray_local, tmp_path):
    from orchestrator.errors import ConfigError

    cfg = run_config(tmp_path, "edited", budget=4, batch_size=4, initial_design=4)
    RunStore.create(cfg["run_dir"], cfg)
    path = os.path.join(cfg["run_dir"], "config.yaml")
    Path(path).write_text(Path(path).read_text().replace("budget: 4", "budget: thirty"))
    with pytest.raises(ConfigError, match=rf"^{path}: `budget` must be an integer .*got 'thirty'"):
        resume_experiment(cfg["run_dir"], progress=False, out=io.StringIO())


@pytest.mark.slow
def test_a_relative_data_path_is_stored_absolute_and_resumes_from_anywhere(ray_local, tmp_path, lcls_csv,
                                                                          monkeypatch):
    """A path option given relative to the current directory (the laser's `csv_path`) is stored absolute in
    the run's config.yaml, so `qbatch resume` from another directory (and workers elsewhere) read the same
    file; it used to be stored as written, and the resume failed ("is not a file") or read another file."""
    import shutil

    import yaml

    from orchestrator.runner import run_experiment

    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(lcls_csv, work / "data.csv")
    monkeypatch.chdir(work)
    cfg = run_config(tmp_path, "relpath", objective={"name": "laser", "options": {"csv_path": "data.csv",
                     "n_gp_max": 40}}, proposer={"type": "random"}, batch_size=4, initial_design=4, budget=4)
    first = run_experiment(cfg, address=ray_local, progress=False, out=io.StringIO())
    assert first["status"] == "finished" and first["done"] == 4
    stored = yaml.safe_load((Path(cfg["run_dir"]) / "config.yaml").read_text())
    assert stored["objective"]["options"]["csv_path"] == str(work / "data.csv")
    monkeypatch.chdir(tmp_path)
    again = resume_experiment(cfg["run_dir"], address=ray_local, progress=False, out=io.StringIO())
    assert again["status"] == "finished" and again["done"] == 4


def test_sigterm_to_the_process_group_starts_nothing_new(ray_local, tmp_path):
    """SIGTERM to the whole process group (SLURM's scancel, a group kill) also stops Ray's GCS, so a
    `ray.kill` of the central actor (a GCS request) does nothing and the actor would go on proposing and
    starting evaluations for 6-9 s until its raylet drained: the driver tells the actor to stop directly."""
    cfg = run_config(tmp_path, "group-term", objective={"name": "sleep", "options": {"mean_s": 1.0, "cv": 0.3,
                     "num_cpus": 0.5}}, tau=0.3, batch_size=8, initial_design=8, budget=80)
    run_dir = cfg["run_dir"]
    path = tmp_path / "group-term.yaml"
    path.write_text(json.dumps(cfg))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(REPO)
    driver = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", str(path)],
                              cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        wait_for(lambda: len(finished_counts(_events(run_dir))) >= 10, 120, "10 finished "
                                                                            "evaluations", period=0.1)
        signalled = time.time()
        os.killpg(driver.pid, signal.SIGTERM)
        _, err = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    assert driver.returncode == 130 and "qbatch resume" in err, err[-2000:]
    late = [e for e in _events(run_dir) if e.kind in ("started", "proposed") and e.time > signalled + 1.0]
    assert not late, f"{len(late)} evaluations proposed or started after the signal"
