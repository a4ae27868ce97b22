"""Duplicate proposals at `ask`: a point equal to a pending, observed or failed one, or to an earlier point of
its batch, is replaced by a new one.

Points are compared by their cells: the grid index of each int or choice coordinate (`cell_index`, exact) and
each float coordinate rounded to `DUPLICATE_TOL`, the one tolerance under which two unit-cube points are the
same point (orchestrator/acquisition/base.py: the proposers keep their batches that far apart). With discrete
parameters, proposals can round onto taken grid points; in a float space only a proposer can repeat one (the
built-in ones do not; a user's may). `DuplicateHandling` is the part of `AskTellOptimizer` that applies these
functions.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from orchestrator.acquisition.base import DUPLICATE_TOL
from orchestrator.ask_tell.trials import trial_seed
from orchestrator.space import FloatParam, IntParam, SearchSpace

__all__ = [
    "DUPLICATE_TOL",
    "DuplicateHandling",
    "cell_keys",
    "grid_cells",
    "only_failed",
    "replace_duplicates",
]

#: random draws tried to replace a snapped duplicate before a repeat is accepted (discrete spaces run out)
_REPLACE_TRIES = 64
#: an int/choice grid up to this many points has its free cells listed when random replacements miss them
_ENUMERATE_MAX = 100_000


def cell_keys(space: SearchSpace, rows: Tensor) -> list[bytes]:
    """One key per unit-cube row: the grid index of each int or choice coordinate (`cell_index`: exact, where
    rounding unit coordinates to `DUPLICATE_TOL` would merge neighbouring values of a log int near 1e5, and a
    grid of 100,000 such cells would have 98,259 keys) and each float coordinate rounded to
    `DUPLICATE_TOL`."""
    arr = rows.detach().cpu().numpy().astype(np.float64).reshape(-1, space.dim)
    # no -0.0
    cols = [np.round(arr[:, j], round(-math.log10(DUPLICATE_TOL))) + 0.0 if isinstance(p, FloatParam)
            else p.cell_index(arr[:, j]).astype(np.float64) for j, p in enumerate(space.params)]
    out = np.stack(cols, axis=1) if cols else arr
    return [r.tobytes() for r in np.ascontiguousarray(out)]


def grid_cells(space: SearchSpace) -> Tensor:
    """Every point of an all-int/choice space, as snapped unit-cube rows (only for a small grid): the product
    of each parameter's unit coordinates, computed once per value (a dict per cell through `to_unit` takes
    55 s for 1,000 choices x 100 ints)."""
    axes = [
        torch.tensor(
            [p.to_unit(v) for v in (p.values.tolist() if isinstance(p, IntParam) else p.choices)],
            dtype=torch.float64,
        )
        for p in space.params
    ]
    return torch.cartesian_prod(*axes).reshape(-1, len(axes))


def only_failed(space: SearchSpace, x: Tensor, X_observed: Tensor, X_failed: Tensor) -> bool:
    """Whether `x` is a point whose evaluations all failed, compared as `replace_duplicates` compares points
    (by cell, `cell_keys`)."""
    k = cell_keys(space, x.reshape(1, -1))[0]
    return k in set(cell_keys(space, X_failed)) and k not in set(cell_keys(space, X_observed))


def replace_duplicates(space: SearchSpace, X: Tensor, X_pending: Tensor, X_taken: Tensor,
                       gen: torch.Generator) -> Tensor:
    """`X` with each point equal to a pending or taken point or to an earlier point of `X` replaced.

    A duplicate is replaced by a random snapped point that is new (drawn with `gen`; on an int/choice grid of
    up to `_ENUMERATE_MAX` points, a random one of the cells left when the draws miss them all); when the grid
    holds no untaken point (a small discrete space is exhausted), or a larger grid's draws find none, the
    repeat is
    kept: for a noisy objective a repeated evaluation is still informative.
    Points are compared by their cells (`cell_keys`), as bytes in a set, so the cost is linear in the
    observations, whatever q.
    """
    floats = [isinstance(p, FloatParam) for p in space.params]
    # how many points the space holds: None (unbounded) with a float parameter
    grid = None if any(floats) else math.prod(
        p.size if isinstance(p, IntParam) else len(p.choices) for p in space.params)

    def keys(rows: Tensor) -> list[bytes]:
        return cell_keys(space, rows)

    taken = set(keys(X_pending)) | set(keys(X_taken))
    out = X.clone()
    free: list[tuple[bytes, Tensor]] | None = None  # a small grid's untaken cells, listed when draws miss
    for i, k in enumerate(keys(out)):
        if k in taken and (grid is None or len(taken) < grid):
            cands = space.snap(torch.rand(_REPLACE_TRIES, space.dim, generator=gen, dtype=torch.float64))
            for cand, ck in zip(cands, keys(cands)):
                if ck not in taken:
                    out[i], k = cand.to(out.dtype), ck
                    break
            else:  # random draws rarely hit the last free cells of a nearly full grid: pick one of them
                if grid is not None and grid <= _ENUMERATE_MAX:
                    if free is None:
                        cells = grid_cells(space)
                        free = [(ck, c) for ck, c in zip(keys(cells), cells) if ck not in taken]
                    while free:  # a random free cell; one taken since the list was made is dropped
                        j = int(torch.randint(len(free), (1,), generator=gen))
                        free[j], free[-1] = free[-1], free[j]
                        ck, cell = free.pop()
                        if ck not in taken:
                            out[i], k = cell.to(out.dtype), ck
                            break
        taken.add(k)
    return out


class DuplicateHandling:
    """The optimizer's duplicate checks, on its space and with generators seeded from its seed."""

    def _dedupe(self, X: Tensor, X_pending: Tensor, X_observed: Tensor, batch_id: int) -> Tensor:
        """Replace points equal to a pending or observed (or failed: `_ask`) point or to an earlier point of
        the batch (`replace_duplicates`), with random draws seeded by the optimizer's seed and `batch_id`."""
        gen = torch.Generator().manual_seed(trial_seed(self.seed, f"dedupe-{batch_id}"))
        return replace_duplicates(self.space, X, X_pending, X_observed, gen)

    def _only_failed(self, x: Tensor, X_observed: Tensor, X_failed: Tensor) -> bool:
        """Whether `x` is a point whose evaluations all failed (`only_failed`)."""
        return only_failed(self.space, x, X_observed, X_failed)

    def _cell_keys(self, rows: Tensor) -> list[bytes]:
        """The cell key of each unit-cube row (`cell_keys`)."""
        return cell_keys(self.space, rows)

    def _grid_cells(self) -> Tensor:
        """Every point of a small all-int/choice space (`grid_cells`)."""
        return grid_cells(self.space)
