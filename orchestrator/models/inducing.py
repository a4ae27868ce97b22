"""K-means inducing-point selection for the two-latent SVGPs (quantile-expectile-bo.md §1.4).

The inducing inputs Z are the k-means centroids of the current query points, recomputed at every model
update and never trained (Picheny et al. 2022, following Vakili et al. 2021). The procedure follows
trieste's `KMeansInducingPointSelector`: shuffle, divide by the per-dimension std, run
`scipy.cluster.vq.kmeans` with min(m, n) centroids, rescale, and fill any missing centroids with uniform
points in the bounding box of the data.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.cluster.vq import kmeans
from torch import Tensor

from orchestrator.checks import check_int
from orchestrator.errors import InputDataError

__all__ = ["KMeansInducingPointSelector"]

#: per-dimension std below which a dimension is not rescaled (a constant column), spec §1.4
_MIN_STD = 1e-12


class KMeansInducingPointSelector:
    """Choose `m` inducing inputs as k-means centroids of the data (spec §1.4).

    Args:
        num_inducing: the number `m` of inducing inputs (at most `n` distinct centroids come from k-means;
            the rest are uniform points in the bounding box of the data).
        kmeans_iter: number of k-means restarts passed to `scipy.cluster.vq.kmeans` (`iter`).
        thresh: k-means convergence threshold (`thresh`).
    """

    def __init__(self, num_inducing: int, kmeans_iter: int = 1, thresh: float = 1e-5) -> None:
        self.num_inducing = check_int("`num_inducing`", num_inducing, 1, must="a positive integer")
        self.kmeans_iter = check_int("`kmeans_iter`", kmeans_iter, 1, must="a positive integer")
        self.thresh = float(thresh)

    def __call__(
        self, X: Tensor, generator: torch.Generator | None = None, init: Tensor | None = None
    ) -> Tensor:
        """Return `m x d` inducing inputs for the `n x d` data `X` (same dtype and device as `X`).

        Args:
            X: `n x d` inputs (n >= 1).
            generator: optional torch generator that makes the shuffle, the k-means seeds and the
                uniform fill reproducible.
            init: optional `m x d` initial centroids (e.g. the previous Z at a warm refit): k-means then
                starts from them instead of random data points and converges in a few iterations. Used
                only when it has `m` rows and `m <= n`.
        """
        if X.ndim != 2 or X.shape[0] < 1:
            raise InputDataError(f"X must be a non-empty `n x d` tensor; got shape {tuple(X.shape)}")
        n, d = X.shape
        m = self.num_inducing
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator).item())
        rng = np.random.default_rng(seed)
        data = X.detach().cpu().numpy().astype(np.float64)
        data = data[rng.permutation(n)]
        std = data.std(axis=0)
        std = np.where(std > _MIN_STD, std, 1.0)
        k = min(m, n)
        if init is not None and init.shape == (m, d) and m <= n:
            guess = init.detach().cpu().numpy().astype(np.float64) / std
            centroids, _ = kmeans(data / std, guess, thresh=self.thresh)
        else:
            centroids, _ = kmeans(data / std, k, iter=self.kmeans_iter, thresh=self.thresh, seed=rng)
        centroids = centroids * std
        if centroids.shape[0] < m:
            lo, hi = data.min(axis=0), data.max(axis=0)
            fill = lo + (hi - lo) * rng.random((m - centroids.shape[0], d))
            centroids = np.concatenate([centroids, fill], axis=0)
        return torch.as_tensor(centroids, dtype=X.dtype, device=X.device)
