"""Drive one experiment on Ray: validate, connect, create the run directory and the central actor, show
progress.

ARCHITECTURE.md "The path of one evaluation", step 1. `run_experiment` is what
`qbatch run` calls and `resume_experiment` what `qbatch resume` calls. The config is validated, the
objective built and the search space checked *before* Ray starts or a run directory is made. A local Ray
starts with `ray.init(num_cpus=..., include_dashboard=False)`; `address` connects to a running cluster
instead. Run tests and local runs inside `scripts/loopback` so a local Ray binds to loopback only.

The central actor (orchestrator/actor.py) is created with `max_restarts`: if it dies it is restarted,
rebuilds its state from the event log and the driver simply calls `run` again. The evaluation tasks are
owned by a separate `EvaluationPool` actor (workers/pool.py) that the driver creates, so they keep running
through such a restart and their results wait for the new actor. If the driver itself dies,
`resume_experiment(run_dir)` replays the log and re-dispatches every trial that was proposed or started but
never finished; completed results are never repeated (ingestion is exactly-once by trial id).

The modules:

- `api`: `run_experiment` and `resume_experiment`, the entry points.
- `optimize`: `optimize(fn, space, budget=...)`, a plain Python callable run through them (`qbatch.optimize`).
- `preflight`: the checks before Ray starts (arguments, config, objective, space, the log against the space)
  and the one after (room on the cluster for one evaluation).
- `session`: `ray_session`, one run's use of Ray, and `OwnRay`, the Ray qbatch started, shared by the runs of
  the process; the worker setup hook where a module of the driver's folders shadows one of the library's
  packages.
- `address`: what an `--address` names (reachable, a GCS and not a web server, another Ray than this one).
- `signals`: SIGTERM interrupting a run as Ctrl-C does; interrupts held while the local Ray shuts down.
- `actors`: the central actor and the evaluation pool, their names, creating them, waiting for the central
  actor.
- `drive`: the loop that runs the central actor to the end, then the report and the final lines.
- `progress`: the progress bar's fields, the actor's notices above it, the starved-queue warning.

Tunables are set in the module that reads them: `progress.STARVED_WARN_S` and `progress.POOL_POLL_S`,
`drive.NOTICE_FLUSH_S`, `actors.ACTOR_RESTARTS`.
"""

from __future__ import annotations

from orchestrator.actor import RunAbortedError
from orchestrator.runner.actors import NAMESPACE, actor_name
from orchestrator.runner.actors import _actor_pid as _actor_pid

# names outside `__all__` that the tests and benchmarks import from here
from orchestrator.runner.actors import pool_name as pool_name
from orchestrator.runner.address import _connection_error_line as _connection_error_line
from orchestrator.runner.address import _other_ray as _other_ray
from orchestrator.runner.api import resume_experiment, run_experiment
from orchestrator.runner.drive import _report as _report
from orchestrator.runner.preflight import _check_log_matches_space as _check_log_matches_space
from orchestrator.runner.preflight import _check_objective as _check_objective
from orchestrator.runner.preflight import _check_run_args as _check_run_args
from orchestrator.runner.preflight import _with_absolute_paths as _with_absolute_paths
from orchestrator.runner.progress import _show as _show
from orchestrator.runner.progress import progress_fields as progress_fields
from orchestrator.runner.signals import _sigterm_interrupts as _sigterm_interrupts

__all__ = ["NAMESPACE", "RunAbortedError", "actor_name", "resume_experiment", "run_experiment"]
