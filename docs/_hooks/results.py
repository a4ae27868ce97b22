"""MkDocs hook: serve the plots under benchmarks/results/ with the site.

The generated pages link a plot by its path in the repository
(`../../benchmarks/results/<run>/<plot>.png` from `docs/benchmarks/`), which works where the
Markdown is read in place. MkDocs only serves files under `docs/`, so this hook adds every PNG under
`benchmarks/results/` to the site at `benchmarks/results/...` and points those links there.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parents[2]
RESULTS = "benchmarks/results"
_LINK = re.compile(r"\]\(((?:\.\./)+)" + RESULTS + "/")


def on_files(files, config):
    for png in sorted((REPO / RESULTS).rglob("*.png")):
        files.append(
            File(
                png.relative_to(REPO).as_posix(),
                src_dir=str(REPO),
                dest_dir=config["site_dir"],
                use_directory_urls=config["use_directory_urls"],
            )
        )
    return files


def on_page_markdown(markdown, page, config, files):
    here = posixpath.dirname(page.file.src_uri) or "."
    target = posixpath.relpath(RESULTS, here)
    return _LINK.sub(lambda m: f"]({target}/", markdown)
