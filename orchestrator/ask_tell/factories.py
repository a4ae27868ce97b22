"""Building the ask/tell optimizer's components from its options: the surrogate (orchestrator.models), the
batch proposer (orchestrator.acquisition) and the calibrator (orchestrator.calibration), each by its factory,
and the check that they work together.

Each factory is imported where it is first called (the registries' lazy tables load a component's code only
when it is chosen). A bad option or combination is a `ConfigError` naming its config key when the optimizer is
created (`check_options`), not after the initial design was spent. `ComponentFactories` is one part of
`AskTellOptimizer` (orchestrator/ask_tell/optimizer.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.errors import ConfigError, UnsupportedError

if TYPE_CHECKING:
    from orchestrator.protocols import CalibratorProtocol, ProposerProtocol, SurrogateProtocol

__all__ = ["ComponentFactories"]


def _under(key: str, exc: BaseException) -> str:
    """The first line of `exc`, prefixed by the config key it is about unless it already names it."""
    msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    section = key.split(".")[0]
    return msg if msg.startswith((f"`{key}", f"`{section}.type`")) else f"`{key}`: {msg}"


class ComponentFactories:
    """The optimizer's model, proposer and calibrator, built from its `model_*`, `proposer_*` and
    `calibrator_*` settings."""

    def _build_model(self) -> SurrogateProtocol:
        from orchestrator.models import build_model
        from orchestrator.models.base import use_device

        if "tau" in self.model_options:
            raise ConfigError("`tau` is not a model option: set the top-level `tau` (the optimizer's level)")

        use_device(self.torch_device)  # a model is built, restored and fitted on this optimizer's device
        return build_model(self.model_name, tau=self.model_tau, **self.model_options)

    def _build_proposer(self) -> ProposerProtocol:
        from orchestrator.acquisition import build_proposer

        options = dict(self.proposer_options)
        if self.proposer_name == "sobol" and "seed" not in options:  # continue the initial design's sequence
            # (a sequence scrambled afresh per batch is no better than random for small ones)
            options["seed"] = self.seed
        proposer = build_proposer(self.proposer_name, **options)
        if self.space.has_grid:  # read by the proposers that search on the grid
            proposer.snap = self.space.snap
        if self._calibrator is not None:
            from orchestrator.calibration import attach

            attach(self._calibrator, proposer)
        return proposer

    def _build_calibrator(self) -> CalibratorProtocol | None:
        if self.calibrator_name in (None, "none") and not self.calibrator_options:
            return None
        from orchestrator.calibration import build_calibrator

        options = dict(self.calibrator_options)
        if self.calibrator_name == "offline-cv" and not {"model", "model_options", "model_factory"} & set(
            options
        ):
            # the folds refit the run's own model (calibrated-bo.md §1.3), unless the config names a fold
            # model
            options["model"] = self.model_name
            options["model_options"] = {"tau": self.model_tau, **self.model_options}
        return build_calibrator(self.calibrator_name, **options)

    def check_options(self) -> None:
        """Build the model, the calibrator and the proposer once and check that they work together: a bad
        option or combination is a `ConfigError` naming its config section now, not an error at the first
        model batch (after the initial design was spent). The built objects are dropped."""
        from orchestrator.models import MODELS

        if self.model_name not in MODELS:
            raise ConfigError(f"`model.type` must be one of {sorted(MODELS)}; got {self.model_name!r}")
        try:
            model = self._build_model()
        except ConfigError as exc:  # the component names the option; the config key says where it is
            raise ConfigError(_under("model.options", exc)) from None
        try:
            proposer = self._build_proposer()
        except UnsupportedError as exc:  # `attach`: no hook for this calibrator, or options it would not read
            msg = str(exc).splitlines()[0]
            if msg.startswith("`calibrator.options`"):
                raise ConfigError(f"{msg} (`proposer.type` {self.proposer_name!r})") from None
            raise ConfigError(f"`calibrator.type` {self.calibrator_name!r} does not work with "
                              f"`proposer.type` {self.proposer_name!r}: {msg}") from None
        except ConfigError as exc:
            raise ConfigError(_under("proposer.options", exc)) from None
        if proposer.requires_model:
            try:
                proposer.check_model(model)
            except (UnsupportedError, ConfigError) as exc:
                calibrator = ("" if self.calibrator_name in (None, "none")
                              else f" and `calibrator.type` {self.calibrator_name!r}")
                raise ConfigError(
                    f"`proposer.type` {self.proposer_name!r} with `model.type` "
                    f"{self.model_name!r}{calibrator}"
                    f": {str(exc).splitlines()[0]}"
                ) from None

    def prepare(self) -> None:
        """Import the model's and proposer's code and build the proposer now rather than at the first fit.

        The central actor calls this when it is created, so heavy imports (GPyTorch, BoTorch) do not compete
        with its dispatch loop for the interpreter while the first evaluations start.
        """
        self._build_model()
        if self._proposer is None:
            self._proposer = self._build_proposer()

    def needs_model(self) -> bool:
        """Whether the proposer reads a surrogate (Sobol and random search do not: no fit is ever made for
        them)."""
        if self._proposer is None:
            self._proposer = self._build_proposer()
        return bool(self._proposer.requires_model)
