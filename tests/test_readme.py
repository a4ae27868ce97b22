"""The README starts with exactly the two set-up commands, CI runs the second one, and every file, example and
benchmark the README names exists (so a figure's command can be run as written)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def _first_code_block() -> list[str]:
    m = re.search(r"```bash\n(.*?)```", README, re.S)
    assert m, "the README has no bash code block"
    return [line for line in m.group(1).splitlines() if line.strip()]


def test_readme_starts_with_the_two_commands_and_ci_runs_the_test_one():
    assert README.index("```bash") < README.index("\n## "), "the commands come before the first section"
    run_cmd, test_cmd = _first_code_block()
    assert "qbatch run examples/quickstart.yaml" in run_cmd and run_cmd.startswith("pip install torch==2.13.0 -e .")
    assert test_cmd.startswith("pip install torch==2.13.0 -e '.[test]'") and "python -m pytest" in test_cmd
    ci = (REPO / ".ci" / "run").read_text()
    ci_cmd = [line for line in ci.splitlines() if "pytest" in line]
    assert ci_cmd and test_cmd.split("&&")[1].strip() in ci_cmd[0], ".ci/run calls the README's test command"


def test_every_path_the_readme_names_exists():
    names = set(re.findall(r"`?((?:benchmarks|examples|tests|objectives|orchestrator|workers|scripts)/[\w./-]+\.(?:py|yaml))", README))
    names |= {"cluster.yaml", "scripts/loopback", ".ci/run"}
    assert len(names) > 20
    missing = sorted(n for n in names if not (REPO / n).exists())
    # test paths in the Reliability table are written relative to tests/
    missing = [n for n in missing if not (REPO / "tests" / n).exists()]
    assert not missing, f"the README names files that do not exist: {missing}"


def test_reliability_rows_name_existing_tests():
    rows = re.findall(r"\(`((?:faults|integration|workers|orchestrator)/[\w]+\.py)`", README)
    assert len(rows) >= 10
    missing = [r for r in rows if not (REPO / "tests" / r).exists()]
    assert not missing, missing
