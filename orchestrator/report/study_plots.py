"""The report's plots of the parameters: parallel coordinates, slice plots and parameter importance, drawn by
Optuna's matplotlib visualizations (`optuna.visualization.matplotlib`) from an in-memory study of the run's
trials.

The study holds one `FrozenTrial` per finished trial (`optuna.trial.create_trial`): completed trials with
their value, failed ones as failed (Optuna's plots leave them out), each parameter with the distribution of
the run's space (config.yaml `space`, as the run resolved it): float and log float as `FloatDistribution`, int
(with its step, or log) as `IntDistribution`, choice as `CategoricalDistribution`. Importance is PED-ANOVA's
(`optuna.importance.PedAnovaImportanceEvaluator`: which parameters set the top 10% of trials apart from the
rest), which needs only NumPy and SciPy (Optuna's fANOVA evaluator needs scikit-learn's random forests).

A plot that cannot be drawn (Optuna not installed, fewer than 2 completed trials, importance of one parameter
or of too few trials for PED-ANOVA's top 10% to hold two) is skipped with its reason logged at INFO, which
`qbatch report` prints.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import numbers
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

#: the share of the best completed trials PED-ANOVA compares with all of them (its default)
IMPORTANCE_QUANTILE = 0.1
#: the fewest completed trials of an importance plot: PED-ANOVA's top `IMPORTANCE_QUANTILE` must hold 2 trials
MIN_IMPORTANCE_TRIALS = 20
#: the most parameters of one slice figure: a run with more draws `slice_1.png`, `slice_2.png`, ... of
#: near-equal numbers of parameters
SLICE_PARAMS_PER_FIGURE = 4


def skip(name: str, reason: str) -> None:
    """Log (at INFO: `qbatch report` prints these lines after the files it wrote) that the report's plot
    `name` is not drawn, and why."""
    log.info("qbatch: report: %s.png not drawn: %s", name, reason)


def _choice_label(value: Any) -> Any:
    """A choice as Optuna's categorical distributions hold it (None, bool, int, float, str): a list or a dict
    as its JSON text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, sort_keys=True)


def distributions(
    space: Mapping[str, Mapping[str, Any]], rows: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Optuna distributions of the run's space (its description, orchestrator/space.py `describe`). A run
    without a recorded space gets one from the logged values: a float range where all are numbers, else their
    choices."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out: dict[str, Any] = {}
    for name, spec in space.items():
        kind = spec.get("type", "float")
        log_scale = bool(spec.get("log", False))
        if kind == "float":
            out[name] = FloatDistribution(float(spec["low"]), float(spec["high"]), log=log_scale)
        elif kind == "int":
            step = int(spec.get("step", 1))
            out[name] = IntDistribution(int(spec["low"]), int(spec["high"]), log=log_scale,
                                        step=1 if log_scale else step)
        else:
            out[name] = CategoricalDistribution([_choice_label(c) for c in spec["choices"]])
    names: list[str] = []
    for r in rows:
        names += [k for k in (r.get("params") or {}) if k not in out and k not in names]
    for name in names:
        values = [(r.get("params") or {}).get(name) for r in rows]
        values = [v for v in values if v is not None]
        if values and all(isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
                          for v in values) and min(values) < max(values):
            out[name] = FloatDistribution(float(min(values)), float(max(values)))
        else:
            labels = list(dict.fromkeys(_choice_label(v) for v in values))
            if labels:
                out[name] = CategoricalDistribution(labels)
    return out


#: what `_param_value` gives for a value that `dist` cannot take (None is a choice a space may have)
_OFF = object()


def _param_value(dist: Any, value: Any, present: bool = True) -> Any:
    """`value` in the form `dist` takes (a clamped float, an int, a choice's label); `_OFF` when it has none,
    or the trial has no value (`present` False)."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    if not present:
        return _OFF
    if isinstance(dist, CategoricalDistribution):
        label = _choice_label(value)
        return (
            label
            if any(label is c or (type(label) is type(c) and label == c) for c in dist.choices)
            else _OFF
        )
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        return _OFF
    v = min(max(float(value), dist.low), dist.high)  # a log float mapped back may lie an ulp outside
    if isinstance(dist, IntDistribution):
        k = round(v)
        return k if (k - dist.low) % dist.step == 0 else _OFF
    return v


def build_study(
    rows: Sequence[Mapping[str, Any]], space: Mapping[str, Mapping[str, Any]], direction: str
) -> Any:
    """An in-memory Optuna study of the finished trials in `rows` (`orchestrator.store.frame.log_rows`), with
    the distributions of `space`. A trial whose params do not fit the space (a parameter missing or off its
    grid) is left out of it."""
    import optuna

    dists = distributions(space, rows)
    trials = []
    for r in rows:
        state = {
            "completed": optuna.trial.TrialState.COMPLETE, "failed": optuna.trial.TrialState.FAIL
        }.get(r["state"])
        value = r.get("value")
        if state is None or (state == optuna.trial.TrialState.COMPLETE
                             and (value is None or not math.isfinite(value))):
            continue
        given = r.get("params") or {}
        params = {k: _param_value(d, given.get(k), k in given) for k, d in dists.items()}
        if any(v is _OFF for v in params.values()):
            continue
        trials.append(optuna.trial.create_trial(
            state=state, params=params, distributions=dists,
            value=float(value) if state == optuna.trial.TrialState.COMPLETE else None,
            user_attrs={"trial_id": r.get("trial_id"), "source": r.get("source")}))
    with _quiet_optuna():
        study = optuna.create_study(direction="minimize" if direction == "minimize" else "maximize")
        study.add_trials(trials)
    return study


@contextlib.contextmanager
def _quiet_optuna() -> Iterator[None]:
    """Optuna's INFO lines ("A new study created in memory") and its experimental-API warnings held back; its
    verbosity put back after."""
    import optuna

    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            yield
    finally:
        optuna.logging.set_verbosity(before)


def _figure_of(axes: Any) -> Any:
    import numpy as np

    return (np.asarray(axes).flat[0] if isinstance(axes, np.ndarray) else axes).figure


def parameter_figures(
    plt: Any,
    name: str,
    rows: Sequence[Mapping[str, Any]],
    space: Mapping[str, Mapping[str, Any]],
    direction: str,
) -> Iterator[tuple[str, Any]]:
    """(artifact name, figure) of "parallel_coordinates", "slice" (or "slice_1", "slice_2", ... past
    `SLICE_PARAMS_PER_FIGURE` parameters) and "importance", drawn when the caller asks for the next; the ones
    that cannot be drawn are skipped with their reason logged. `name` is the run's, for the titles."""
    keys = ["parallel_coordinates", "slice", "importance"]
    try:
        import optuna
        from optuna.visualization import matplotlib as ovm
    except ImportError:
        for key in keys:
            skip(key, "it is drawn by Optuna, which is not installed (pip install optuna)")
        return
    study = build_study(rows, space, direction)
    completed = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    params = list(distributions(space, rows))
    if len(completed) < 2:
        for key in keys:
            skip(key, f"{len(completed)} completed trial(s) with the run's parameters; it needs 2")
        return
    target = f"value ({direction})"
    fig = _draw("parallel_coordinates", lambda: ovm.plot_parallel_coordinate(study, target_name=target),
                colour_bar=True)
    if fig is not None:
        fig.set_size_inches(max(6.4, 1.6 * (len(params) + 1)), 4.8)
        fig.subplots_adjust(bottom=0.2)
        fig.axes[0].set_title(f"{name}: parallel coordinates of {len(completed)} completed trials")
        yield "parallel_coordinates", fig
    k = math.ceil(len(params) / SLICE_PARAMS_PER_FIGURE)  # figures of near-equal numbers of parameters
    chunks = [params[len(params) * i // k:len(params) * (i + 1) // k] for i in range(k)]
    for i, chunk in enumerate(chunks):
        key = "slice" if len(chunks) == 1 else f"slice_{i + 1}"
        fig = _draw(
            key, lambda chunk=chunk: ovm.plot_slice(study, params=chunk, target_name=target), colour_bar=True
        )
        if fig is not None:
            fig.set_size_inches(max(6.4, 3.6 * len(chunk)), 4.4)
            part = f" ({i + 1} of {len(chunks)})" if len(chunks) > 1 else ""
            title = f"{name}: slice plot{part}: each completed trial's value against one parameter"
            if len(chunk) == 1:  # Optuna titles the axes of one parameter, the figure of several
                fig.axes[0].set_title(title, fontsize=9)
            else:
                fig.suptitle(title)
            yield key, fig
    if len(params) < 2:
        skip("importance", f"the space has one parameter ({params[0]!r}): its importance is 1")
        return
    if len(completed) < MIN_IMPORTANCE_TRIALS:
        skip(
            "importance",
            f"{len(completed)} completed trials; PED-ANOVA needs {MIN_IMPORTANCE_TRIALS} (its top "
            f"{IMPORTANCE_QUANTILE:.0%} must hold 2)",
        )
        return
    evaluator = optuna.importance.PedAnovaImportanceEvaluator(target_quantile=IMPORTANCE_QUANTILE)
    fig = _draw(
        "importance", lambda: ovm.plot_param_importances(study, evaluator=evaluator, target_name=target)
    )
    if fig is not None:
        fig.axes[0].set_title(
            f"{name}: parameter importance\nPED-ANOVA: what sets the top {IMPORTANCE_QUANTILE:.0%} "
            f"of {len(completed)} completed trials apart",
            fontsize=9,
            loc="left",
        )
        yield "importance", fig


def _draw(key: str, plot: Any, colour_bar: bool = False) -> Any:
    """The figure of one of Optuna's plots (`plot()` returns its axes), drawn with Optuna kept quiet; None,
    with the reason logged, where Optuna cannot draw it. Optuna sets its own style (`plt.style.use`): it is
    put back after, for the report's other plots. A figure with a `colour_bar` keeps Optuna's layout (its
    colour bar does not survive `tight_layout`): it gets a layout engine that lays out nothing, which tells
    the writer so."""
    import matplotlib
    from matplotlib.layout_engine import PlaceHolderLayoutEngine

    with _quiet_optuna(), matplotlib.rc_context():
        try:
            fig = _figure_of(plot())
            if colour_bar:
                fig.set_layout_engine(PlaceHolderLayoutEngine(adjust_compatible=True, colorbar_gridspec=True))
            return fig
        except (ValueError, TypeError, ZeroDivisionError, RuntimeError) as exc:
            skip(key, f"Optuna could not draw it: {type(exc).__name__}: {exc}")
            return None
