"""`inspect_objective`: the driver and the central actor build the objective only to read its space and
resources; a constructor's `torch.set_num_threads` (meant for its evaluations) must not change their threads:
in the central actor it would set the threads of every model fit."""

from __future__ import annotations

import re
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


BAD_DECLARATIONS = textwrap.dedent(
    """
    from objectives.base import Objective


    class _Base(Objective):
        space = {"x": {"type": "float", "low": 0.0, "high": 1.0}}

        def evaluate(self, params, seed):
            return float(params["x"])


    class ListSpace(_Base):
        space = [("x", {"type": "float", "low": 0.0, "high": 1.0})]


    class ListSpec(_Base):
        space = {"x": [0.0, 1.0]}


    class RaisingSpace(_Base):
        @property
        def space(self):
            raise RuntimeError("no space today")


    class DictResources(_Base):
        resources = {"num_cpus": 1}


    class Shouting(_Base):
        direction = "MAXIMIZE"
    """
)


@pytest.mark.parametrize("attr, message", [
    ("ListSpace", "its `space` must be a mapping of parameter name to spec; got a list"),
    ("ListSpec", "the spec of parameter 'x' in its `space` must be a mapping"),
    ("RaisingSpace", "reading its space, resources or direction raised RuntimeError: no space today"),
    ("Shouting", "its `direction` must be 'maximize' or 'minimize'; got 'MAXIMIZE'"),
    ("DictResources", "its `resources` must be an objectives.base.Resources, e.g. Resources(num_cpus=1); got "
                      "a dict"),
])
def test_a_user_objective_that_declares_a_bad_space_or_resources_is_one_line_before_ray(
        attr, message, tmp_path, monkeypatch):
    """A list `space` (not an AttributeError traceback from the config) and a dict of `resources` (not a
    traceback after Ray has started) are the objective's error, and `qbatch run` reports it as the config's
    (before Ray)."""
    from objectives.base import ObjectiveError
    from orchestrator.config import load_config
    from orchestrator.errors import ConfigError
    from orchestrator.runner import _check_objective

    (tmp_path / "qbatch_bad_declarations.py").write_text(BAD_DECLARATIONS)
    monkeypatch.syspath_prepend(str(tmp_path))
    name = f"qbatch_bad_declarations:{attr}"
    with pytest.raises(ObjectiveError, match=re.escape(f"objective {name!r}: {message}")):
        load_objective(name)
    with pytest.raises(ConfigError, match=re.escape(message)):
        _check_objective(load_config({"objective": name, "budget": 10}))
