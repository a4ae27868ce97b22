"""The docs site: the pages that quote benchmark figures match the recorded tables they are
generated from (`scripts/build_benchmark_pages.py`), their templates type no figure by hand, and
every page is in the site's nav.

`mkdocs build --strict` itself runs in `.ci/run`."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def _load_generator():
    spec = importlib.util.spec_from_file_location(
        "build_benchmark_pages", REPO / "scripts" / "build_benchmark_pages.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("build_benchmark_pages", module)
    spec.loader.exec_module(module)
    return module


pages = _load_generator()


def test_every_generated_page_matches_its_tables():
    """Each committed page is what its template renders from the tables now: a table changed after
    the page was made, or a page edited by hand, fails here (re-run `python
    scripts/build_benchmark_pages.py`)."""
    assert len(pages.templates()) >= 11
    assert pages.stale() == []


def test_rendering_into_a_folder_gives_the_committed_pages(tmp_path):
    written = pages.build(tmp_path)
    assert len(written) == len(pages.templates())
    for path in written:
        rel = path.relative_to(tmp_path)
        assert path.read_text() == (REPO / "docs" / rel).read_text(), rel


def test_no_template_types_a_figure_by_hand():
    """Every decimal figure of a generated page is an expression that reads a table; what prose may
    type is a setting its commands show or a declared constant (a target, a threshold)."""
    assert pages.lint() == {}
    assert pages.typed_figures(
        "quantile TS ends at 0.059 ± 0.059 (`--settings 3:0.75:10`), tau 0.75"
    ) == ["0.059", "± 0"]
    assert (
        pages.typed_figures(
            "{# constants: 0.5 #}target 0.5, {{ r.regret|f }}, paper 003 §4.3, Ray 2.60"
        )
        == []
    )


def _results_copy(tmp_path: Path, copied: dict[str, str]) -> Path:
    """A stand-in for benchmarks/results/: links to the recorded tables, but real copies of `copied`
    (path -> text to write there)."""
    out = tmp_path / "results"
    for src in pages.RESULTS.rglob("*"):
        rel = src.relative_to(pages.RESULTS).as_posix()
        dst = out / rel
        if src.is_dir():
            dst.mkdir(parents=True, exist_ok=True)
        elif rel in copied:
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text(copied[rel])
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.symlink_to(src)
    return out


def test_a_changed_figure_makes_its_page_stale(tmp_path, monkeypatch):
    rel = "gld_full/summary.csv"
    text = (pages.RESULTS / rel).read_text()
    assert "0.05938679347975721" in text  # quantile TS, tau 0.75, batch 10: 0.059 on the GLD page
    monkeypatch.setattr(
        pages,
        "RESULTS",
        _results_copy(tmp_path, {rel: text.replace("0.05938679347975721", "0.0912")}),
    )
    assert "docs/benchmarks/gld.md" in pages.stale()
    page = pages.render("benchmarks/gld.md")
    assert "| 0.091 ± 0.059 (0.028) |" in page  # no longer the lowest of its setting: not bold
    assert "| **0.074 ± 0.065** (0.051) |" in page  # HetGP-TS's, now the lowest


def test_new_rows_of_the_quality_tables_reach_the_page(tmp_path, monkeypatch):
    """The lead's new quality tables: a row added to `quality/summary.csv` or
    `quality/fit_speed/summary.csv` is on the page once it is re-generated, with nothing to edit in
    the template."""
    summary = (pages.RESULTS / "quality/summary.csv").read_text()
    speed = (pages.RESULTS / "quality/fit_speed/summary.csv").read_text()
    row = (
        'lander-now,"tau 0.1, 1500 evaluations, 10 runs",quantile-ts,mean true 10% quantile,231.4,'
        ">= 240,False\n"
    )
    speed_row = "16,200,3,0.5,7.5,15.0,2.0,9.0,18.0,False\n"  # ... target, free factor s and ratio, met
    monkeypatch.setattr(
        pages,
        "RESULTS",
        _results_copy(
            tmp_path,
            {
                "quality/summary.csv": summary + row,
                "quality/fit_speed/summary.csv": speed + speed_row,
            },
        ),
    )
    page = pages.render("benchmarks/quality.md")
    assert (
        "| `lander-now` | tau 0.1, 1500 evaluations, 10 runs | quantile-ts | mean true 10% quantile"
        " | 231.4 |"
        in page
    )
    assert "| 16 | 200 | 3 | 0.500 | 7.500 | 15.0x | 9.000 | 18.0x | <= 2x | missed |" in page
    assert pages.stale() == ["docs/benchmarks/quality.md"]


def test_a_figure_the_tables_lack_stops_the_build(tmp_path, monkeypatch):
    rel = "laser_full/summary.csv"
    text = (pages.RESULTS / rel).read_text()
    kept = "\n".join(line for line in text.splitlines() if not line.startswith("qgibbon,")) + "\n"
    monkeypatch.setattr(pages, "RESULTS", _results_copy(tmp_path, {rel: kept}))
    with pytest.raises(pages.TableError, match="laser_full/summary.csv: 0 rows match"):
        pages.render("benchmarks/laser.md")


def _nav_pages(nav) -> list[str]:
    out = []
    for item in nav:
        for value in item.values() if isinstance(item, dict) else [item]:
            out += _nav_pages(value) if isinstance(value, list) else [value]
    return out


def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    on_disk = sorted(
        p.relative_to(REPO / "docs").as_posix()
        for p in (REPO / "docs").rglob("*.md")
        if not p.relative_to(REPO / "docs").parts[0].startswith("_")
    )
    assert sorted(nav) == on_disk
    for name in pages.templates():
        assert name in nav, name


def test_generated_pages_say_they_are_generated_and_list_their_tables():
    for name in pages.templates():
        text = (REPO / "docs" / name).read_text()
        assert text.startswith("<!-- Generated by scripts/build_benchmark_pages.py"), name
        listed = re.findall(
            r"`(benchmarks/results/[^`]+)`",
            text.rsplit("Figures on this page are read from:", 1)[-1],
        )
        assert listed, name
        for src in listed:
            assert list(REPO.glob(src)), src


def test_the_docs_extra_has_what_mkdocs_yml_uses():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    docs = " ".join(extras["docs"])
    for package in ("mkdocs", "mkdocs-material", "mkdocstrings-python"):
        assert re.search(rf"(^|\s|\"){re.escape(package)}>=", docs), package
    assert any("docs" in dep for dep in extras["test"]), (
        "CI installs the test extra and builds the docs"
    )
