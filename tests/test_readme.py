"""The README starts with exactly the two set-up commands, CI runs the second one, and every file,
example and benchmark the README and the docs name exists (so a figure's command can be run as
written). The reference material the README used to hold lives in `docs/` now; its checks moved with
it and read the page it moved to."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
DOCS = REPO / "docs"
#: the README and every page of the docs site (generated pages included), as one text
PAGES = {
    p.relative_to(REPO).as_posix(): p.read_text()
    for p in sorted(DOCS.rglob("*.md"))
    if "_templates" not in p.parts
}
DOCS_TEXT = "\n".join([README, *PAGES.values()])
#: the pages the reference tables moved to
RELIABILITY = (DOCS / "reliability.md").read_text()
CONFIGURATION = (DOCS / "configuration.md").read_text()


def _section(title: str, text: str = README) -> str:
    """The text of the `## title` section of `text` (up to the next `## ` heading)."""
    head = f"\n## {title}\n"
    assert head in text, f"no section {title!r}"
    return text.split(head, 1)[1].split("\n## ", 1)[0]


def _code_blocks(text: str, lang: str = "python") -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def _first_code_block() -> list[str]:
    m = re.search(r"```bash\n(.*?)```", README, re.S)
    assert m, "the README has no bash code block"
    return [line for line in m.group(1).splitlines() if line.strip()]


def test_readme_starts_with_the_two_commands_and_ci_runs_the_test_one():
    assert README.index("```bash") < README.index("\n## "), (
        "the commands come before the first section"
    )
    run_cmd, test_cmd = _first_code_block()
    assert "qbatch run examples/quickstart.yaml" in run_cmd and run_cmd.startswith(
        "pip install torch==2.13.0 -e ."
    )
    assert (
        test_cmd.startswith("pip install torch==2.13.0 -e '.[test]'")
        and "python -m pytest" in test_cmd
    )
    ci = (REPO / ".ci" / "run").read_text()
    ci_cmd = [line for line in ci.splitlines() if "pytest" in line]
    assert ci_cmd and test_cmd.split("&&")[1].strip() in ci_cmd[0], (
        ".ci/run calls the README's test command"
    )


def test_every_path_the_readme_names_exists():
    """Over the README and the docs pages, where the README's reference sections moved."""
    names = set(
        re.findall(
            r"`?((?:benchmarks|examples|tests|objectives|orchestrator|workers|scripts)/[\w./-]+\.(?:py|yaml))",
            DOCS_TEXT,
        )
    )
    names |= {"cluster.yaml", "scripts/loopback", ".ci/run"}
    assert len(names) > 20
    missing = sorted(n for n in names if not (REPO / n).exists())
    # test paths in the Reliability table are written relative to tests/
    missing = [n for n in missing if not (REPO / "tests" / n).exists()]
    assert not missing, f"the README or the docs name files that do not exist: {missing}"


def test_reliability_rows_name_existing_tests():
    """The Reliability table moved to docs/reliability.md."""
    rows = re.findall(r"\(`((?:faults|integration|workers|orchestrator)/[\w]+\.py)`", RELIABILITY)
    assert len(rows) >= 10
    missing = [r for r in rows if not (REPO / "tests" / r).exists()]
    assert not missing, missing


def test_the_component_options_table_matches_the_constructors():
    """Every row of the options table (docs/configuration.md, moved from the README) lists exactly
    the options its component's constructor takes (`calibrator` and `model_factory` are Python-only,
    `spread` of a proposer is set by the calibrator, `tau` is the top-level key)."""
    import dataclasses
    import importlib
    import inspect

    from orchestrator.acquisition import PROPOSERS
    from orchestrator.calibration import CALIBRATORS, SPREAD_KEYS
    from orchestrator.models import MODELS
    from orchestrator.models.svgp import SVGPOptions

    def params(target: str) -> set[str]:
        module, _, attr = target.partition(":")
        sig = inspect.signature(getattr(importlib.import_module(module), attr).__init__)
        return {
            p.name
            for p in sig.parameters.values()
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
            and p.name not in ("self", "tau", "spread", "calibrator", "model_factory")
        }

    # an option's values are named in brackets after it: the row's options are the names outside them
    rows = re.findall(
        r"^\| ((?:model|proposer|calibrator|every calibrator) [^|]*?) \| (.*?) \|$",
        CONFIGURATION,
        re.M,
    )
    listed = {k: set(re.findall(r"`(\w+)`", re.sub(r"\([^()]*\)", "", v))) for k, v in rows}
    assert len(listed) == 15
    assert listed.pop("model `quantile`, `expectile`, `heteroscedastic`") == {
        f.name for f in dataclasses.fields(SVGPOptions)
    }
    assert listed.pop("every calibrator but `none`") == {"spread"} | set(SPREAD_KEYS)
    # a proposer with options has a row (a new option, e.g. Thompson's `shared_features`, is
    # documented where
    # users look for it)
    with_rows = {k.split(" ")[1].strip("`") for k in listed if k.startswith("proposer ")}
    assert {name for name, target in PROPOSERS.items() if params(target)} <= with_rows
    for key, names in listed.items():
        kind, name = key.split(" ")
        name = name.strip("`")
        target = {  # one lambda is called at once, with this `name`
            "model": lambda: ":".join(MODELS[name]),  # noqa: B023
            "proposer": lambda: PROPOSERS[name],  # noqa: B023
            "calibrator": lambda: CALIBRATORS[name][0],  # noqa: B023
        }[kind]()
        assert names == params(target), key


def test_every_yaml_config_in_the_readme_is_valid():
    """A config the README or a docs page shows (the README's example, the model guide's recipe in
    docs/models.md) passes every check `qbatch run` makes before Ray starts, combinations included,
    so a user who copies it gets a run, not a config error."""
    from orchestrator.config import load_config_text
    from orchestrator.runner import _check_objective

    assert re.findall(r"```yaml\n(.*?)```", README, re.S), "the README shows no YAML config"
    assert re.findall(r"```yaml\n(.*?)```", PAGES["docs/models.md"], re.S), (
        "the model guide shows no YAML config"
    )
    for name, text in {"README.md": README, **PAGES}.items():
        for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", text, re.S)):
            _check_objective(load_config_text(block, source=f"{name} yaml block {i}"))


def test_the_readme_is_a_front_door_of_at_most_300_lines():
    """Reference material, benchmark notes and history live in docs/; the README
    links there."""
    lines = README.splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines"
    for page in (
        "docs/concepts.md",
        "docs/configuration.md",
        "docs/reliability.md",
        "docs/event-log.md",
        "docs/benchmarks/index.md",
        "docs/api.md",
        "docs/cluster.md",
    ):
        assert f"]({page}" in README, f"the README does not link {page}"


def test_the_library_section_uses_one_import_and_optimize():
    section = _section("As a library")
    blocks = _code_blocks(section)
    assert blocks and all("import qbatch" in b for b in blocks)
    assert not [b for b in blocks if re.search(r"^\s*(from|import) "
                                               r"(orchestrator|workers|objectives)\b", b, re.M)]
    assert any("qbatch.optimize(" in b for b in blocks)


@pytest.mark.ray
def test_the_library_sections_optimize_snippet_runs(tmp_path):
    """The snippet as written, as a script in a folder of its own (its function is then `__main__`'s), with
    the repository on the path as an installed package is; run inside `scripts/loopback` like the Ray
    tests."""
    snippet = next(b for b in _code_blocks(_section("As a library")) if "qbatch.optimize(" in b)
    (tmp_path / "snippet.py").write_text(snippet + "\nprint('rows', len(df), 'state', "
                                                   "sorted(set(df['state'])))\n")
    proc = subprocess.run(
        [sys.executable, "snippet.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Recommendation(params={'x': " in proc.stdout
    assert "rows 30 state ['completed']" in proc.stdout
    assert len(list((tmp_path / "runs").iterdir())) == 1
