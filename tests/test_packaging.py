"""What the built distributions carry (a fresh, non-editable install): the wheel holds the packages,
the example configs (`qbatch run examples/quickstart.yaml` works outside a checkout) and the licence, and no
tests; the sdist holds what the README's two commands and the test suite need. Built with the installed
setuptools from a copy of the repository's files, so the checkout is not touched."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs the git checkout to list the repository's files")
    src = tmp_path_factory.mktemp("src")
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        s, d = REPO / name, src / name
        if not os.path.lexists(s):  # deleted in the working tree
            continue
        d.parent.mkdir(parents=True, exist_ok=True)
        if s.is_symlink():
            os.symlink(os.readlink(s), d)
        else:
            shutil.copy2(s, d)
    out = tmp_path_factory.mktemp("dist")
    built = []
    for hook in ("build_sdist", "build_wheel"):  # one process each, as pip and `build` run them
        code = f"import sys; from setuptools import build_meta as b; print(b.{hook}(sys.argv[1]))"
        proc = subprocess.run([sys.executable, "-c", code, str(out)], cwd=src, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        built.append(proc.stdout.split()[-1])
    sdist_name, wheel_name = built
    with tarfile.open(out / sdist_name) as t:
        sdist = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    with zipfile.ZipFile(out / wheel_name) as z:
        wheel = set(z.namelist())
    return sdist, wheel


def test_wheel_carries_the_examples_and_no_tests(dists):
    _, wheel = dists
    examples = {n for n in wheel if n.startswith("orchestrator/examples/")}
    assert "orchestrator/examples/quickstart.yaml" in examples
    assert {Path(n).name for n in examples} == {p.name for p in (REPO / "examples").glob("*.yaml")}
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in wheel), sorted(wheel)[-8:]
    assert not [n for n in wheel if n.startswith(("tests/", "benchmarks/"))]
    for pkg in ("orchestrator/cli.py", "workers/evaluate.py", "objectives/laser.py"):
        assert pkg in wheel


def test_sdist_carries_what_the_readme_commands_and_tests_need(dists):
    sdist, _ = dists
    need = [
        "LICENSE",
        "README.md",
        "pyproject.toml",
        "MANIFEST.in",
        "cluster.yaml",
        ".ci/run",
        "scripts/loopback",
        "examples/quickstart.yaml",
        "tests/conftest.py",
        "tests/test_readme.py",
        "benchmarks/gld.py",
        "benchmarks/results/utilization_fresh/utilization.csv",
    ]
    assert [n for n in need if n not in sdist] == []
    assert not [n for n in sdist if "__pycache__" in n or n.endswith(".pyc")]
