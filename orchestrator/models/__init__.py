"""GPyTorch surrogates of qbatch: quantile / expectile / heteroscedastic SVGPs and the exact GP.

quantile-expectile-bo.md §1 (the two-latent SVGPs, their likelihoods and inducing points) and the exact-GP
baseline; every model implements `orchestrator.models.base.Surrogate`. `build_model(name, **options)` builds
one by its config name ("quantile", "expectile", "heteroscedastic", "exact-gp", "gpr-replicates"). Model
classes are imported lazily, so importing this package does not import GPyTorch.
"""

from __future__ import annotations

import importlib
from typing import Any

from orchestrator.errors import ConfigError
from orchestrator.models.base import FAMILIES, TKWARGS, SparseLatentParts, Surrogate, check_training_data

__all__ = [
    "FAMILIES", "MODELS", "TKWARGS", "AsymmetricGaussianLikelihood", "AsymmetricLaplaceLikelihood", "ExactGP",
    "ExpectileSVGP", "HeteroscedasticGaussianLikelihood", "HeteroscedasticSVGP",
    "KMeansInducingPointSelector", "QuantileSVGP", "SparseLatentParts", "Surrogate", "build_model",
    "check_training_data"
]

#: config name -> (module, class)
MODELS: dict[str, tuple[str, str]] = {
    "quantile": ("orchestrator.models.quantile_svgp", "QuantileSVGP"),
    "expectile": ("orchestrator.models.expectile_svgp", "ExpectileSVGP"),
    "heteroscedastic": ("orchestrator.models.het_svgp", "HeteroscedasticSVGP"),
    "exact-gp": ("orchestrator.models.exact_gp", "ExactGP"),
    "gpr-replicates": ("orchestrator.models.gpr_replicates", "ReplicateQuantileGP"),
}

_LAZY: dict[str, str] = {
    "QuantileSVGP": "orchestrator.models.quantile_svgp",
    "ExpectileSVGP": "orchestrator.models.expectile_svgp",
    "HeteroscedasticSVGP": "orchestrator.models.het_svgp",
    "ExactGP": "orchestrator.models.exact_gp",
    "KMeansInducingPointSelector": "orchestrator.models.inducing",
    "AsymmetricLaplaceLikelihood": "orchestrator.models.likelihoods",
    "AsymmetricGaussianLikelihood": "orchestrator.models.likelihoods",
    "HeteroscedasticGaussianLikelihood": "orchestrator.models.likelihoods",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def valid_options_note(cls: type, exclude: tuple[str, ...] = ("tau",)) -> str:
    """"; valid options: [...]" from `cls`'s constructor signature, less `exclude` (tau: the config's
    top-level key), or "" when it takes arbitrary keywords."""
    import inspect

    params = inspect.signature(cls.__init__).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return ""
    names = [p.name for p in params if p.name not in ("self", *exclude) and p.kind is not p.VAR_POSITIONAL]
    return f"; valid options: {sorted(names)}"


def build_model(name: str, **options: Any) -> Surrogate:
    """Build the surrogate called `name` ("quantile", "expectile", "heteroscedastic", "exact-gp",
    "gpr-replicates").

    Args:
        name: the model's config name.
        **options: constructor options, e.g. `tau=0.1, num_inducing=256` (see `SVGPOptions` for the SVGPs
            and `ExactGP` for the exact GP; `tau` is the config's top-level key, passed here by the
            optimizer). Unknown options raise `ConfigError` naming them.

    Raises:
        ConfigError: unknown name (the message lists the valid ones) or a bad option.
    """
    if not isinstance(name, str) or name not in MODELS:  # a list would be "unhashable type"
        raise ConfigError(f"unknown model {name!r}; valid models: {sorted(MODELS)}")
    module, attr = MODELS[name]
    cls = getattr(importlib.import_module(module), attr)
    try:
        return cls(**options)
    except TypeError as exc:  # an unknown option
        raise ConfigError(f"bad option for model {name!r}: {exc}{valid_options_note(cls)}") from None
