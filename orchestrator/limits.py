"""Upper bounds on the sizes a config may ask of a model or a proposer.

Each bound is far above what a run needs and below what allocates gigabytes: a value beyond it is refused when
the config is checked, naming the option, before Ray starts. Without them `num_features: 1e11` passes every
check and fails at the run's first proposal with "DefaultCPUAllocator: can't allocate memory: you tried to
allocate 800000000000 bytes", naming nothing the user has set. The search space's dimension has its own
bound, `objectives.options.MAX_DIM`.
"""

from __future__ import annotations

from orchestrator.errors import ConfigError

__all__ = [
    "MAX_BOOTSTRAP", "MAX_FEATURES", "MAX_GRID", "MAX_INDUCING", "MAX_MAX_SAMPLES", "MAX_MC_SAMPLES",
    "MAX_RAW_SAMPLES", "MAX_RESTARTS", "check_at_most",
]

#: inducing inputs of an SVGP: three m x m float64 matrices of 512 MB each at 8,192 (K_ZZ and the two S)
MAX_INDUCING = 8192
#: random Fourier features of a Thompson path (each of q paths holds its own weights: 4,096 x 100,000 x 8 B =
#: 3 GB)
MAX_FEATURES = 100_000
#: raw candidates scored before a multi-start optimization (10^7 x 16-D float64 = 1.3 GB)
MAX_RAW_SAMPLES = 10_000_000
#: starts of a multi-start optimization, per path for Thompson sampling
MAX_RESTARTS = 10_000
#: random points of Q-GIBBON's max-value grid (each with the posterior's moments, computed against every
#: inducing input)
MAX_GRID = 1_000_000
#: max-value samples g* of Q-GIBBON
MAX_MAX_SAMPLES = 10_000
#: quasi-Monte-Carlo samples of qLogNEI's joint acquisition
MAX_MC_SAMPLES = 100_000
#: bootstrap resamples of GPR-replicates' noise estimate at each distinct input
MAX_BOOTSTRAP = 100_000


def check_at_most(name: str, value: int | None, high: int) -> int | None:
    """`value` (an int its owner has checked, or None) unless it exceeds `high`: then a `ConfigError` naming
    `name` (as the owner writes its options, e.g. "qgibbon.grid_size"), the bound and the value."""
    if value is not None and value > high:
        raise ConfigError(f"{name} must be at most {high}; got {value!r}")
    return value
