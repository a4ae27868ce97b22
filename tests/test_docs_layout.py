"""The code-layout page (docs/architecture.md) and the modules stay together: every module of the four
packages is named there, and every module path it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
PACKAGES = ("qbatch", "orchestrator", "workers", "objectives")


def _modules() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
            if "__pycache__" not in p.parts}


def _named() -> set[str]:
    return set(re.findall(rf"`((?:{'|'.join(PACKAGES)})/[\w/]+\.py)`", PAGE.read_text()))


def test_every_module_is_on_the_layout_page() -> None:
    missing = sorted(_modules() - _named())
    assert not missing, f"docs/architecture.md does not say where these modules belong: {missing}"


def test_every_module_the_layout_page_names_exists() -> None:
    stale = sorted(_named() - _modules())
    assert not stale, f"docs/architecture.md names modules that do not exist: {stale}"
