"""The central Ray actor: ask/tell state, model refits and the streaming evaluation pipeline.

ARCHITECTURE.md "The path of one evaluation", steps 2-6. One `CentralActor` (`central.py`) owns the run's
`AskTellOptimizer` and its `RunStore`, and hands the work to its parts, as a Ray Tune controller hands it to
its managers:

- `scheduler.py`: the slot scheduler, without Ray: the queue of proposed trials, the evaluations in flight,
  the budget count with the proposals under way, the low-water mark of the queue;
- `dispatch.py`: the Ray side of it: evaluations submitted (through the run's `EvaluationPool`), results
  collected one at a time, logged durably and only then told, exactly once per trial id; `backstop.py` cancels
  an evaluation whose frozen worker cannot enforce its own timeout;
- `planner.py`: proposals and refits, in two background threads or, with ``synchronous: true``, in the papers'
  protocol;
- `log.py`: the writes to the event log; `replay.py`: the actor rebuilt from it (resume, restart);
  `checkpoints.py`: the model and calibrator checkpoints a resumed actor goes on from;
- `guard.py`: the failure guard and the one cause of an aborted run; `notices.py`: the lines for the user;
  `resources.py`: how many evaluations the cluster runs at once.
"""

from __future__ import annotations

from orchestrator.actor.central import CentralActor
from orchestrator.actor.checkpoints import CALIBRATOR_CHECKPOINT, MODEL_CHECKPOINT
from orchestrator.actor.guard import RunAbortedError
from orchestrator.actor.resources import default_max_concurrent, resource_request, slots_for

__all__ = [
    "CALIBRATOR_CHECKPOINT",
    "MODEL_CHECKPOINT",
    "CentralActor",
    "RunAbortedError",
    "default_max_concurrent",
    "resource_request",
    "slots_for",
]
