"""`inspect_objective`: the driver and the central actor build the objective only to read its space and
resources; a constructor's `torch.set_num_threads` (meant for its evaluations) must not change their threads:
in the central actor it set the threads of every model fit (found in review)."""

from __future__ import annotations

import textwrap

import pytest
import torch

from objectives.registry import inspect_objective, load_objective

MODULE = textwrap.dedent(
    """
    import torch

    from objectives.base import Objective


    class ThreeThreads(Objective):
        space = {"x": {"type": "float", "low": 0.0, "high": 1.0}}

        def __init__(self):
            torch.set_num_threads(3)

        def evaluate(self, params, seed):
            return float(params["x"])
    """
)


@pytest.fixture
def threads_restored():
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def test_inspecting_an_objective_keeps_torch_threads(tmp_path, monkeypatch, threads_restored):
    (tmp_path / "qbatch_threads_objective.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    torch.set_num_threads(1)
    obj = inspect_objective("qbatch_threads_objective:ThreeThreads")
    assert type(obj).__name__ == "ThreeThreads" and torch.get_num_threads() == 1
    from orchestrator.config import load_config
    from orchestrator.runner import _check_objective

    _check_objective(load_config({"objective": "qbatch_threads_objective:ThreeThreads", "budget": 10}))
    assert torch.get_num_threads() == 1
    load_objective("qbatch_threads_objective:ThreeThreads")  # where it is evaluated, the setting stands
    assert torch.get_num_threads() == 3
