"""Shared fixtures: the ../shared folder (LCLS data, specs) and test-wide settings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("QBATCH_SHARED", REPO.parent / "shared"))


@pytest.fixture
def one_thread():
    """One intra-op torch thread for the test: small GP algebra runs faster on one, and with two threads on cores
    that other processes keep busy, OpenMP's spinning barriers made one test 10x slower (38 CPU-minutes instead of
    4). Modules opt in with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
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
