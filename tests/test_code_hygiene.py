"""Comments and docstrings of library code say what the code does and why, in the present tense: the history of
how it came to be (review findings, issue and item numbers, dated notes) is git's.

Library code: every module of each library package (a top-level folder of the repository with an `__init__.py`,
other than tests/ and benchmarks/). The whole text of each module is read, messages included. A reference to
another project's issue names its repository (`meta-pytorch/botorch issue #3368`) and is not matched.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOT_LIBRARY = {"tests", "benchmarks"}

#: name -> pattern (case-insensitive) of a changelog note in library code
HISTORY = {
    "review finding": r"found in review|\breview\b",
    "issue reference": r"\bissues? \d+",
    "dated note": r"\b20\d\d-[01]\d-[0-3]\d\b",
}


def library_files() -> list[Path]:
    return [path for init in sorted(REPO.glob("*/__init__.py")) if init.parent.name not in NOT_LIBRARY
            for path in sorted(init.parent.rglob("*.py"))]


def test_library_files_are_found():
    packages = {path.relative_to(REPO).parts[0] for path in library_files()}
    assert {"orchestrator", "workers", "objectives"} <= packages


@pytest.mark.parametrize("kind", sorted(HISTORY))
def test_library_code_holds_no_history(kind):
    pattern = re.compile(HISTORY[kind], re.IGNORECASE)
    hits = [f"{path.relative_to(REPO)}:{i}: {line.strip()}" for path in library_files()
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert not hits, f"{kind} in library code (say what and why in the present tense; git keeps the history):\n" + (
        "\n".join(hits))


@pytest.mark.parametrize("text, kind", [
    ("# (found in review: at d = 12 the model predicted a constant)", "review finding"),
    ("x = 1  # the rerun was refused (review)", "review finding"),
    ('"""Metrics of a run (issue 4 items 4, 7)."""', "issue reference"),
    ("Issue 7 item 3 (actor loss).", "issue reference"),
    ("# written before 2026-11-25: it recorded the user's tau only", "dated note"),
])
def test_the_patterns_match_changelog_notes(text, kind):
    assert re.search(HISTORY[kind], text, re.IGNORECASE)


@pytest.mark.parametrize("text", [
    "zero (the failure of BoTorch's GIBBON in meta-pytorch/botorch issue #3368)",
    "Choices where the papers are silent (calibrated-bo.md §5.2 item 11):",
    "#: reviewed values of the spec's Table 2",
])
def test_the_patterns_leave_present_tense_references_alone(text):
    assert not any(re.search(p, text, re.IGNORECASE) for p in HISTORY.values())
