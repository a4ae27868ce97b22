"""Shared fixtures (the ../shared folder: LCLS data, specs), test-wide settings, and how pytest-xdist orders
and groups the test files."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("QBATCH_SHARED", REPO.parent / "shared"))


@pytest.fixture
def one_thread():
    """One intra-op torch thread for the test: small GP algebra runs faster on one, and with two threads on
    cores that other processes keep busy, OpenMP's spinning barriers made one test 10x slower (38 CPU-minutes
    instead of 4). Modules opt in with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The project's ../shared folder; tests that need it skip with a reason when it is absent."""
    if not SHARED.is_dir():
        pytest.skip(f"../shared not found at {SHARED} (set QBATCH_SHARED); CI always has it")
    return SHARED


@pytest.fixture(scope="session")
def lcls_csv(shared_dir: Path) -> Path:
    path = shared_dir / "data" / "lcls" / "data.csv"
    if not path.is_file():
        pytest.skip(f"LCLS data not found at {path}")
    return path


@functools.cache
def _ray_rank(path: Path) -> int:
    """0 for a test file with Ray tests (marked `ray`) outside tests/benchmarks, 1 for a benchmark smoke file
    that starts Ray, 2 for any other. Read from the file's text: pytest-xdist's controller, which schedules
    the files, collects no tests and sees only their ids."""
    if "pytest.mark.ray" not in path.read_text():
        return 2
    return int(Path(__file__).parent / "benchmarks" in path.parents)


def pytest_collection_modifyitems(config, items):
    """The files with Ray tests run first, then the benchmark smoke runs that start Ray, then the rest, each
    file's tests in their order (`pytest_xdist_make_scheduler` hands the files out in this order)."""
    items.sort(key=lambda item: _ray_rank(item.path))


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: no error where it is not installed
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` (pyproject.toml), except that the files with Ray tests outside tests/benchmarks go to
    one worker together, one after another, while the other takes the rest file by file. Two Ray files at once
    starve each other's actors on two cores: beside another Ray file, the utilization of test_run_local's
    streaming run (200 evaluations of 0.3 s) measured 0.62 to 0.93 against its bound of 0.7, beside CPU-bound
    unit tests 0.92. The benchmark smoke runs that start Ray check their tables' rows, not timings: they keep
    a file of their own."""
    if config.getoption("dist") != "loadfile":
        return None  # another --dist asked for on the command line: pytest-xdist's own scheduler
    from xdist.scheduler import LoadFileScheduling

    root = Path(config.rootpath)

    class RayFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return "ray" if _ray_rank(root / file) == 0 else file

    return RayFilesTogether(config, log)
