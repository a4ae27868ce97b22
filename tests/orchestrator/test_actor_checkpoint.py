"""The central actor checkpoints its model after every refit, and an actor rebuilt on the run directory
(resume, restart) proposes from that model instead of starting cold (orchestrator/actor/checkpoints.py
`save_model`/`restore_model`, ask_tell/replay.py `model_checkpoint`/`restore_model`).

The actor runs in this process with its Ray submission replaced by a stub; results are logged as the
dispatch loop logs them, so a second actor on the same directory replays them as a resume does.
"""

from __future__ import annotations

import itertools
import time

import pytest
import torch

from objectives.registry import load_objective
from orchestrator.actor import MODEL_CHECKPOINT, CentralActor
from orchestrator.config import load_config
from orchestrator.store import RunStore

FORRESTER = load_objective("forrester", {})


def _config(tmp_path, **over):
    cfg = {
        "name": "ckpt",
        "objective": {"name": "forrester", "options": {}},
        "batch_size": 4,
        "initial_design": 8,
        "budget": 40,
        "max_concurrent": 4,
        "seed": 2,
        "run_dir": str(tmp_path / "run"),
        "tau": 0.3,
        "model": {"type": "quantile", "options": {"max_steps": 150, "warm_max_steps": 30, "num_inducing": 8}},
    }
    cfg.update(over)
    return cfg


_OPEN: list[CentralActor] = []


def _open(run_dir: str) -> CentralActor:
    """A central actor on `run_dir`, as after a restart: the previous one's process, and so its writer lock,
    is gone (here it is released by hand, both living in this process)."""
    while _OPEN:
        _OPEN.pop().store.unlock_writer()
    actor = CentralActor(run_dir, max_concurrent=4, pool=None)
    _OPEN.append(actor)
    refs = itertools.count()
    actor.dispatcher.submit = lambda batch: [f"ref{next(refs)}" for _ in batch]
    return actor


def _evaluate_queued(actor: CentralActor) -> None:
    """Dispatch the queue and log and tell a result for every trial, as `Dispatcher.collect` does."""
    while actor.scheduler.queue:
        actor.dispatcher.dispatch()
        now = time.time()
        events, told = [], []
        for ref, (trial, _, attempt) in list(actor.scheduler.inflight.items()):
            y = float(FORRESTER(trial.params, trial.seed))
            events.append(actor.log.event("completed", trial, time=now, value=y, started_at=now, ended_at=now,
                                       attempt=attempt, info={"metrics": {}}))
            told.append((ref, trial, y))
        actor.log.append(events)
        for ref, trial, y in told:
            del actor.scheduler.inflight[ref]
            actor.opt.tell(trial.trial_id, y)
            actor.scheduler.n_completed += 1


@pytest.fixture
def fitted(tmp_path):
    cfg = _config(tmp_path)
    RunStore.create(cfg["run_dir"], load_config(cfg).to_dict())
    actor = _open(cfg["run_dir"])
    actor.planner.propose(8)
    _evaluate_queued(actor)
    assert actor.planner.refit() is True
    return cfg, actor


def test_every_refit_saves_the_model_and_a_new_actor_proposes_from_it(fitted):
    cfg, actor = fitted
    saved = RunStore.open(cfg["run_dir"]).load_checkpoint(MODEL_CHECKPOINT)
    assert saved["model_n"] == 8 and saved["model_type"] == "quantile"

    again = _open(cfg["run_dir"])  # a resume: the log replayed, the model restored, no refit
    assert again.model_restored and again.opt.model is not None and again.opt.num_stale == 0
    assert again.opt.best() == actor.opt.best()
    X = torch.linspace(0, 1, 7, dtype=torch.float64).unsqueeze(-1)
    for a, b in zip(
        actor.opt.model.posterior_f(X, full_cov=False), again.opt.model.posterior_f(X, full_cov=False)
    ):
        assert torch.equal(a, b)
    assert again.planner.propose_step() is True  # a model-based batch at once, not Sobol fillers
    assert {t.source for t in again.scheduler.queue} == {"model"}

    # new results make the restored model stale; the next refit saves a newer checkpoint
    _evaluate_queued(again)
    assert again.opt.num_stale == 4 and again.planner.refit() is True
    assert RunStore.open(cfg["run_dir"]).load_checkpoint(MODEL_CHECKPOINT)["model_n"] == 12


def test_an_unusable_checkpoint_means_a_cold_refit_not_a_failed_resume(fitted, caplog):
    cfg, actor = fitted
    actor.planner.propose(4)  # a model batch in the log
    _evaluate_queued(actor)
    store = RunStore.open(cfg["run_dir"])
    ckpt = store.load_checkpoint(MODEL_CHECKPOINT)
    store.save_checkpoint(MODEL_CHECKPOINT, {**ckpt, "model_n": 99})  # more results than the log holds
    again = _open(cfg["run_dir"])
    assert not again.model_restored and again.opt.model is None and again.opt.num_completed == 12
    assert "saw 99 results; the log holds 12" in caplog.text
    # without a model the slots do not idle through the cold refit: they get Sobol points meanwhile
    again._fill_before_first_model()
    inflight = again.scheduler.inflight
    assert len(inflight) == 4 and {t.source for t, _, _ in inflight.values()} == {"sobol"}
    store.save_checkpoint(MODEL_CHECKPOINT, {"model_n": "torn"})
    assert not _open(cfg["run_dir"]).model_restored
    assert again.planner.refit() is True and again.opt.model is not None  # the cold refit


def test_a_checkpoint_of_another_model_is_not_restored(fitted):
    cfg, _ = fitted
    store = RunStore.open(cfg["run_dir"])
    ckpt = store.load_checkpoint(MODEL_CHECKPOINT)
    store.save_checkpoint(MODEL_CHECKPOINT, {**ckpt, "model_type": "expectile"})
    again = _open(cfg["run_dir"])
    assert not again.model_restored and again.opt.model is None
    store.save_checkpoint(MODEL_CHECKPOINT, {**ckpt, "model_tau": 0.9})
    assert not _open(cfg["run_dir"]).model_restored
    # a checkpoint written before the level and options were recorded is restored at the same tau
    old = {k: v for k, v in ckpt.items() if k not in ("model_tau", "model_options")}
    store.save_checkpoint(MODEL_CHECKPOINT, old)
    assert _open(cfg["run_dir"]).model_restored
    store.save_checkpoint(MODEL_CHECKPOINT, {**old, "tau": 0.9})
    assert not _open(cfg["run_dir"]).model_restored


@pytest.mark.parametrize("edit", ["model options", "direction"])
def test_a_checkpoint_made_under_other_settings_is_not_restored(fitted, edit):
    """The model options and the direction in config.yaml may change before a resume: a checkpoint made under
    other settings is not restored, and the refit fits with the config's tau and options (a restored model's
    tau and options would be copied onto every warm refit, and after a change of direction the model would fit
    the old level of a negated outcome)."""
    import yaml

    cfg, actor = fitted
    path = f"{cfg['run_dir']}/config.yaml"
    stored = yaml.safe_load(open(path))
    if edit == "model options":
        stored["model"]["options"]["num_inducing"] = 6
    else:
        stored["direction"] = "maximize" if actor.opt.direction == "minimize" else "minimize"
    with open(path, "w") as f:
        yaml.safe_dump(stored, f)
    again = _open(cfg["run_dir"])
    assert not again.model_restored and again.opt.model is None
    assert again.planner.refit() is True
    assert again.opt.model.tau == again.opt.model_tau
    if edit == "model options":
        assert again.opt.model.options.num_inducing == 6


# ------------------------------------------------------------------------------------------ the calibrator
def _same_state(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_same_state, a, b))
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.shape == b.shape and bool(torch.equal(a, b))
    return a == b


@pytest.fixture
def calibrated(tmp_path):
    """A run with paper 000's online recalibrator (and the acquisition that reads its level map): two flushes
    teach it two chunks of 4 model-based results (each saved), and 4 more are told but not taught when the
    actor stops."""
    cfg = _config(
        tmp_path,
        calibrator={"type": "online", "options": {}},
        proposer={"type": "calibrated", "options": {}},
        model={"type": "exact-gp", "options": {}},
    )
    RunStore.create(cfg["run_dir"], load_config(cfg).to_dict())
    actor = _open(cfg["run_dir"])
    actor.planner.propose(8)
    _evaluate_queued(actor)
    for _ in range(3):
        assert actor.planner.refit() is True
        actor.planner.propose(4)  # flushes what the previous batch taught, then saves the calibrator
        _evaluate_queued(actor)
    assert actor.opt.num_calibrated == 8
    return cfg, actor


def test_a_resumed_actor_restores_the_calibrator_it_had_not_relearns_every_result(calibrated):
    """The calibrator is checkpointed with the trial ids it learned; a resume restores it, in the state the
    interrupted run's calibrator had, and teaches it only the other results (replaying every result into one
    flush would leave online OGD, LOCBO and time-series splits in another state than the run's)."""
    from orchestrator.actor import CALIBRATOR_CHECKPOINT

    cfg, actor = calibrated
    saved = RunStore.open(cfg["run_dir"]).load_checkpoint(CALIBRATOR_CHECKPOINT)
    assert len(saved["taught"]) == 8 and saved["calibrator_type"] == "online"
    again = _open(cfg["run_dir"])
    assert again.calibrator_restored == 8 and again.status()["calibrator_restored"] == 8
    assert _same_state(again.opt.calibrator.get_state(), actor.opt.calibrator.get_state())
    # the 4 results it had not learned are taught at the next flush, as the interrupted run would have
    assert again.opt.flush_calibration() == 4 and actor.opt.flush_calibration() == 4
    assert _same_state(again.opt.calibrator.get_state(), actor.opt.calibrator.get_state())

    # without the checkpoint the replayed results are learned in one chunk: another calibrator (what it fixes)
    store = RunStore.open(cfg["run_dir"])
    store.save_checkpoint(CALIBRATOR_CHECKPOINT, {**saved, "taught": []})
    cold = _open(cfg["run_dir"])
    assert cold.opt.flush_calibration() == 12
    assert not _same_state(cold.opt.calibrator.get_state(), actor.opt.calibrator.get_state())


@pytest.mark.parametrize("damage", ["unknown trial", "other calibrator", "other options", "torn"])
def test_an_unusable_calibrator_checkpoint_means_relearning_from_the_log(calibrated, damage, caplog):
    import yaml

    from orchestrator.actor import CALIBRATOR_CHECKPOINT

    cfg, actor = calibrated
    store = RunStore.open(cfg["run_dir"])
    saved = store.load_checkpoint(CALIBRATOR_CHECKPOINT)
    if damage == "unknown trial":  # learned a result the log does not hold (another run's checkpoint)
        store.save_checkpoint(CALIBRATOR_CHECKPOINT, {**saved, "taught": saved["taught"] + ["99-0"]})
    elif damage == "other calibrator":
        store.save_checkpoint(CALIBRATOR_CHECKPOINT, {**saved, "calibrator_type": "locbo"})
    elif damage == "other options":  # config.yaml edited before the resume
        path = f"{cfg['run_dir']}/config.yaml"
        stored = yaml.safe_load(open(path))
        stored["calibrator"]["options"] = {"eta": 0.5}
        with open(path, "w") as f:
            yaml.safe_dump(stored, f)
    else:
        store.save_checkpoint(CALIBRATOR_CHECKPOINT, {"taught": "torn"})
    again = _open(cfg["run_dir"])
    assert again.calibrator_restored == 0 and again.opt.num_calibrated == 0
    assert "calibrator checkpoint of" in caplog.text
    assert again.opt.flush_calibration() == 12  # every replayed result, as before checkpoints existed


def test_the_calibrator_learns_only_when_a_proposal_is_asked_so_each_lesson_is_checkpointed(calibrated):
    """The calibrator learns the told results only when a proposal is asked, not at every poll of the proposer
    thread, and is saved with that proposal, so a resume re-teaches no result it learned; the module says it
    learns "since its last proposal"."""
    from orchestrator.actor import CALIBRATOR_CHECKPOINT

    cfg, actor = calibrated
    # no proposal is due
    actor.scheduler.queue.extend(actor.opt.ask(actor.low_water(), fit=False, design=True))
    # the 4 told wait for the next ask
    assert actor.planner.propose_step() is False and actor.opt.num_calibrated == 8
    actor.scheduler.queue.clear()
    assert actor.planner.propose_step() is True and actor.opt.num_calibrated == 12
    assert len(RunStore.open(cfg["run_dir"]).load_checkpoint(CALIBRATOR_CHECKPOINT)["taught"]) == 12


def test_the_calibrator_checkpoint_is_written_after_the_proposals_that_record_its_lesson(
    calibrated, monkeypatch
):
    """The proposals' record names the results the ask's flush taught the calibrator (`learned_ids`), and the
    calibrator checkpoint is saved after that record is appended: a checkpoint one lesson behind the log is
    replayed exactly (`test_actor_guards.py`), and one ahead of the log, which saving first would leave after
    a crash between the two writes, could not be."""
    from orchestrator.actor import CALIBRATOR_CHECKPOINT

    _, actor = calibrated
    order = []
    real_append, real_save = actor.store.append, actor.store.save_checkpoint
    monkeypatch.setattr(
        actor.store,
        "append",
        lambda events: order.append(("append", {e.kind for e in events})) or real_append(events),
    )
    monkeypatch.setattr(actor.store, "save_checkpoint", lambda name, state: order.append(("save", name))
                        or real_save(name, state))
    actor.planner.propose(4)
    assert order.index(("save", CALIBRATOR_CHECKPOINT)) > order.index(("append", {"proposed"}))
