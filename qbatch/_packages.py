"""The layout's three import packages, bound to the installation beside `qbatch` whatever the working folder
holds.

`objectives`, `workers` and `orchestrator` are top-level names (ARCHITECTURE.md "Layout"). Python puts the
script's folder, or the working folder for `python -c` and a notebook, first on `sys.path`, so a user's
`objectives.py` there would be imported in place of the package and break every import of the library
("'objectives' is not a package"). `bind` puts a finder first on `sys.meta_path` that resolves exactly these
three names to the packages installed beside `qbatch`; their submodules follow from the package's `__path__`,
and nothing is imported until it is used.

One process holds one module per name: a module of one of these names that was imported before `qbatch` is set
aside with a warning (the user's references to it keep working; a later `import objectives` gives the
package), and after `import qbatch` the name is the package's. The Ray workers of a run get the same binding
from the runner (orchestrator/runner/session.py), since Ray puts the driver's folders first on their
`sys.path` too.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

__all__ = ["PACKAGES", "bind"]

#: the layout's import packages, installed beside `qbatch`
PACKAGES = ("objectives", "workers", "orchestrator")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class InstalledPackages(importlib.abc.MetaPathFinder):
    """Finds `PACKAGES` (the top-level names only) in the folder that holds `qbatch`."""

    def __init__(self, root: str) -> None:
        self.root = root

    def find_spec(self, fullname: str, path: Sequence[str] | None = None, target: Any = None) -> Any:
        if fullname not in PACKAGES:
            return None
        folder = os.path.join(self.root, fullname)
        init = os.path.join(folder, "__init__.py")
        if not os.path.isfile(init):  # not installed beside qbatch: the usual search decides
            return None
        return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[folder])


def _is_installed(module: Any, folder: str) -> bool:
    """Whether `module` is the package in `folder` (one imported before `qbatch`, from the same files)."""
    paths = list(getattr(module, "__path__", None) or [])
    return any(os.path.realpath(p) == os.path.realpath(folder) for p in paths)


def bind(root: str = _ROOT) -> None:
    """Resolve `PACKAGES` to the packages in `root` (the folder that holds `qbatch`) from now on in this
    process, and set aside a module of one of these names imported from elsewhere (with a `UserWarning` naming
    its file)."""
    if not any(isinstance(f, InstalledPackages) and f.root == root for f in sys.meta_path):
        sys.meta_path.insert(0, InstalledPackages(root))
    for name in PACKAGES:
        folder = os.path.join(root, name)
        module = sys.modules.get(name)
        if (
            module is None
            or not os.path.isfile(os.path.join(folder, "__init__.py"))
            or _is_installed(module, folder)
        ):
            continue
        where = getattr(module, "__file__", None) or list(getattr(module, "__path__", None) or []) or "?"
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]
        warnings.warn(
            f"qbatch: the module {name!r} you imported ({where}) has the name of one of qbatch's packages; "
            f"qbatch uses its own, so `import {name}` now gives qbatch's package (the module you hold stays "
            f"usable). Rename yours (e.g. my_{name}.py) to import both by name", UserWarning, stacklevel=3)
