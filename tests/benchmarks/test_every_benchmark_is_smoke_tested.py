"""Every benchmark's `--quick` mode runs in CI. A benchmark script without a smoke test that runs its
quick mode would silently drop out of that promise."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_benchmark_script_has_a_quick_smoke_test():
    scripts = sorted(p.stem for p in (REPO / "benchmarks").glob("*.py") if not p.stem.startswith("_"))
    assert len(scripts) >= 10
    missing = []
    for name in scripts:
        test = REPO / "tests" / "benchmarks" / f"test_{name}_smoke.py"
        text = test.read_text() if test.is_file() else ""
        # loaded in-process (`load_benchmark("gld")`) or run as a script (`benchmarks/load.py`)
        if "--quick" not in text or (f'"{name}"' not in text and f'"{name}.py"' not in text):
            missing.append(name)
    assert not missing, f"benchmarks without a smoke test of --quick in tests/benchmarks/: {missing}"
