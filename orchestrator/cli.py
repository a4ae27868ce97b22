"""The `qbatch` command line: run | resume | status | report | objectives.

`run` validates the config before anything else: a bad config prints ONE line naming the key and exits
with status 2, without starting Ray and without creating a run directory. Only `run` and `resume` import
Ray (through orchestrator.runner, imported inside the command); `status`, `report` and `objectives` read
the log and the registry only. The library's diagnostics are logged (`logging.getLogger(__name__)`); the
command line shows its warnings on stderr, each as the one line the library wrote.

Exit status:
    0    success
    1    the run stopped with an error (e.g. the failure-rate guard tripped, the runner failed), or a file of
         the run could not be read or written (one line naming it)
    2    bad usage, bad config, or no run at RUN_DIR: nothing was started and nothing was created
    130  interrupted (Ctrl-C, or SIGTERM during a run); `qbatch resume RUN_DIR` continues the run
"""

from __future__ import annotations

import argparse
import importlib
import logging
import math
import os
import sys
from collections.abc import Sequence
from typing import Any

from orchestrator.errors import ConfigError, QbatchError, UsageError

__all__ = ["EXIT_OK", "EXIT_RUN_FAILED", "EXIT_USAGE", "EXIT_INTERRUPTED", "main"]

EXIT_OK = 0
EXIT_RUN_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

_EPILOG = """exit status: 0 success; 1 the run stopped with an error; 2 bad usage, bad config or no run at
RUN_DIR (nothing started, nothing created); 130 interrupted (resume with `qbatch resume RUN_DIR`)."""


#: longest error line printed; a longer one keeps its head and tail (a bad value may be megabytes long)
MAX_ERROR_CHARS = 2_000


#: the packages whose logged warnings the command line shows on stderr, one line each, as the library
#: words them
_LOGGED_PACKAGES = ("orchestrator", "workers")


class _StderrHandler(logging.StreamHandler):
    """Writes each record's message alone (the library's lines start with "qbatch: ") to `sys.stderr` as it is
    when the line is written, so a redirect or a capture made after `main` started still gets it."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))
        self.setLevel(logging.WARNING)

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _show_library_warnings() -> None:
    """Give the library's loggers a stderr handler, once per process (`main` may run many times in one)."""
    for name in _LOGGED_PACKAGES:
        logger = logging.getLogger(name)
        if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
            logger.addHandler(_StderrHandler())


def _error(msg: str) -> None:
    from workers.records import cap

    text = cap(" ".join(str(msg).split()), MAX_ERROR_CHARS, head=MAX_ERROR_CHARS * 3 // 4, sep=" ")
    print(f"qbatch: error: {text}", file=sys.stderr)


# ---------------------------------------------------------------------------------------- commands
def _bundled_example(config: str) -> str | None:
    """The example config shipped inside the package for CONFIG `examples/NAME.yaml`, `NAME.yaml` or `NAME`
    when no such file exists here: an installed wheel carries the repository's `examples/` as
    `orchestrator/examples/`, so the README's commands work outside a checkout. None when
    CONFIG exists, names another folder, or no bundled example has that name."""
    if os.path.exists(config):
        return None
    parent, name = os.path.split(os.path.normpath(config))
    if parent not in ("", "examples"):
        return None
    stem = name[:-5] if name.endswith(".yaml") else name
    bundled = os.path.join(os.path.dirname(os.path.abspath(__file__)), "examples", f"{stem}.yaml")
    return bundled if stem and os.path.isfile(bundled) else None


def _cmd_run(args: argparse.Namespace) -> int:
    from orchestrator.config import load_config
    from orchestrator.store import RunStore, StoreError

    bundled = _bundled_example(args.config)
    if bundled is not None:
        print(f"qbatch: no file {args.config} here; running the example shipped with qbatch, {bundled}",
              file=sys.stderr)
        args.config = bundled
    config = load_config(args.config)
    run_dir = config.resolve_run_dir(args.run_dir)
    try:
        taken = RunStore.exists(run_dir)
    except StoreError as exc:
        raise UsageError(str(exc)) from None
    if taken:
        if RunStore.is_being_written(run_dir):  # a resume would be refused until that run ends
            raise UsageError(f"{run_dir} already holds a run, which a process is writing now (`qbatch status "
                             f"{run_dir}`); choose another --run-dir")
        raise UsageError(
            f"{run_dir} already holds a run; continue it with `qbatch resume {run_dir}` or choose "
            "another --run-dir"
        )
    runner = _runner()
    try:
        runner.run_experiment(args.config, address=args.address, run_dir=run_dir)  # errors name the file
    except KeyboardInterrupt:
        try:
            created = RunStore.exists(run_dir)
        except StoreError:
            created = True  # cannot tell: the hint is harmless where there is no run (resume says so)
        if created:
            _error(f"interrupted; continue with `qbatch resume {run_dir}`")
        else:  # while Ray was starting: a resume hint would point at nothing
            _error(f"interrupted before the run was created at {run_dir}; nothing was written")
        return EXIT_INTERRUPTED
    return EXIT_OK  # the runner printed the best point and where the results are


def _cmd_resume(args: argparse.Namespace) -> int:
    # the runner opens the run (reading its log once) and checks it is not being written before Ray starts;
    # what it refuses there is a UsageError: exit 2, nothing started
    runner = _runner()
    try:
        runner.resume_experiment(args.run_dir, address=args.address)
    except KeyboardInterrupt:
        _error(f"interrupted; continue with `qbatch resume {args.run_dir}`")
        return EXIT_INTERRUPTED
    return EXIT_OK


def _runner() -> Any:
    try:
        # import_module returns the sys.modules entry (`import a.b as c` would read the package attribute)
        runner = importlib.import_module("orchestrator.runner")
    except ImportError as exc:
        raise QbatchError(f"cannot import orchestrator.runner (Ray and the run driver): {exc}") from None
    return runner


def _f(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _open_run(run_dir: str) -> Any:
    """The `RunStore` at `run_dir` for `status` and `report`. What is wrong with its config.yaml for this
    version is a warning, worded as `resume` words it, and the run is shown as recorded: a hand-edited
    config.yaml (`budget: six`) would otherwise end them in a traceback, and refusing it would hide runs that
    an older version wrote."""
    from orchestrator.config import load_config
    from orchestrator.store import RunStore, StoreError

    try:
        store = RunStore.open(run_dir)
    except StoreError as exc:
        raise UsageError(str(exc)) from None
    if "objective" not in store.config and not store.has_segments():
        # every config qbatch writes names its objective: a folder of another program that happens to hold a
        # config.yaml and an events/ folder is not shown as an empty run
        raise UsageError(f"{store.run_dir} is not a qbatch run: its config.yaml names no `objective` and its "
                         "events/ folder holds no qbatch log segment")
    try:
        load_config(store.config)
    except ConfigError as exc:
        print(
            f"qbatch: warning: {os.path.join(store.run_dir, 'config.yaml')}: {exc} (shown as recorded; "
            "`resume` would refuse it)",
            file=sys.stderr,
        )
    return store


def _cmd_status(args: argparse.Namespace) -> int:
    from orchestrator.report import compute_metrics
    from orchestrator.store import RunStore

    store = _open_run(args.run_dir)
    m = compute_metrics(store.events(), store.config, damage=store.damage, with_calibration=False,
                        writing=RunStore.is_being_written(store.run_dir))
    c = m.counts
    done = c["completed"] + c["failed"]
    unfinished = ""
    if c["unfinished"]:
        why = (
            "the budget is reached"
            if m.budget and done >= m.budget
            else f"`qbatch resume {store.run_dir}` runs them"
        )
        unfinished = f", unfinished {c['unfinished']} (no process is writing this run; {why})"
    width = 30
    filled = int(round(width * (m.progress if math.isfinite(m.progress) else 0.0)))
    # a budget lowered below the results (in config.yaml, for a resume) reads as reached, not as "42/30"
    count = (
        f"{done} done, budget {m.budget} reached" if m.budget and done > m.budget else f"{done}/{m.budget}"
    )
    print(f"run {m.name} ({m.objective}, {m.direction}, tau={_f(m.tau)}) at {store.run_dir}")
    print(
        f"progress     [{'#' * filled}{'.' * (width - filled)}] {count} ({100 * m.progress:.1f}%)  "
        f"completed {c['completed']}, failed {c['failed']}, running {c['running']}, queued "
        f"{c['proposed']}{unfinished}"
    )
    src = m.sources
    proposer = store.config.get("proposer")
    proposer = proposer.get("type", "thompson") if isinstance(proposer, dict) else (proposer or "thompson")
    model_free = proposer in ("sobol", "random")  # proposers without a model: their points count as "model"
    note = ("; the model proposed none of them (a random search)"
            if m.budget and done >= m.budget and not src.get("model") and not model_free else "")
    repeats = f", repeat {src['repeat']}" if src.get("repeat") else ""
    print(
        f"sources      sobol {src.get('sobol', 0)}, model {src.get('model', 0)}{repeats} (finished trials by "
        f"where their point came from){note}"
    )
    if m.best_params is not None:
        print(f"best so far  {_f(m.best_value)} (observed, trial {m.best_trial_id}) at {m.best_params}")
    else:
        print("best so far  - (no completed evaluation yet)")
    if m.best_predicted_params is not None:
        print(
            f"recommendation {_f(m.best_predicted)} (predicted tau-level at the last fit) at "
            f"{m.best_predicted_params}"
        )
    print(
        f"utilization  U={_f(m.utilization)} over {_f(m.span_s)} s with {m.slots} slots ({m.slots_source}); "
        f"{_f(m.evals_per_s)} evaluations/s"
    )
    print(
        f"model        proposal latency p50 {_f(m.proposal_latency_p50)} s, p95 {_f(m.proposal_latency_p95)} "
        f"s; {m.n_refits} refits (mean {_f(m.refit_mean_s)} s); queue depth max {m.queue_depth_max}"
    )
    if m.n_refit_failures:
        print(
            f"refits       {m.n_refit_failures} failed (the run went on with the model before); last: "
            f"{m.last_refit_error}"
        )
    failures = ", ".join(f"{k}: {v}" for k, v in sorted(m.failures.items())) or "none"
    print(f"failures     {failures}")
    for line in m.damage:
        print(f"log damage   {line}")
    return EXIT_OK


def _cmd_report(args: argparse.Namespace) -> int:
    from orchestrator.report import format_summary, write_report

    if args.out is not None and not args.out.strip():  # "" would be "the report folder: No such file"
        raise UsageError(f"`--out` must name a folder; got {args.out!r}")
    store = _open_run(args.run_dir)
    # the plots the report leaves out, each with its reason (logged at INFO by orchestrator/report/), are
    # printed after the files it wrote
    notes: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: notes.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("orchestrator.report")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        metrics, paths = write_report(args.run_dir, out_dir=args.out, store=store)
    except OSError as exc:  # --out (or the default report folder) cannot be written
        where = f"`--out` {args.out}" if args.out is not None else "the report folder"
        raise UsageError(f"{where}: {exc.strerror or exc} ({exc.filename})") from None
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    print(format_summary(metrics))
    print()
    for path in paths.values():
        print(f"wrote {path}")
    for line in notes:
        print(line)
    return EXIT_OK


def _cmd_objectives(args: argparse.Namespace) -> int:
    from objectives.registry import available_objectives

    table = available_objectives()
    width = max(len(n) for n in table)
    for name, desc in table.items():
        print(f"{name.ljust(width)}  {desc}")
    print("\nor a user objective as 'package.module:name' (an Objective subclass, factory or instance)")
    return EXIT_OK


# ---------------------------------------------------------------------------------------- parser
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="qbatch",
        description="Distributed large-batch quantile Bayesian optimization on Ray.",
        epilog=_EPILOG,
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    r = sub.add_parser("run", help="validate CONFIG and run the experiment on Ray", epilog=_EPILOG)
    r.add_argument(
        "config",
        metavar="CONFIG",
        help=(
            "experiment YAML, or the name of an example shipped with qbatch "
            "(examples/NAME.yaml, e.g. quickstart)"
        ),
    )
    r.add_argument("--address", default=None, help="Ray address of a cluster (default: start a local Ray)")
    r.add_argument(
        "--run-dir", default=None, help="run directory (default: config's run_dir or runs/<name>-<time>)"
    )
    r.set_defaults(func=_cmd_run)

    s = sub.add_parser("resume", help="continue an interrupted run from its log", epilog=_EPILOG)
    s.add_argument("run_dir", metavar="RUN_DIR")
    s.add_argument("--address", default=None, help="Ray address of a cluster (default: start a local Ray)")
    s.set_defaults(func=_cmd_resume)

    st = sub.add_parser(
        "status", help="progress, best so far, utilization and failures of a run", epilog=_EPILOG
    )
    st.add_argument("run_dir", metavar="RUN_DIR")
    st.set_defaults(func=_cmd_status)

    rp = sub.add_parser("report", help="write PNG plots and a summary table of a run", epilog=_EPILOG)
    rp.add_argument("run_dir", metavar="RUN_DIR")
    rp.add_argument(
        "--out",
        default=None,
        help="output folder (default: RUN_DIR/report; ./report-NAME for a run directory given as a URI)",
    )
    rp.set_defaults(func=_cmd_report)

    o = sub.add_parser("objectives", help="list the built-in objectives", epilog=_EPILOG)
    o.set_defaults(func=_cmd_objectives)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `qbatch` console script; returns the exit status (see the module docstring)."""
    _show_library_warnings()
    args = _parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, UsageError) as exc:
        _error(str(exc))
        return EXIT_USAGE
    except QbatchError as exc:
        _error(str(exc))
        return EXIT_RUN_FAILED
    except BrokenPipeError:  # `qbatch status RUN | head`: the reader left; end quietly, as other tools do
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        except OSError:
            pass
        return EXIT_RUN_FAILED
    except OSError as exc:
        if exc.filename is None:  # not a file's error (a connection, a remote task's): as it was
            raise
        # a file of the run that cannot be read or written: one line naming it, not a traceback
        _error(f"{exc.filename}: {exc.strerror or exc}")
        return EXIT_RUN_FAILED
    except KeyboardInterrupt:
        _error("interrupted")
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
