"""The typed seams (orchestrator/protocols.py): every built-in surrogate, proposer and calibrator satisfies
its Protocol, by `isinstance` (they are runtime-checkable) and member by member, and each capability a caller
reads is
declared on every component rather than present on some: the optimizer and `attach` read it without a
probe."""

from __future__ import annotations

import inspect

import pytest

from orchestrator.acquisition import PROPOSERS, build_proposer
from orchestrator.acquisition.base import Proposer
from orchestrator.calibration import CALIBRATORS, build_calibrator
from orchestrator.calibration.base import Calibrator
from orchestrator.models import MODELS, build_model
from orchestrator.models.base import Surrogate
from orchestrator.protocols import (
    CalibratorProtocol,
    ProposerProtocol,
    SurrogateProtocol,
    VariationalSurrogate,
)


def _members(protocol: type) -> set[str]:
    """The names a Protocol declares: its annotated attributes, methods and properties."""
    names = set(getattr(protocol, "__annotations__", {}))
    names |= {n for n, v in vars(protocol).items()
              if not n.startswith("_") and (callable(v) or isinstance(v, property))}
    return names


def _check(obj: object, protocol: type) -> None:
    assert isinstance(obj, protocol), type(obj).__name__
    missing = sorted(n for n in _members(protocol) if inspect.getattr_static(obj, n, None) is None
                     and not _may_be_none(protocol, n))
    assert not missing, f"{type(obj).__name__} lacks {missing} of {protocol.__name__}"


def _may_be_none(protocol: type, name: str) -> bool:
    """Members a component may leave None (hooks not set yet, no spread tracker)."""
    return "None" in str(protocol.__annotations__.get(name, "")) or name == "spread_tracker"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_built_in_surrogate_is_a_surrogate_protocol(name):
    model = build_model(name, tau=0.3)
    assert isinstance(model, Surrogate)
    _check(model, SurrogateProtocol)
    assert model.family in ("asymmetric_laplace", "asymmetric_gaussian", "gaussian") and model.tau == 0.3


@pytest.mark.parametrize("name", ["quantile", "expectile", "heteroscedastic"])
def test_the_sparse_variational_surrogates_declare_their_elbo(name):
    assert isinstance(build_model(name), VariationalSurrogate)


@pytest.mark.parametrize("name", ["exact-gp", "gpr-replicates"])
def test_the_exact_surrogates_have_no_elbo(name):
    assert not isinstance(build_model(name), VariationalSurrogate)


@pytest.mark.parametrize("name", sorted(PROPOSERS))
def test_every_built_in_proposer_is_a_proposer_protocol(name):
    proposer = build_proposer(name)
    assert isinstance(proposer, Proposer)
    _check(proposer, ProposerProtocol)
    flags = {
        f: getattr(proposer, f)
        for f in ("requires_model", "allows_repeats", "uses_spread", "uses_calibrator", "uses_observed_y")
    }
    assert all(isinstance(v, bool) for v in flags.values()), flags


def test_the_proposers_declare_the_hooks_they_read():
    uses = {name: {f for f in ("uses_spread", "uses_calibrator", "uses_observed_y", "allows_repeats")
                   if getattr(build_proposer(name), f)} for name in PROPOSERS}
    assert uses == {"thompson": {"uses_spread"}, "qgibbon": {"uses_spread"}, "sobol": set(), "random": set(),
                    "qlognei": set(), "gpr-ei": {"allows_repeats"},
                    "calibrated": {"uses_calibrator", "uses_observed_y"}}
    assert [n for n in PROPOSERS if not build_proposer(n).requires_model] == ["sobol", "random"]


@pytest.mark.parametrize("name", sorted(CALIBRATORS))
def test_every_built_in_calibrator_is_a_calibrator_protocol(name):
    calibrator = build_calibrator(name)
    assert isinstance(calibrator, Calibrator)
    _check(calibrator, CalibratorProtocol)
    assert calibrator.name == name
    assert isinstance(calibrator.given_options, tuple) and isinstance(calibrator.given_spread_options, tuple)
    assert calibrator.acquisition_only is (name in ("conformal", "offline-cv"))


def test_the_optimizers_components_are_typed_by_the_protocols():
    from orchestrator.ask_tell import AskTellOptimizer

    opt = AskTellOptimizer(
        {"x": {"type": "float", "low": 0.0, "high": 1.0}},
        calibrator="online",
        initial_design=2,
        model_options={"num_inducing": 8, "max_steps": 30},
    )
    opt.prepare()
    assert isinstance(opt._proposer, ProposerProtocol) and isinstance(opt.calibrator, CalibratorProtocol)
    assert opt._proposer.spread == opt.calibrator.spread  # `attach` wired the spread hook Thompson declares
    for t in opt.ask(2):
        opt.tell(t.trial_id, float(t.params["x"]))
    opt.fit()
    assert isinstance(opt.model, SurrogateProtocol)
