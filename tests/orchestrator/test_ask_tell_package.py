"""The layout of the `orchestrator.ask_tell` package: the names code imports from it resolve there, its parts
define disjoint members (so the order of `AskTellOptimizer`'s bases changes nothing), duplicates are judged
under the proposers' one tolerance, and the API page lists every documented public member, the parts' ones
too."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import orchestrator.ask_tell as ask_tell
from orchestrator.ask_tell import AskTellOptimizer

REPO = Path(__file__).resolve().parents[2]


def test_the_names_imported_from_the_package_resolve():
    from orchestrator.ask_tell.optimizer import AskTellOptimizer as facade
    from orchestrator.ask_tell.trials import Trial, TrialError, trial_seed

    assert {"AskTellOptimizer", "Trial", "TrialError", "trial_seed", "DUPLICATE_TOL"} <= set(ask_tell.__all__)
    for name in ask_tell.__all__:
        getattr(ask_tell, name)
    assert ask_tell.AskTellOptimizer is facade
    assert (ask_tell.Trial, ask_tell.TrialError, ask_tell.trial_seed) == (Trial, TrialError, trial_seed)


def test_duplicates_are_judged_under_the_proposers_tolerance():
    from orchestrator.acquisition import base
    from orchestrator.ask_tell import dedup

    assert ask_tell.DUPLICATE_TOL is dedup.DUPLICATE_TOL is base.DUPLICATE_TOL


def test_the_parts_of_the_optimizer_define_disjoint_members():
    parts = AskTellOptimizer.__mro__[1:-1]
    assert len(parts) >= 5 and all(p.__module__.startswith("orchestrator.ask_tell.") for p in parts)
    seen: dict[str, str] = {}
    for cls in AskTellOptimizer.__mro__[:-1]:
        for name in vars(cls):
            if name.startswith("__") and name.endswith("__"):
                continue
            assert name not in seen, f"{name!r} is defined by both {seen[name]} and {cls.__name__}"
            seen[name] = cls.__name__


def _documented_public_members() -> set[str]:
    def doc(obj) -> str | None:
        obj = obj.fget if isinstance(obj, property) else getattr(obj, "__func__", obj)
        return inspect.getdoc(obj) if callable(obj) else None

    return {name for name in dir(AskTellOptimizer) if not name.startswith("_")
            and doc(inspect.getattr_static(AskTellOptimizer, name))}


def test_the_api_page_lists_every_documented_public_member_once():
    page = (REPO / "docs" / "api.md").read_text()
    block = page.split("::: orchestrator.ask_tell.AskTellOptimizer\n", 1)[1].split("\n\n", 1)[0]
    listed = re.findall(r"^\s+- (\w+)$", block, re.M)
    assert len(listed) == len(set(listed)), listed
    assert set(listed) == _documented_public_members()
    assert {"ask", "tell", "fit", "best", "design_left", "has_trial", "restore_trial", "set_state"} <= set(
        listed
    )
