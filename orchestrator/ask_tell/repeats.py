"""Re-evaluating the top candidates: a run's last evaluations spent measuring its best observed points again.

The recommendation (quantile-expectile-bo.md §1.7, orchestrator/recommend.py) is the observed input the model
scores highest. With one measurement per point, that score leans on the model's smoothing; at low noise the
asymmetric-Laplace fit ranks an isolated high measurement well below its true level. Measuring the top
candidates again gives the model replicates exactly where the answer is chosen, as a user re-runs the best few
configurations before picking one. `ask_repeats(q)` proposes `q` such re-evaluations, each point until it has
`1 + repeats` evaluations (counting pending ones), with fresh seeds. The candidates come alternately from the
recommendation rule's order and from the order of each point's best observed outcome (`repeat_order`
"mixed", the default): a high measurement that the model ranks low is measured again too, so a good point the
model smoothed away gets the replicate that lets the final fit see it, and a lucky draw is exposed
(benchmarks/results/quality/screen_reeval_order). "model" takes the rule's order alone. `repeat_share` splits
a budget between the search and the repeats.
"""

from __future__ import annotations

import math

import torch

from orchestrator.ask_tell.dedup import cell_keys
from orchestrator.ask_tell.trials import Trial, TrialError, check_batch_size
from orchestrator.models.base import use_device
from orchestrator.recommend import recommendation_scores
from orchestrator.threads import bounded_threads

__all__ = ["REPEAT_ORDERS", "SOURCE", "Repeats", "repeat_share"]

#: source of a re-evaluation trial (`Trial.source`, the log's "proposed" events)
SOURCE = "repeat"
#: orders of the re-evaluation candidates (`AskTellOptimizer.repeat_order`)
REPEAT_ORDERS = ("mixed", "model")


def repeat_share(budget: int, fraction: float) -> int:
    """Evaluations of a budget of `budget` that go to re-evaluations: `round(fraction * budget)`, at least 2
    when `fraction` > 0 (one candidate measured twice more), 0 when it is 0."""
    if fraction <= 0.0 or budget < 2:
        return 0
    return min(budget - 1, max(2, int(round(fraction * budget))))


class Repeats:
    """The part of `AskTellOptimizer` that proposes re-evaluations of its best observed points."""

    def ask_repeats(self, q: int, repeats: int = 1, fit: bool = True) -> list[Trial]:
        """Propose `q` re-evaluations of the best observed points.

        Candidates are taken best first in `repeat_order` ("mixed": alternately the recommendation rule's
        next and the next by best observed outcome; "model": the rule's alone), each until it has
        `1 + repeats` evaluations (completed and pending);
        each trial has a new id and a new evaluation seed, and is told like any other. The model is the one of
        the last fit (refit first with `fit` when results arrived since).

        Raises:
            TrialError: `q` or `repeats` is not an integer >= 1, `repeat_order` is not one of
                `REPEAT_ORDERS`, or there is no model yet (the initial design is not done, or nothing
                completed).
        """
        q, repeats = check_batch_size(q), check_batch_size(repeats, "repeats")
        if self.repeat_order not in REPEAT_ORDERS:
            raise TrialError(f"repeat_order must be one of {list(REPEAT_ORDERS)}; got {self.repeat_order!r}")
        with self._ask_lock, bounded_threads(self.threads):
            use_device(self.torch_device)
            if fit and self.can_fit() and (self._model is None or self.num_stale > 0):
                self.fit(restart=self.refit_restarts)
            model = self._model
            if model is None:
                raise TrialError("ask_repeats needs a fitted model: finish the initial design and fit first")
            with self._lock:
                X_obs = self._stack(self._obs_x)
                y_obs = list(self._obs_y)
                pending = [t.x for t in self._pending.values()]
                batch_id = self._next_batch
                self._next_batch += 1
            chosen = self._repeat_rows(model, X_obs, y_obs, pending, q, repeats)
            with self._lock:
                return self._register_batch(batch_id, X_obs[chosen], [None] * q, SOURCE)

    def _repeat_rows(self, model, X_obs: torch.Tensor, y_obs: list[float], pending: list[torch.Tensor],
                     q: int, repeats: int) -> list[int]:
        """Rows of `X_obs` to evaluate again, `q` of them: the distinct points best first in `repeat_order`,
        each up to `1 + repeats` evaluations in all; past the last candidate, the best again."""
        keys = cell_keys(self.space, X_obs)
        first: dict[bytes, int] = {}
        count: dict[bytes, int] = {}
        best_y: dict[bytes, float] = {}
        for i, k in enumerate(keys):
            first.setdefault(k, i)
            count[k] = count.get(k, 0) + 1
            best_y[k] = max(best_y.get(k, -math.inf), float(y_obs[i]))
        if pending:
            for k in cell_keys(self.space, torch.stack(pending)):
                if k in count:
                    count[k] += 1
        rows = torch.tensor(list(first.values()), dtype=torch.long)
        scores = recommendation_scores(model, X_obs[rows].to(**self._tk), self.recommendation)
        order = [int(rows[j]) for j in torch.argsort(scores, descending=True, stable=True)]
        if self.repeat_order == "mixed":
            order = _alternate(order, sorted(first.values(), key=lambda i: -best_y[keys[i]]))
        chosen: list[int] = []
        for i in order:
            need = 1 + repeats - count[keys[i]]
            chosen.extend([i] * max(0, min(need, q - len(chosen))))
            if len(chosen) == q:
                return chosen
        # every candidate has its repeats: the best ones again, round robin
        top = order[: max(1, math.ceil(q / repeats))]
        while len(chosen) < q:
            chosen.append(top[len(chosen) % len(top)])
        return chosen


def _alternate(a: list[int], b: list[int]) -> list[int]:
    """The rows of `a` and `b` (two orders of the same rows, one per distinct point) taken alternately, `a`
    first, each row once."""
    out: list[int] = []
    seen: set[int] = set()
    for pair in zip(a, b):
        for i in pair:
            if i not in seen:
                seen.add(i)
                out.append(i)
    return out
