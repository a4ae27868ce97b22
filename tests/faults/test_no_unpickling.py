"""Nothing in a run directory is unpickled. A finished real run's directory gets malicious
pickles planted in every place qbatch reads (checkpoints, the event log's segments - as raw pickle bytes and
as a Parquet column whose Arrow extension metadata is a pickle, the pyarrow CVE-2023-47248 vector - and
odd files beside them), then `qbatch status`, `qbatch report`, `resume_experiment` and
`RunStore.load_checkpoint` run on it. Each payload would create a marker folder when unpickled; none may
appear, and the run's records stay exactly the budget. A config.yaml with a Python YAML tag is refused.
"""

from __future__ import annotations

import io
import os
import pickle
import shutil

import pytest

from orchestrator import cli
from orchestrator.store import RunStore, StoreError
from tests.faults.conftest import audit

pytestmark = pytest.mark.ray

BUDGET = 6


class _Evil:
    """Unpickling this calls os.mkdir(path): the marker of code run from a pickle."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def _torch_payload(marker: str) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save({"w": torch.zeros(2), "evil": _Evil(marker)}, buf)
    return buf.getvalue()


def _extension_segment(marker: str, path: str) -> None:
    """A Parquet segment whose extra column is an `arrow.py_extension_type` carrying a pickle."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    class PyExt(pa.ExtensionType):
        def __init__(self) -> None:
            super().__init__(pa.int64(), "arrow.py_extension_type")

        def __arrow_ext_serialize__(self) -> bytes:
            return pickle.dumps(_Evil(marker))

        @classmethod
        def __arrow_ext_deserialize__(cls, storage_type, serialized):  # pragma: no cover - never registered
            return cls()

    table = pa.table({
        "seq": pa.array([800_000], pa.int64()), "kind": ["refit"], "trial_id": [""], "time": [1.0],
        "attempt": pa.array([0], pa.int64()), "evil": pa.ExtensionArray.from_storage(PyExt(), pa.array([1])),
    })
    pq.write_table(table, path)


@pytest.fixture(scope="module")
def finished_run(ray_local, tmp_path_factory):
    from orchestrator.runner import run_experiment

    run_dir = str(tmp_path_factory.mktemp("pickles") / "finished")
    cfg = {"name": "pickles", "objective": {"name": "sleep", "options": {"mean_s": 0.05, "num_cpus": 0.5}},
           "proposer": "sobol", "budget": BUDGET, "batch_size": BUDGET, "initial_design": BUDGET,
           "max_concurrent": 3, "run_dir": run_dir}
    run_experiment(cfg, progress=False, out=io.StringIO())
    return run_dir


def test_the_payloads_run_code_when_unpickled(tmp_path):
    """Control: the planted payloads are live (so the test below can fail)."""
    import torch

    marker = tmp_path / "control"
    pickle.loads(pickle.dumps(_Evil(str(marker))))
    assert marker.is_dir()
    marker.rmdir()
    torch.load(io.BytesIO(_torch_payload(str(marker))), weights_only=False)
    assert marker.is_dir()


def test_planted_pickles_are_never_executed(finished_run, tmp_path, capsys):
    from orchestrator.runner import resume_experiment

    run_dir = str(tmp_path / "planted")
    shutil.copytree(finished_run, run_dir)
    marker = str(tmp_path / "PWNED")
    raw = pickle.dumps(_Evil(marker))
    torch_bytes = _torch_payload(marker)
    planted = {
        # checkpoints: what a model/actor/optimizer state would be loaded from
        "checkpoints/actor.pt": torch_bytes, "checkpoints/model.pt": torch_bytes,
        "checkpoints/optimizer.pt": raw, "checkpoints/calibrator.pt": raw, "checkpoints/state.pkl": raw,
        # the event log: a "segment" that is a pickle, and an unrelated pickle beside the segments
        "events/seg-000000900000-000000900009.parquet": raw, "events/seg-000000900010-000000900010.pkl": raw,
        # odd files a loader might glob for
        "state.pkl": raw, "optimizer.pt": torch_bytes, "report/summary.pkl": raw,
    }
    for rel, data in planted.items():
        os.makedirs(os.path.dirname(os.path.join(run_dir, rel)), exist_ok=True)
        with open(os.path.join(run_dir, rel), "wb") as fh:
            fh.write(data)
    _extension_segment(marker, os.path.join(run_dir, "events", "seg-000000800000-000000800000.parquet"))

    assert cli.main(["status", run_dir]) == 0
    status = capsys.readouterr().out
    assert not os.path.exists(marker), "qbatch status executed a planted pickle"
    # reported, not hidden
    assert "log damage" in status and "seg-000000900000-000000900009.parquet" in status

    assert cli.main(["report", run_dir, "--out", str(tmp_path / "report")]) == 0
    capsys.readouterr()
    assert not os.path.exists(marker), "qbatch report executed a planted pickle"

    out = io.StringIO()
    summary = resume_experiment(run_dir, progress=False, out=out)
    assert not os.path.exists(marker), "resume executed a planted pickle"
    assert summary["status"] == "finished" and summary["done"] == BUDGET
    assert "damaged log" in out.getvalue()

    store = RunStore.open(run_dir)
    for name in ("actor", "model", "optimizer", "calibrator"):
        with pytest.raises(StoreError, match="cannot be loaded safely"):
            store.load_checkpoint(name)
    assert not os.path.exists(marker), "load_checkpoint executed a planted pickle"

    a = audit(run_dir, BUDGET)
    assert a["lost"] == 0 and a["duplicated"] == 0, "the planted files changed no result"


def test_config_with_a_python_yaml_tag_is_refused_without_running_it(finished_run, tmp_path, capsys):
    run_dir = tmp_path / "tagged"
    shutil.copytree(finished_run, run_dir)
    marker = tmp_path / "PWNED-YAML"
    text = (run_dir / "config.yaml").read_text()
    (run_dir / "config.yaml").write_text(text + f"evil: !!python/object/apply:os.mkdir [{str(marker)!r}]\n")
    for argv in (["status", str(run_dir)], ["report", str(run_dir)], ["resume", str(run_dir)]):
        rc = cli.main(argv)
        err = capsys.readouterr().err
        assert rc != 0 and len(err.strip().splitlines()) == 1 and "config.yaml" in err, (argv, rc, err)
        assert not marker.exists(), f"qbatch {argv[0]} executed a YAML tag"
