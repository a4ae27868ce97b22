"""Restoring an ask/tell optimizer: what the central actor's resume calls, and the optimizer's whole state.

A resume replays the run's event log into a fresh optimizer: each proposal re-registers its trial
(`restore_trial`), each result is told again, and each model-based ask marks where the calibrator's queue was
flushed (`end_calibration_round`). Checkpoints then put back the model (`model_checkpoint` / `restore_model`)
and the calibrator (`calibrator_checkpoint` / `restore_calibrator`) in place of refitting and re-learning.
`get_state` / `set_state` are the optimizer's portable state (STYLE.md §4.9). The replay sits apart from the
ask/tell API, as Optuna's journal storage keeps its replay of the log apart from its storage API. `Replay` is
one part of `AskTellOptimizer` (orchestrator/ask_tell/optimizer.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from orchestrator.ask_tell.calibration_queue import _CalibUpdate
from orchestrator.ask_tell.trials import Trial, trial_seed
from orchestrator.errors import QbatchError

__all__ = ["Replay"]


class Replay:
    """The optimizer's replay of a log, its checkpoints and its state."""

    # ------------------------------------------------------------------ the log's replay
    def restore_trial(
        self,
        trial_id: str,
        params: Mapping[str, Any],
        x: Sequence[float] | Tensor,
        batch_id: int,
        forecast: dict | None = None,
        seed: int | None = None,
        source: str = "sobol",
        sobol_index: int | None = None,
    ) -> Trial:
        """Re-register a trial from the event log (resume): it becomes pending until told."""
        with self._lock:
            if trial_id in self._trials:
                return self._trials[trial_id]
            xt = torch.as_tensor(list(x) if not isinstance(x, Tensor) else x, **self._tk)
            xt = xt.reshape(self.space.dim)
            seed = trial_seed(self.seed, trial_id) if seed is None else int(seed)
            t = Trial(trial_id, dict(params), xt, int(batch_id), forecast, seed, source)
            if sobol_index is not None:
                t.info["sobol_index"] = int(sobol_index)
                self._n_sobol = max(self._n_sobol, int(sobol_index) + 1)
            self._add_trial(t)
            self._pending[trial_id] = t
            if batch_id >= 0:
                self._next_batch = max(self._next_batch, int(batch_id) + 1)
            else:
                self._n_user += 1
            return t

    def end_calibration_round(
        self, after: int | None = None, learned_ids: Sequence[str] | None = None
    ) -> None:
        """Results told from now on belong to the next flush's update, not the one queued so far: what `ask`'s
        flush does, for a replay that tells a log's results in one go (the central actor calls it where the
        log shows a model-based batch proposed). Nothing is applied until `flush_calibration`.

        Args:
            after: how many results the calibrator had learned in all when that ask flushed (the actor logs it
                with each model batch, `info["calibrated"]`): the queued results past that count, in the order
                told, were told after the flush (while the ask ran, so logged before its proposals) and join
                the new round. None (a log written before the count was kept) leaves them where they are.
            learned_ids: the results that flush learned (the actor's `info["learned_ids"]`): the queued
                results of the round being ended that are not among them join the new round. Used in place of
                `after`
                when given: it does not depend on what the replay holds (a damaged log's lost results, or a
                resumed session whose first flush taught the results of several rounds).
        """
        with self._lock:
            current = self._calib_round
            self._calib_round = current + 1
            # the round being ended is the queue's tail (rounds never decrease along it): only the tail is
            # read, so a replay pays per marker for the results since the one before, not for the whole queue
            # (rebuilt whole at every marker, a replay of 20,000 one-point batches takes 11 s, quadratic)
            queue = self._calib_queue
            start = len(queue)
            while start > 0 and queue[start - 1].round == current:
                start -= 1
            tail = queue[start:]
            if learned_ids is not None:
                learned = set(learned_ids)
                last = max((j for j, u in enumerate(tail) if u.trial_id in learned), default=-1)
                # a result told before the last one this flush learned, yet not learned by it, was learned by
                # an earlier flush whose record the log lost (a damaged log): its update comes first, on its
                # own, in the round being ended (not after this one); then this flush's, then the
                # results told after it
                early = any(j < last and u.trial_id not in learned for j, u in enumerate(tail))
                base = current + 1 if early else current
                self._calib_round = base + 1
                tail = [u._replace(round=base if u.trial_id in learned else current if j < last else base + 1)
                        for j, u in enumerate(tail)]
                tail.sort(key=lambda u: u.round)  # (stable: told order within each round)
            # (only results of the round being ended move: a damaged log's count moves no more)
            elif after is not None:
                k = max(0, int(after) - len(self._calib_taught))
                tail = [u._replace(round=current + 1) if start + j >= k else u for j, u in enumerate(tail)]
            queue[start:] = tail

    # ------------------------------------------------------------------ checkpoints
    def model_checkpoint(self) -> dict[str, Any] | None:
        """The fitted model's state for a checkpoint (tensors and plain values), or None (no model yet, or a
        model without state dicts). `restore_model` puts it back in place of a refit."""
        with self._lock:
            model, n, best = self._model, self._model_n, self._best
        if model is None:
            return None
        try:
            state = model.get_state()
        except NotImplementedError:
            return None
        return {
            "model": state,
            "model_n": n,
            "model_type": self.model_name,
            "tau": self.tau,
            "direction": self.direction,
            "model_tau": self.model_tau,
            "model_options": dict(self.model_options),
            "best": None if best is None else [dict(best[0]), float(best[1])],
        }

    def restore_model(self, checkpoint: Mapping[str, Any]) -> None:
        """Use a `model_checkpoint` as the current model (a resumed run proposes from it while it refits).

        Raises:
            QbatchError: the checkpoint is of another model, level (tau and direction) or model options (an
                edited config.yaml: its settings would otherwise carry on through every warm refit), or saw
                more results than this optimizer holds (it belongs to another run).
        """
        theirs = (checkpoint.get("model_type"), checkpoint.get("model_tau"), checkpoint.get("model_options"))
        if "model_tau" not in checkpoint:  # an older version's checkpoint: it records the user's tau only
            theirs = (
                theirs[0],
                self.model_tau if checkpoint.get("tau") == self.tau else None,
                self.model_options,
            )
        direction = checkpoint.get("direction", self.direction)
        if direction != self.direction:  # tau 0.5 has the same model level in both directions
            raise QbatchError(f"the model checkpoint is of a run that {direction}s; this run "
                              f"{self.direction}s (`direction` changed)")
        if theirs != (self.model_name, self.model_tau, self.model_options):
            raise QbatchError(f"the model checkpoint is of model {theirs[0]!r} at level {theirs[1]!r} with "
                              f"options {theirs[2]!r}; this run fits {self.model_name!r} at level "
                              f"{self.model_tau!r} (tau {self.tau!r}, {self.direction}) with options "
                              f"{self.model_options!r}")
        n = int(checkpoint["model_n"])
        with self._lock:
            if n > len(self._obs_y):
                raise QbatchError(f"the model checkpoint saw {n} results; the log holds {len(self._obs_y)}")
        model = self._build_model()
        model.set_state(checkpoint["model"])
        best = checkpoint.get("best")
        with self._lock:
            self._model, self._model_n, self._recommender = model, n, None
            if best is not None:
                self._best = (dict(best[0]), float(best[1]))

    def calibrator_checkpoint(self) -> dict[str, Any] | None:
        """The calibrator's state and the trial ids it has learned from, or None without a calibrator.
        `restore_calibrator` puts it back after a log replay in place of re-learning those results."""
        if self._calibrator is None:
            return None
        with self._calib_lock:
            return {"calibrator": self._calibrator.get_state(), "taught": list(self._calib_taught),
                    "calibrator_type": self.calibrator_name}

    def restore_calibrator(self, checkpoint: Mapping[str, Any]) -> int:
        """Use a `calibrator_checkpoint` after the results were replayed into this optimizer (told, their
        calibrator updates still queued): the calibrator takes the checkpoint's state and the queued updates
        of the results it had learned are dropped; the others stay queued, applied at the next flush. A
        resumed run's calibrator so ends where the interrupted run's was, not in the state of learning every
        result again in one flush (online OGD, LOCBO and time-series splits depend on the chunks).

        Returns:
            the number of results the restored calibrator had learned.

        Raises:
            QbatchError: no calibrator here, a checkpoint of another calibrator or other options, or one that
                learned results this optimizer holds no queued update for (another run, or a damaged log).
        """
        if self._calibrator is None:
            raise QbatchError("this run has no calibrator to restore")
        if checkpoint.get("calibrator_type") != self.calibrator_name:
            raise QbatchError("the calibrator checkpoint is of calibrator "
                              f"{checkpoint.get('calibrator_type')!r}; this run uses "
                              f"{self.calibrator_name!r}")
        taught = [str(t) for t in checkpoint["taught"]]
        with self._calib_lock:
            with self._lock:
                if self._calib_taught:
                    raise QbatchError(f"the calibrator has learned {len(self._calib_taught)} results "
                                      "already; a checkpoint is restored only right after the replay")
                queued = {u.trial_id for u in self._calib_queue}
                missing = [t for t in taught if t not in queued]
                if missing or len(set(taught)) != len(taught):
                    raise QbatchError("the calibrator checkpoint learned results the log does not hold "
                                      f"(e.g. {(missing or taught)[0]!r})")
            before = self._calibrator.get_state()
            try:
                self._calibrator.set_state(checkpoint["calibrator"])
            except Exception:
                self._calibrator.set_state(before)
                raise
            done = set(taught)
            with self._lock:
                # every result the checkpoint's last flush could see was learned by it: one still queued was
                # told after that flush, whatever round the replay gave it (a result told while an ask ran is
                # logged before the ask's proposals), so it joins the first round after the learned ones (left
                # in the last learned round, the next flush would step twice where the run stepped once)
                last = max((u.round for u in self._calib_queue if u.trial_id in done), default=-1)
                self._calib_queue = [u if u.round > last else u._replace(round=last + 1)
                                     for u in self._calib_queue if u.trial_id not in done]
                self._calib_round = max(self._calib_round, last + 1)
                self._calib_taught = taught
        return len(taught)

    # ------------------------------------------------------------------ the whole state
    def get_state(self) -> dict[str, Any]:
        """Plain values and tensors only (loads with `torch.load(weights_only=True)`)."""
        # a flush takes the queue under `_lock` and teaches the calibrator outside it: without `_calib_lock`,
        # a state saved in between would hold those results neither queued nor learned
        with self._calib_lock, self._lock:
            trials = [
                {
                    "trial_id": t.trial_id,
                    "params": dict(t.params),
                    "x": t.x.tolist(),
                    "batch_id": t.batch_id,
                    "forecast": t.forecast,
                    "seed": t.seed,
                    "source": t.source,
                    "info": dict(t.info),
                }
                for t in self._trials.values()
            ]
            state: dict[str, Any] = {
                "trials": trials,
                "pending": list(self._pending),
                "told": dict(self._told),
                "obs_ids": list(self._obs_ids),
                "obs_y": list(self._obs_y),
                "failures": [dict(f) for f in self.failures],
                "n_sobol": self._n_sobol,
                "next_batch": self._next_batch,
                "n_user": self._n_user,
                "model_n": self._model_n,
                "best": None if self._best is None else [dict(self._best[0]), self._best[1]],
                # calibrator updates told but not yet applied (`defer_calibration`), by trial id
                "calib_queue": [[u.trial_id, float(u.y), int(u.round)] for u in self._calib_queue],
                "calib_round": self._calib_round,
                "settings": self._settings(),
                "calib_taught": list(self._calib_taught),
            }
            if self._model is not None:
                try:
                    state["model"] = self._model.get_state()
                except NotImplementedError:
                    state["model"] = None
            if self._calibrator is not None:
                state["calibrator"] = self._calibrator.get_state()
            if self._proposer is not None:
                state["proposer"] = self._proposer.get_state()
        return state

    def _settings(self) -> dict[str, Any]:
        """What a state's trials and model mean (JSON form): the space, the direction, the level and the
        model. The proposer and calibrator may differ (a benchmark starts every calibrator from one first fit;
        a calibrator refuses another's state itself)."""
        settings = {
            "space": self.space.describe(),
            "direction": self.direction,
            "tau": self.tau,
            "model_tau": self.model_tau,
            "model": self.model_name,
            "model_options": self.model_options,
        }
        return json.loads(json.dumps(settings, default=repr))

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore from `get_state`. Without a model state the next `ask` refits from the observations.

        Raises:
            QbatchError: the state was saved by an optimizer with another space, direction, tau, model or
                model options, naming the first that differs (a minimize state loaded into a maximize
                optimizer would flip every value's sign, and one of another space would relabel its points).
        """
        theirs = state.get("settings")
        if theirs is not None:  # (states of older versions carry none)
            ours = self._settings()
            for key in ours:
                if key in theirs and theirs[key] != ours[key]:
                    raise QbatchError(f"the state was saved by an optimizer with {key}={theirs[key]!r}; this "
                                      f"one has {key}={ours[key]!r}: build it with the same settings to "
                                      "restore the state")
        with self._lock:
            self._trials, self._seq = {}, {}
            for r in state["trials"]:
                t = Trial(
                    r["trial_id"],
                    dict(r["params"]),
                    torch.tensor(r["x"], **self._tk),
                    int(r["batch_id"]),
                    r["forecast"],
                    int(r["seed"]),
                    r["source"],
                    dict(r.get("info", {})),
                )
                self._add_trial(t)
            self._pending = {tid: self._trials[tid] for tid in state["pending"]}
            self._told = dict(state["told"])
            obs = sorted(zip(state["obs_ids"], state["obs_y"]), key=lambda o: self._seq[o[0]])  # ask order
            self._obs_ids = [tid for tid, _ in obs]
            self._obs_seq = [self._seq[tid] for tid in self._obs_ids]
            self._obs_x = [self._trials[tid].x for tid in self._obs_ids]
            self._obs_y = [float(v) for _, v in obs]
            self.failures = [dict(f) for f in state["failures"]]
            self._n_sobol = int(state["n_sobol"])
            self._next_batch = int(state["next_batch"])
            self._n_user = int(state["n_user"])
            self._n_prior = sum(
                st == "completed" and self._trials[tid].source == "user" for tid, st in self._told.items()
            )
            self._best = (
                None if state.get("best") is None else (dict(state["best"][0]), float(state["best"][1]))
            )
            # (states saved before the rounds were kept hold [id, y]: one round)
            self._calib_queue = [_CalibUpdate(self._seq[u[0]], u[0], self._trials[u[0]].forecast, float(u[1]),
                                              self._trials[u[0]].x, int(u[2]) if len(u) > 2 else 0)
                                 for u in state.get("calib_queue", [])]
            self._calib_round = int(
                state.get("calib_round", max([u.round for u in self._calib_queue], default=0))
            )
            self._calib_taught = list(state.get("calib_taught", []))
            self._model, self._model_n = None, 0
            if state.get("model") is not None:
                model = self._build_model()
                model.set_state(state["model"])
                self._model, self._model_n = model, int(state["model_n"])
            if self._calibrator is not None and state.get("calibrator") is not None:
                self._calibrator.set_state(state["calibrator"])
            if state.get("proposer") is not None:
                self._proposer = self._build_proposer()
                self._proposer.set_state(state["proposer"])
