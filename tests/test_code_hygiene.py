"""Comments and docstrings say what the code does and why, in the present tense: the history of how it came to
be (review findings, issue and item numbers, dated notes) is git's.

Library code: every module of each library package (a top-level folder of the repository with an
`__init__.py`, other than tests/ and benchmarks/); the tests and the benchmarks are held to the same rule. The
whole text of each module is read, messages included. A reference to another project's issue names its
repository (`meta-pytorch/botorch issue #3368`) and is not matched. Dates are looked for in library code only:
tests and benchmarks hold dates as data (file names, YAML values).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOT_LIBRARY = {"tests", "benchmarks"}

#: name -> pattern (case-insensitive) of a changelog note
HISTORY = {
    "review finding": r"found in review|\breview\b",
    "issue reference": r"\bissues? \d+",
    "dated note": r"\b20\d\d-[01]\d-[0-3]\d\b",
}
#: the notes that tests and benchmarks are checked for too
NOT_IN_TESTS = ("review finding", "issue reference")
#: this module, which holds the patterns' examples
SELF = Path(__file__).resolve().relative_to(REPO).as_posix()


def library_files() -> list[Path]:
    return [path for init in sorted(REPO.glob("*/__init__.py")) if init.parent.name not in NOT_LIBRARY
            for path in sorted(init.parent.rglob("*.py"))]


def other_checked_files() -> list[Path]:
    return [path for folder in sorted(NOT_LIBRARY) for path in sorted((REPO / folder).rglob("*.py"))
            if path.relative_to(REPO).as_posix() != SELF]


def _hits(kind: str, paths: list[Path]) -> dict[str, list[str]]:
    """file -> its lines that match the pattern of `kind`."""
    pattern = re.compile(HISTORY[kind], re.IGNORECASE)
    hits: dict[str, list[str]] = {}
    for path in paths:
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                hits.setdefault(path.relative_to(REPO).as_posix(), []).append(f"{i}: {line.strip()}")
    return hits


def test_library_files_are_found():
    packages = {path.relative_to(REPO).parts[0] for path in library_files()}
    assert {"orchestrator", "workers", "objectives"} <= packages


@pytest.mark.parametrize("kind", sorted(HISTORY))
def test_library_code_holds_no_history(kind):
    hits = _hits(kind, library_files())
    assert not hits, (f"{kind} in library code (say what and why in the present tense; git keeps the "
                      "history):\n") + (
        "\n".join(f"{name}:{line}" for name, lines in hits.items() for line in lines))


def test_test_and_benchmark_files_are_found():
    names = {path.relative_to(REPO).as_posix() for path in other_checked_files()}
    assert "tests/orchestrator/acquisition/test_thompson.py" in names and "benchmarks/_common.py" in names
    assert SELF not in names


@pytest.mark.parametrize("kind", NOT_IN_TESTS)
def test_tests_and_benchmarks_hold_no_history(kind):
    hits = _hits(kind, other_checked_files())
    assert not hits, f"{kind} in tests or benchmarks (say what the test checks, in the present tense):\n" + (
        "\n".join(f"{name}:{line}" for name, lines in hits.items() for line in lines))


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
