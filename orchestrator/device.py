"""The torch device of the model stack: the config's `device` key ("cpu", "cuda", "cuda:N", "auto").

The surrogates, proposers and calibrators take their dtype and device from one place, `models.base.TKWARGS`
(STYLE.md §4.7): float64 always, since the GP algebra (Cholesky factors of kernel matrices near singular,
the asymmetric-Laplace sites) needs it, and the device that `models.base.use_device` sets from a name resolved
here. The device is a setting of the process that holds the model, the central actor's or a library user's, as
`torch.set_default_device` is: `AskTellOptimizer` sets its own before each fit, proposal, recommendation and
model build, so two optimizers on two devices can share a process (one at a time).

Data crosses at the edges: the optimizer keeps its trials on the CPU, a model moves its inputs to the device
and its states come back to the CPU (checkpoints load anywhere), Sobol draws and seeded generators run on the
CPU and are moved (a seed gives the same candidates on every device), and calibrators learn from forecasts
passed as plain records.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from orchestrator.errors import ConfigError

__all__ = ["DEFAULT_DEVICE", "DEVICE_NAMES", "check_device", "rand", "randn", "resolve_device", "wants_gpu"]

#: the device names a config may give ("cuda:N" too)
DEVICE_NAMES = ("cpu", "cuda", "auto")
#: the default: the path measured by every recorded benchmark, and the one that takes no GPU from evaluations
DEFAULT_DEVICE = "cpu"

_CUDA_INDEX = re.compile(r"cuda:\d+")


def check_device(value: Any, name: str = "`device`") -> str:
    """`value` if it names a device ("cpu", "cuda", "cuda:N", "auto"); else a ConfigError naming `name`."""
    if isinstance(value, str) and (value in DEVICE_NAMES or _CUDA_INDEX.fullmatch(value)):
        return value
    raise ConfigError(f"{name} must be one of {list(DEVICE_NAMES)} or 'cuda:N'; got {value!r}")


def resolve_device(value: Any, name: str = "`device`") -> torch.device:
    """The torch device that `value` names in this process: "auto" is CUDA when torch sees a CUDA device, else
    the CPU.

    Raises:
        ConfigError: `value` names no device, or names a CUDA device that this process does not see.
    """
    spec = check_device(value, name)
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"{name} is {spec!r} but torch sees no CUDA device in this process (torch "
                          f"{torch.__version__}, torch.cuda.is_available() is False); use 'cpu' or 'auto'")
    device = torch.device(spec)
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(f"{name} is {spec!r} but this process sees {torch.cuda.device_count()} CUDA "
                          f"device(s)")
    return device


def wants_gpu(value: Any, node_gpus: float) -> bool:
    """Whether the central actor asks Ray for a GPU of its own: for "cuda" (or "cuda:N") always, for "auto"
    when its node offers one (`node_gpus`, the node's Ray "GPU" resource), for "cpu" never."""
    spec = check_device(value)
    return spec.startswith("cuda") or (spec == "auto" and node_gpus >= 1)


def _on_generator(fn: Any, shape: tuple[int, ...], generator: torch.Generator | None, dtype: torch.dtype,
                  device: torch.device) -> torch.Tensor:
    where = generator.device if generator is not None else device
    return fn(*shape, generator=generator, dtype=dtype, device=where).to(device)


def randn(*shape: int, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float64,
          device: torch.device | str = "cpu") -> torch.Tensor:
    """`torch.randn` on `device` from a generator on any device: drawn where the generator is, then moved, so
    that one seed gives the same draws on every device (a CPU generator cannot draw onto CUDA)."""
    return _on_generator(torch.randn, shape, generator, dtype, torch.device(device))


def rand(*shape: int, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float64,
         device: torch.device | str = "cpu") -> torch.Tensor:
    """`torch.rand` as `randn` draws: where the generator is, then moved to `device`."""
    return _on_generator(torch.rand, shape, generator, dtype, torch.device(device))
