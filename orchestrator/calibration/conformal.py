"""Full conformal Bayes prediction sets of paper 004 (Stanton, Maddox, Wilson), conformal-bo.md §1.2–1.8.

For a query x and candidate labels y^_j drawn from the GP predictive, the exact GP is conditioned on (x, y^_j)
and every point of D^ = D + (x, y^_j) is scored by its posterior predictive log-density
s_i = log N(y_i; m_i, v_i) (§1.5). With fixed hyperparameters this conditioning is closed form: for
A = (K^ + sigma^2 I)^-1 over the n + 1 points, the residuals are r = sigma^2 A (y^ - c) (linear in y^_j) and
v_i = sigma^2 (1 + [K^ A]_ii), the stable form of checklist item 9. Masks (Algorithm 1, soft with temperature
tau): h_i = sigmoid((s_n - s_i)/tau), h_n = 1, accept y^_j iff h^T w > alpha, w the importance weights
(1/(n+1) for exchangeable data; w_i ∝ r(x_i) with a density-ratio classifier for the query shift, §1.6).
The conformal posterior (§1.7) mixes (1 - alpha) x uniform-on-C_alpha (self-normalised weights m_j / p(y^_j))
with alpha x predictive-off-C_alpha ((1 - m_j)); a utility is averaged over the conditioned posteriors
f | D^_j ~ N(a y^_j + b, s^2) in closed form (EI) rather than with one f-sample per model as in the code.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from orchestrator.calibration.base import Calibrator
from orchestrator.calibration.locbo import denoise_coefficients
from orchestrator.calibration.options import check_option
from orchestrator.checks import check_bool, check_float, check_int
from orchestrator.errors import InputDataError, UnsupportedError

__all__ = [
    "ConformalCalibrator",
    "DensityRatioEstimator",
    "ExactGPParts",
    "candidate_labels",
    "conformal_masks",
    "conformal_interval",
    "conformal_weights",
]

#: floor on the normalisers of the mixture weights (conformal-bo.md §1.7, code: 1e-6)
WEIGHT_FLOOR = 1e-6
#: floor on the density ratio r(x) (§1.6)
RATIO_FLOOR = 1e-6


def _matern52(A: Tensor, B: Tensor, lengthscale: Tensor, outputscale: Tensor) -> Tensor:
    d2 = (((A.unsqueeze(-2) - B.unsqueeze(-3)) / lengthscale) ** 2).sum(-1)
    r = math.sqrt(5.0) * d2.clamp_min(1e-30).sqrt()
    return outputscale * (1 + r + r * r / 3) * torch.exp(-r)


@dataclass
class ExactGPParts:
    """What full conformal Bayes needs of an exact GP with fixed hyperparameters (standardized units).

    Attributes:
        X: `n x d` training inputs; y: `n` training targets; mean: constant prior mean;
        kernel: callable (`... x a x d`, `... x b x d`) -> `... x a x b` prior covariance; noise_var: sigma^2.
    """

    X: Tensor
    y: Tensor
    mean: float
    kernel: Callable[[Tensor, Tensor], Tensor]
    noise_var: float

    @classmethod
    def from_model(
        cls, model: Any, X_train: Tensor | None = None, Y_train: Tensor | None = None
    ) -> ExactGPParts:
        """From a BoTorch `SingleTaskGP` (its train data, covar, mean, noise) or a qbatch `Surrogate` exact
        GP.

        For a `Surrogate`, the Matérn-5/2 parts come from `sparse_parts("f")` (Z = training inputs) and the
        noise from `posterior_g`; targets are `Y_train` standardized with `outcome_transform` (or
        `model.train_targets`).
        """
        from orchestrator.models.base import Surrogate

        # `model` is the caller's: a qbatch surrogate, which may wrap a BoTorch GP of its own
        # (`ExactGP.model`), or a BoTorch model; what each one has is read where it may lack it
        inner = getattr(model, "model", None)
        if (
            isinstance(model, Surrogate)
            and X_train is None
            and Y_train is None
            and hasattr(inner, "train_inputs")
        ):
            if model.family != "gaussian" or model.num_outputs_latent != 1:
                raise UnsupportedError("conformal sets need an exact Gaussian GP; got family "
                                       f"{model.family!r}")
            model = inner  # the exact GP's own BoTorch model, in its standardized units
        if isinstance(model, Surrogate):
            if model.family != "gaussian" or model.num_outputs_latent != 1:
                raise UnsupportedError("conformal sets need an exact Gaussian GP; got family "
                                       f"{model.family!r}")
            parts = model.sparse_parts("f")
            X = parts.Z if X_train is None else X_train.to(torch.float64)
            loc, scale = model.outcome_transform
            if Y_train is None:
                targets = getattr(model, "train_targets", None)
                if targets is None:
                    raise InputDataError("Y_train is required for a surrogate that does not expose "
                                         "train_targets")
                y = torch.as_tensor(
                    targets[0] if isinstance(targets, tuple) else targets, dtype=torch.float64
                )
                y = (y - loc) / scale
            else:
                y = (Y_train.to(torch.float64).reshape(-1) - loc) / scale
            mu_g, _ = model.posterior_g(X[:1], full_cov=False)
            noise = float(torch.exp(2 * mu_g.reshape(-1)[0]))
            ls, os_ = (
                parts.lengthscale.detach().to(torch.float64),
                parts.outputscale.detach().to(torch.float64),
            )
            return cls(
                X.detach(),
                y.detach(),
                float(parts.constant_mean),
                lambda A, B: _matern52(A, B, ls, os_),
                noise,
            )
        # BoTorch SingleTaskGP, in its model space: its posterior must be in the same units (no outcome
        # transform)
        if getattr(model, "outcome_transform", None) is not None:
            raise UnsupportedError(
                "conformal sets work in the GP's own units: build the SingleTaskGP with "
                "outcome_transform=None (standardize y yourself); with a transform its posterior and its "
                "training targets differ in units"
            )
        X = model.train_inputs[0].detach()
        y = model.train_targets.detach().reshape(-1)
        covar = model.covar_module

        def kernel(A: Tensor, B: Tensor) -> Tensor:
            return covar(A, B).to_dense()

        return cls(
            X,
            y,
            float(model.mean_module.constant.detach()),
            kernel,
            float(model.likelihood.noise.detach().reshape(-1)[0]),
        )

    def augmented(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Quantities of D^ = D + (x, .) for `b x d` queries.

        Returns:
            (base_resid `b x (n+1)`, slope `b x (n+1)`, v `b x (n+1)`, pred (mu `b`, var_f `b`)) with residual
            of point i = base_resid_i + slope_i (y^ - mean) and predictive variance v_i under D^.
        """
        n = self.X.shape[0]
        Xa = torch.cat([self.X.expand(x.shape[0], n, -1), x.unsqueeze(-2)], dim=-2)  # b x (n+1) x d
        K = self.kernel(Xa, Xa)
        Kn = K + self.noise_var * torch.eye(n + 1, dtype=K.dtype, device=K.device)
        L = torch.linalg.cholesky(Kn)
        A = torch.cholesky_inverse(L)
        pad = torch.zeros(x.shape[0], 1, dtype=K.dtype, device=K.device)
        yc = torch.cat([(self.y - self.mean).expand(x.shape[0], n), pad], -1)
        base = self.noise_var * (A @ yc.unsqueeze(-1)).squeeze(-1)
        slope = self.noise_var * A[..., :, n]
        S_diag = (K * A).sum(-1)  # diag(K A) (A symmetric)
        v = self.noise_var * (1 + S_diag)
        # predictive of f(x) given D only
        Kd = K[..., :n, :n] + self.noise_var * torch.eye(n, dtype=K.dtype, device=K.device)
        Ld = torch.linalg.cholesky(Kd)
        kx = K[..., :n, n].unsqueeze(-1)
        sol = torch.cholesky_solve(kx, Ld)
        mu = self.mean + (sol.squeeze(-1) * (self.y - self.mean)).sum(-1)
        var_f = (K[..., n, n] - (kx * sol).sum((-1, -2))).clamp_min(1e-12)
        return base, slope, v, (mu, var_f)


def candidate_labels(mu: Tensor, var_y: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """`k` candidate labels per query from its predictive N(mu, var_y) on a fixed stratified grid
    y^_j = mu + sd Phi^-1((j - 1/2)/k) (deterministic, so the acquisition surface is smooth), and their
    log-densities.

    Returns: (`b x k` labels, `b x k` log p(y^_j | x, D)).
    """
    p = (torch.arange(k, dtype=mu.dtype, device=mu.device) + 0.5) / k
    z = torch.special.ndtri(p)
    sd = var_y.clamp_min(1e-18).sqrt().unsqueeze(-1)
    yh = mu.unsqueeze(-1) + sd * z
    logp = -0.5 * z * z - torch.log(sd) - 0.5 * math.log(2 * math.pi)
    return yh, logp


def conformal_masks(
    parts: ExactGPParts, x: Tensor, labels: Tensor, weights: Tensor, alpha: float, temp: float | None
) -> Tensor:
    """Acceptance of each candidate label (Algorithm 1): `b x k` in [0, 1] (hard 0/1 when `temp` is None).

    Args:
        x: `b x d` queries; labels: `b x k`; weights: `b x (n+1)` normalised importance weights (last =
            query).
    """
    base, slope, v, _ = parts.augmented(x)
    yc = (labels - parts.mean).unsqueeze(-1)  # b x k x 1
    resid = base.unsqueeze(-2) + slope.unsqueeze(-2) * yc  # b x k x (n+1)
    scores = -0.5 * torch.log(2 * math.pi * v).unsqueeze(-2) - 0.5 * resid * resid / v.unsqueeze(-2)
    s_n = scores[..., -1:]
    if temp is None:
        h = (scores <= s_n).to(scores.dtype)
    else:
        h = torch.sigmoid((s_n - scores) / temp)
    h = torch.cat([h[..., :-1], torch.ones_like(h[..., -1:])], -1)  # h_n = 1
    mass = (h * weights.unsqueeze(-2)).sum(-1)
    if temp is None:
        return (mass > alpha).to(scores.dtype)
    return torch.sigmoid((mass - alpha) / temp)


def conformal_interval(
    parts: ExactGPParts, x: Tensor, alpha: float, k: int = 256, weights: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Hard conformal set of each query on a `k`-label grid over mu -+ 6 sd, as [lowest, highest] accepted
    label (NaN where nothing is accepted; -inf / +inf where a grid end is accepted, since the set may reach
    past it: the grid is the GP's own predictive, too narrow when the GP is over-confident). Returns (`b`,
    `b`)."""
    _, _, _, (mu, var_f) = parts.augmented(x)
    sd = (var_f + parts.noise_var).sqrt()
    grid = mu.unsqueeze(-1) + sd.unsqueeze(-1) * torch.linspace(-6, 6, k, dtype=mu.dtype, device=mu.device)
    w = (
        weights
        if weights is not None
        else torch.full((x.shape[0], parts.X.shape[0] + 1), 1.0 / (parts.X.shape[0] + 1), dtype=mu.dtype,
                        device=mu.device)
    )
    m = conformal_masks(parts, x, grid, w, alpha, None) > 0.5
    lo = torch.where(m, grid, torch.full_like(grid, math.inf)).amin(-1)
    hi = torch.where(m, grid, torch.full_like(grid, -math.inf)).amax(-1)
    lo = torch.where(m[..., 0], torch.full_like(lo, -math.inf), lo)
    hi = torch.where(m[..., -1], torch.full_like(hi, math.inf), hi)
    nan = torch.full_like(lo, math.nan)
    return torch.where(m.any(-1), lo, nan), torch.where(m.any(-1), hi, nan)


def conformal_weights(m: Tensor, logp: Tensor, alpha: float, optimistic: Tensor | None = None) -> Tensor:
    """Mixture weights omega_j = (1 - alpha) omega^in_j + alpha omega^out_j over `b x k` candidates (§1.7).

    omega^in ∝ m_j o_j / p(y^_j) (uniform on C_alpha by self-normalised importance weighting), omega^out ∝
    (1 - m_j) o_j. When the candidates hold no label outside (or none inside) the set, the other part gets all
    the mass, so the weights always sum to one (the code's 1e-6 floor would leave mass 1 - alpha instead).
    """
    o = torch.ones_like(m) if optimistic is None else optimistic
    w_in = m * o * torch.exp(-(logp - logp.amax(-1, keepdim=True)))
    w_out = (1 - m) * o
    z_in, z_out = w_in.sum(-1, keepdim=True), w_out.sum(-1, keepdim=True)
    w_in = w_in / z_in.clamp_min(WEIGHT_FLOOR)
    w_out = w_out / z_out.clamp_min(WEIGHT_FLOOR)
    a_in = torch.where(z_out > WEIGHT_FLOOR, torch.full_like(z_in, 1 - alpha), torch.ones_like(z_in))
    a_in = torch.where(z_in > WEIGHT_FLOOR, a_in, torch.zeros_like(z_in))
    return a_in * w_in + (1 - a_in) * w_out


def conditioned_f(parts: ExactGPParts, mu: Tensor, var_f: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """f(x) | D + (x, y^_j) ~ N(a y^_j + (1 - a) mu, s^2): (`b x k` means, `b x 1` std)."""
    a, s2 = denoise_coefficients(var_f, torch.as_tensor(parts.noise_var, dtype=var_f.dtype))
    return a.unsqueeze(-1) * labels + ((1 - a) * mu).unsqueeze(-1), s2.clamp_min(1e-18).sqrt().unsqueeze(-1)


class DensityRatioEstimator(torch.nn.Module):
    """Classifier-based density ratio r(x) = p_query(x)/p_train(x) (conformal-bo.md §1.6): MLP d-64-64-1, last
    layer zero-initialised so that r = 1 (uniform weights) before training; r = exp(logit) clamped >=
    RATIO_FLOOR.
    """

    def __init__(self, d: int, hidden: int = 64, seed: int = 0) -> None:
        super().__init__()
        # the hidden layers' random initialization is drawn from `seed`, never from (or into) the global
        # generator: proposals are reproducible from the run's seed and the caller's random state is untouched
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.net = torch.nn.Sequential(
                torch.nn.Linear(d, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                torch.nn.Linear(hidden, 1),
            ).to(torch.float64)
        torch.nn.init.zeros_(self.net[-1].weight)
        torch.nn.init.zeros_(self.net[-1].bias)

    def fit(
        self, X_train: Tensor, X_query: Tensor, steps: int = 256, lr: float = 1e-3, weight_decay: float = 1e-4
    ) -> float:
        """Full-batch Adam on BCE (train = 0, query = 1, pos_weight = #neg/#pos); returns the final loss.

        Deterministic given the initialization (no sampling).
        """
        X = torch.cat([X_train, X_query]).to(torch.float64)
        self.to(X.device)  # the classifier trains where its data are
        t = torch.cat([torch.zeros(X_train.shape[0]), torch.ones(X_query.shape[0])]).to(X)
        pos_weight = torch.tensor(X_train.shape[0] / max(X_query.shape[0], 1), dtype=X.dtype, device=X.device)
        opt = torch.optim.Adam(self.parameters(), lr=lr, weight_decay=weight_decay)
        loss = torch.tensor(0.0)
        for _ in range(steps):
            opt.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                self.net(X).squeeze(-1), t, pos_weight=pos_weight
            )
            loss.backward()
            opt.step()
        return float(loss.detach())

    def forward(self, X: Tensor) -> Tensor:
        """r(x) for `... x d` -> `...`."""
        return torch.exp(self.net(X.to(torch.float64)).squeeze(-1)).clamp_min(RATIO_FLOOR)


class ConformalCalibrator(Calibrator):
    """`calibrator.type: conformal`: settings of the conformal-set acquisition (paper 004) plus online
    bookkeeping.

    Full conformal sets are recomputed from the data at every proposal (they are not an online map), so this
    calibrator's level map is the identity; what it holds is the miscoverage schedule alpha(n) (fixed `alpha`,
    or n^-alpha_power, floored at `alpha_min`), the mask temperature, the number of candidate labels, and
    whether the query shift is corrected with a density-ratio classifier. Results feed its spread tracker.

    Args:
        alpha: fixed miscoverage in (0, 1], or None for the schedule n^-alpha_power (paper: 1/sqrt(n)).
        alpha_power: exponent of the schedule (> 0).
        alpha_min: floor of the schedule in (0, 1).
        temp: mask temperature tau > 0 (code default for continuous BO: 3e-2).
        num_labels: candidate labels k per query (code: 64).
        density_ratio: correct for the query shift (§1.6) when True; exchangeable weights 1/(n+1) otherwise.
        ratio_steps: Adam steps of the density-ratio classifier per proposal.
        spread: optional `SpreadTracker`.
    """

    name = "conformal"
    #: its settings act only inside an acquisition (`proposer.type: calibrated`); a Thompson or Q-GIBBON
    #: proposer would use its spread tracker alone, and every one of these options would change nothing
    acquisition_only = True

    def __init__(
        self,
        alpha: float | None = None,
        alpha_power: float = 0.5,
        alpha_min: float = 0.05,
        temp: float = 3e-2,
        num_labels: int = 64,
        density_ratio: bool = True,
        ratio_steps: int = 128,
        spread: Any = None,
    ) -> None:
        super().__init__(spread)
        alpha = check_float("`calibrator.options.alpha`", alpha, 0.0, 1.0, lo_open=True, optional=True,
                            must="None or in (0, 1]")
        alpha_power = check_option("alpha_power", alpha_power, lambda v: v > 0)
        alpha_min = check_option("alpha_min", alpha_min, lambda v: 0 < v < 1)
        temp = check_option("temp", temp, lambda v: v > 0)
        num_labels = check_int("`calibrator.options.num_labels`", num_labels, 1)
        ratio_steps = check_int("`calibrator.options.ratio_steps`", ratio_steps, 1)
        density_ratio = check_bool("`calibrator.options.density_ratio`", density_ratio)
        self.alpha_fixed = None if alpha is None else float(alpha)
        self.alpha_power, self.alpha_min, self.temp = float(alpha_power), float(alpha_min), float(temp)
        self.num_labels, self.density_ratio, self.ratio_steps = num_labels, bool(density_ratio), ratio_steps

    def alpha(self, n: int) -> float:
        """Miscoverage for `n` observations: the fixed alpha, or max(n^-alpha_power, alpha_min)."""
        if self.alpha_fixed is not None:
            return self.alpha_fixed
        return min(1.0, max(max(n, 1) ** (-self.alpha_power), self.alpha_min))

    option_keys = ("alpha_fixed",)

    def _get_state(self) -> dict[str, Any]:
        return {"alpha_fixed": -1.0 if self.alpha_fixed is None else self.alpha_fixed}

    def _set_state(self, state: dict[str, Any]) -> None:
        a = float(state["alpha_fixed"])
        self.alpha_fixed = None if a < 0 else a
