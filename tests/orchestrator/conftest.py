"""Shared fixtures of the orchestrator tests: every module here runs its GP algebra on one torch thread."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    """Small GP algebra is much faster single-threaded on a busy 2-core CI machine; restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
