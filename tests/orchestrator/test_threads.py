"""Bounded torch threads (orchestrator/threads.py): the check of `threads` in the config and the optimizer,
the scope `fit` and `ask` run in, the caller's setting restored afterwards, nested and in two threads at
once."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from orchestrator.ask_tell import AskTellOptimizer
from orchestrator.config import load_config
from orchestrator.errors import ConfigError
from orchestrator.threads import MAX_THREADS, bounded_threads, check_threads, default_threads, resolve_threads

SPACE = {"x": {"type": "float", "low": 0.0, "high": 1.0}, "y": {"type": "float", "low": 0.0, "high": 1.0}}


@pytest.fixture
def two_threads():
    """torch at 2 intra-op threads for the test (the module's conftest sets 1), as a fresh 2-core process
    has."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield 2
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    "value, expected", [("auto", "auto"), (1, 1), (np.int64(4), 4), (MAX_THREADS, MAX_THREADS)]
)
def test_threads_takes_auto_or_an_integer(value, expected):
    got = check_threads("`threads`", value)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize("value", [0, -1, MAX_THREADS + 1, 1.5, 2.0, True, "four", "Auto", None, [2]])
def test_a_bad_threads_value_names_the_key_and_what_it_takes(value):
    with pytest.raises(ConfigError, match=r"^`threads` must be 'auto' or an integer in \[1, 1024\]; got "):
        check_threads("`threads`", value)
    with pytest.raises(ConfigError, match=r"`threads` must be 'auto' or an integer in \[1, 1024\]; got "):
        load_config({"objective": "forrester", "threads": value})
    with pytest.raises(ConfigError, match=r"^`threads` must be 'auto' or an integer"):
        AskTellOptimizer(SPACE, threads=value)


def test_the_config_key_defaults_to_auto_and_round_trips():
    cfg = load_config({"objective": "forrester"})
    assert cfg.threads == "auto" and "threads" not in cfg.to_dict()  # config.yaml keeps its key set
    cfg = load_config({"objective": "forrester", "threads": 3})
    assert cfg.threads == 3 and cfg.to_dict()["threads"] == 3 and load_config(cfg.to_dict()) == cfg


def test_the_central_actors_optimizer_takes_the_config_key():
    from objectives.registry import inspect_objective

    cfg = load_config({"objective": "forrester", "threads": 3})
    opt = AskTellOptimizer.from_config(cfg, inspect_objective("forrester", {}))
    assert opt.threads == 3
    assert (
        AskTellOptimizer.from_config(
            load_config({"objective": "forrester"}), inspect_objective("forrester", {})
        ).threads
        == "auto"
    )


def test_auto_bounds_and_never_raises_the_callers_setting():
    assert default_threads() >= 1
    assert resolve_threads("auto", 64) == default_threads()
    assert resolve_threads("auto", 1) == 1  # a caller that chose one thread keeps it
    assert resolve_threads(8, 1) == 8  # an integer is used as given


def test_a_bounded_block_restores_the_callers_setting(two_threads):
    with bounded_threads() as n:
        assert n == torch.get_num_threads() == min(default_threads(), 2)
        with bounded_threads(3) as m:  # nested: an `ask` that fits
            assert m == torch.get_num_threads() == 3
        assert torch.get_num_threads() == n
    assert torch.get_num_threads() == 2
    with pytest.raises(RuntimeError), bounded_threads(1):
        raise RuntimeError("a failed fit")
    assert torch.get_num_threads() == 2


def test_numpys_blas_is_bounded_too_and_restored(two_threads):
    threadpoolctl = pytest.importorskip("threadpoolctl")

    def blas():
        return {
            i["filepath"]: i["num_threads"]
            for i in threadpoolctl.threadpool_info()
            if i["user_api"] == "blas"
        }

    before = blas()
    if not before:
        pytest.skip("no BLAS library that threadpoolctl sees")
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        with bounded_threads(1):
            assert set(blas().values()) == {1}
        assert set(blas().values()) == {2}
    assert blas() == before


def test_concurrent_blocks_restore_each_threads_own_setting(two_threads):
    """Two threads in bounded calls at once, the other one leaving first: each keeps the bound until its own
    call ends, and each gets its own setting back."""
    entered, leave, left = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def other():
        torch.ones(64, 64).sum()  # this thread's OpenMP count is fixed by its first parallel region
        with bounded_threads(1):
            seen["other_inside"] = torch.get_num_threads()
            entered.set()
            leave.wait(10)
        seen["other_after"] = torch.get_num_threads()
        left.set()

    t = threading.Thread(target=other)
    t.start()
    assert entered.wait(10)
    with bounded_threads(1):
        leave.set()
        assert left.wait(10)
        seen["main_inside"] = torch.get_num_threads()  # after the other thread left
    seen["main_after"] = torch.get_num_threads()
    t.join(10)
    assert seen == {"other_inside": 1, "other_after": 2, "main_inside": 1, "main_after": 2}


def test_fit_and_ask_run_bounded_and_restore(two_threads, monkeypatch):
    opt = AskTellOptimizer(SPACE, initial_design=4, threads=1, model_options={"max_steps": 30})
    for t in opt.ask(4):
        opt.tell(t.trial_id, t.params["x"] - t.params["y"])
    seen = []
    fit = opt._fit

    def spy(restart):
        seen.append(("fit", torch.get_num_threads()))
        return fit(restart)

    monkeypatch.setattr(opt, "_fit", spy)
    ask = opt._ask
    monkeypatch.setattr(
        opt, "_ask", lambda *a, **k: seen.append(("ask", torch.get_num_threads())) or ask(*a, **k)
    )
    trials = opt.ask(2)  # fits first, then proposes
    assert trials[0].source == "model" and seen == [("ask", 1), ("fit", 1)]
    assert torch.get_num_threads() == 2
    opt.fit()
    assert seen[-1] == ("fit", 1) and torch.get_num_threads() == 2


def test_an_old_pickle_gets_the_default_threads():
    import pickle

    opt = AskTellOptimizer(SPACE, threads=2)
    state = opt.__getstate__()
    del state["threads"]
    clone = AskTellOptimizer.__new__(AskTellOptimizer)
    clone.__setstate__(state)
    assert clone.threads == "auto" and pickle.loads(pickle.dumps(opt)).threads == 2
