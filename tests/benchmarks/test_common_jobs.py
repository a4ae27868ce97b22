"""The benchmarks' shared job runner (`benchmarks._common.Job`, `run_jobs`, `drive_guarded`): which runs it
starts, continues or skips, what it writes, and how a failing run is kept from losing the others. GLD, lander
and laser all run their grids through it."""

from __future__ import annotations

from pathlib import Path

import botorch
import gpytorch
import numpy
import scipy
import torch

from benchmarks._common import (
    BatchRun,
    Job,
    checkpoint_path,
    drive_guarded,
    read_table,
    run_jobs,
    write_table,
)

CALLS: list[tuple] = []


def fake_run(name: str, status: str, checkpoint: Path | None = None, deadline: float | None = None):
    """A run that records its call and whether it found a checkpoint to continue."""
    CALLS.append((name, checkpoint is not None and checkpoint.exists(), deadline))
    rows = [{"name": name, "value": 1.0, "error": ""}] if status == "done" else []
    return status, rows


def _jobs(runs: Path, statuses: dict[str, str], rules: dict | None = None) -> list[Job]:
    rules = rules or {}
    return [Job(runs / n, fake_run, (n, st), finished_rule=rules.get(n)) for n, st in statuses.items()]


def test_run_jobs_writes_done_runs_and_starts_over_without_resume(tmp_path, capsys):
    CALLS.clear()
    checkpoint_path(tmp_path / "a").write_bytes(b"stale")
    checkpoint_path(tmp_path / "b").write_bytes(b"stale")
    counts = run_jobs(_jobs(tmp_path, {"a": "done", "b": "paused"}), 1, resume=False, deadline=12.5, tag="t")
    assert counts == {"done": 1, "paused": 1, "skipped": 0, "finished before": 0}
    assert CALLS == [("a", False, 12.5), ("b", False, 12.5)]  # no old checkpoint was continued
    assert read_table(tmp_path / "a.csv")[0]["name"] == "a" and not (tmp_path / "b.csv").exists()
    assert not checkpoint_path(tmp_path / "a").exists()  # a finished run's checkpoint is removed
    assert "[t] 2 runs to do (0 finished before)" in capsys.readouterr().out


def test_resume_skips_finished_runs_and_continues_checkpoints(tmp_path):
    CALLS.clear()
    write_table([{"name": "a", "value": 1.0, "error": ""}], tmp_path / "a", parquet=False)  # finished
    write_table([{"name": "b", "value": 0.0, "error": "RuntimeError: x"}], tmp_path / "b", parquet=False)
    checkpoint_path(tmp_path / "c").write_bytes(b"half")
    counts = run_jobs(_jobs(tmp_path, {"a": "done", "b": "done", "c": "done"}), 1, resume=True, deadline=None,
                      tag="t")
    assert counts == {"done": 2, "paused": 0, "skipped": 0, "finished before": 1}
    assert CALLS == [("b", False, None), ("c", True, None)]  # a failed run is run again; c continues
    assert read_table(tmp_path / "b.csv")[0]["error"] == ""


def test_a_finished_rule_replaces_the_result_file_check(tmp_path):
    """GLD counts a method finished from any result file of its problem (`done_methods`): the rule decides, a
    missing result file of the job's own name does not."""
    CALLS.clear()
    write_table([{"name": "b", "value": 1.0, "error": ""}], tmp_path / "b", parquet=False)
    rules = {"a": lambda: True, "b": lambda: False}
    counts = run_jobs(
        _jobs(tmp_path, {"a": "done", "b": "skipped"}, rules), 1, resume=True, deadline=0.0, tag="t"
    )
    assert counts == {"done": 0, "paused": 0, "skipped": 1, "finished before": 1}
    assert [c[0] for c in CALLS] == ["b"]
    assert read_table(tmp_path / "b.csv")[0]["value"] == "1.0"  # a skipped run leaves the old file alone


class CountingRun(BatchRun):
    """Three steps of one evaluation each; raises at step `fail_at` (None: never)."""

    key = "counting"

    def __init__(self, fail_at: int | None = None):
        self.n, self.times, self.fail_at = 0, {}, fail_at

    def start(self) -> None:
        self.step()

    def step(self) -> None:
        if self.n == self.fail_at:
            raise ValueError(f"boom at {self.n}")
        self.n += 1

    @property
    def done(self) -> bool:
        return self.n >= 3


def test_drive_guarded_turns_an_exception_into_an_error_and_reports_a_pause(tmp_path, capsys):
    status, run, error = drive_guarded(lambda: CountingRun(fail_at=1), None, None, None, 1, "[t] r0")
    assert (status, run, error) == ("done", None, "ValueError: boom at 1")
    status, run, error = drive_guarded(lambda: CountingRun(), None, None, 2, 1, "[t] r1")
    assert (status, run.n, error) == ("paused", 2, "")
    assert "[t] r1: paused at 2 evaluations" in capsys.readouterr().out
    status, run, error = drive_guarded(lambda: CountingRun(), None, None, None, 1, "[t] r2")
    assert (status, run.n, error) == ("done", 3, "")


def test_option_flags_refuse_unknown_names_in_every_benchmark(load_benchmark):
    """`--model-options '{"quantil": {...}}'` is refused, not ignored without a word (lander, laser, gld,
    hpo); gld's `--quick` keeps the user's options, and hpo refuses `[1]` rather than take it until every job
    fails."""
    import pytest

    from benchmarks._common import merge_options

    assert merge_options({"quantile": {"a": 1}}, {"quantile": {"b": 2}}, "--model-options", ["quantile"]) == {
        "quantile": {"a": 1, "b": 2}}
    for name in ("gld", "hpo", "lander", "laser"):
        mod = load_benchmark(name)
        with pytest.raises(SystemExit, match=r"--model-options: unknown name\(s\) \['quantil'\]"):
            mod.parse_args(["--quick", "--model-options", '{"quantil": {"num_inducing": 8}}'])
        with pytest.raises(SystemExit, match="--model-options: a JSON object"):
            mod.parse_args(["--model-options", "[1]"])
    gld = load_benchmark("gld")
    args = gld.parse_args(["--quick", "--model-options", '{"quantile": {"num_inducing": 8}}'])
    assert args.model_options["quantile"] == {**gld.QUICK["model_options"]["quantile"], "num_inducing": 8}
    hpo = load_benchmark("hpo")
    with pytest.raises(SystemExit, match=r"--proposer-options: unknown name\(s\) \['qlogne'\]"):
        hpo.parse_args(["--proposer-options", '{"qlogne": {}}'])


def test_a_bad_option_stops_every_benchmark_before_any_run(load_benchmark, tmp_path):
    """Noted in the ninth session: a bad model or proposer option failed every run of the grid on its own,
    each recorded as an error row, and the command exited 0. `preflight` builds each method once before the
    grid: one error naming the method and the key, and no run file."""
    import pytest

    for name in ("gld", "hpo", "lander", "laser"):
        mod = load_benchmark(name)
        out = tmp_path / name
        with pytest.raises(SystemExit, match=rf"\[{name}\] .*num_inducng"):
            mod.main(["--quick", "--out", str(out), "--model-options", '{"quantile": {"num_inducng": 8}}'])
        assert not list((out / "runs").glob("*.csv")), name
    lander = load_benchmark("lander")
    with pytest.raises(SystemExit, match=r"\[lander\] quantile-ts tau 0.1: .*option 'steps_limit'"):
        lander.main(["--quick", "--out", str(tmp_path / "l2"), "--objective-options", '{"steps_limit": '
                                                                                      '"long"}'])
    laser = load_benchmark("laser")
    with pytest.raises(SystemExit, match=r"\[laser\] quantile-ts: .*raw_samples"):
        laser.main(["--quick", "--out", str(tmp_path / "l3"), "--proposer-options",
                    '{"thompson": {"raw_samples": -1}}'])


def test_result_rows_record_the_code_version(tmp_path):
    """Every result file `run_jobs` writes records the code it came from (commit, dirty flag, library
    versions), and `code_mix_note` names the versions a table mixes (rows without the column count as
    unrecorded)."""
    from benchmarks._common import code_mix_note, code_version

    CALLS.clear()
    run_jobs(_jobs(tmp_path, {"a": "done"}), 1, resume=False, deadline=None, tag="t")
    version = code_version()
    assert read_table(tmp_path / "a.csv")[0]["code"] == version
    assert version.split()[1:] == ["torch", torch.__version__, "gpytorch", gpytorch.__version__,
                                   "botorch", botorch.__version__, "numpy", numpy.__version__,
                                   "scipy", scipy.__version__]
    assert code_mix_note([{"code": version}, {"code": version}]) == ""
    note = code_mix_note([{"code": version}, {"code": "abc"}, {}])
    assert "3 code versions" in note and "unrecorded: 1 rows" in note


class SavedCountingRun(CountingRun):
    """A CountingRun that can be checkpointed (its state is its count)."""

    def get_state(self) -> dict:
        return {"n": self.n, "times": dict(self.times)}

    def set_state(self, state: dict) -> None:
        self.n, self.times = int(state["n"]), dict(state["times"])


def counting_job(
    checkpoint: Path | None = None, deadline: float | None = None, stop_after: int | None = None
):
    """A checkpointed SavedCountingRun as a job: its rows name the evaluations made."""
    status, run, _ = drive_guarded(lambda: SavedCountingRun(), checkpoint, deadline, stop_after, 1, "[t] c")
    return status, ([{"n": run.n, "error": ""}] if status == "done" else [])


def test_a_resumed_run_names_the_code_of_every_session_that_advanced_it(tmp_path):
    """A run continued from a checkpoint is labelled with the code of each session that advanced it (the
    checkpoint keeps them), not the resuming code only; a checkpoint without that record counts as
    unrecorded."""
    import torch as _torch

    from benchmarks._common import code_version

    job = Job(tmp_path / "c", counting_job, ())
    assert counting_job(job.checkpoint, stop_after=1)[0] == "paused"
    state = _torch.load(job.checkpoint, weights_only=True)
    assert state["codes"] == [code_version()]
    del state["codes"]  # as written before this change
    _torch.save(state, job.checkpoint)
    run_jobs([job], 1, resume=True, deadline=None, tag="t")
    row = read_table(tmp_path / "c.csv")[0]
    assert row["n"] == "3" and row["code"] == f"unrecorded then {code_version()}"
    run_jobs([Job(tmp_path / "d", counting_job, ())], 1, resume=False, deadline=None, tag="t")
    assert read_table(tmp_path / "d.csv")[0]["code"] == code_version()
