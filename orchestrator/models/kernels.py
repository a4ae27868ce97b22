"""The Matern-5/2 ARD covariance in closed form, batched, as the two-latent GPs and their samplers use it.

quantile-expectile-bo.md §1.3: s^2 (1 + sqrt5 r + 5 r^2 / 3) exp(-sqrt5 r), r the lengthscale-scaled
distance; the same values as GPyTorch's `ScaleKernel(MaternKernel(nu=2.5))` without its module overhead.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["matern52"]

_SQRT5 = math.sqrt(5.0)


def matern52(x1: Tensor, x2: Tensor, lengthscale: Tensor, outputscale: Tensor) -> Tensor:
    """Matern-5/2 ARD covariance s^2 (1 + sqrt5 r + 5 r^2/3) exp(-sqrt5 r) (spec §1.3).

    Args:
        x1: `... x n x d`; x2: `... x p x d`; lengthscale: `... x 1 x d`; outputscale: `...`
            (all broadcast against each other).

    Returns:
        `... x n x p` covariance (same values as GPyTorch's `ScaleKernel(MaternKernel(nu=2.5))`).
    """
    a = x1 / lengthscale
    b = x2 / lengthscale
    r2 = (a * a).sum(-1, keepdim=True) + (b * b).sum(-1).unsqueeze(-2) - 2.0 * a @ b.transpose(-1, -2)
    r = r2.clamp_min(1e-30).sqrt()
    k = (1.0 + _SQRT5 * r + (5.0 / 3.0) * r2.clamp_min(0.0)) * torch.exp(-_SQRT5 * r)
    return outputscale[..., None, None] * k
