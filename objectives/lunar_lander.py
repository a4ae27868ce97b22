"""Lunar lander: tune 6 gains of gymnasium's heuristic LunarLander controller; one episode's reward.

Implements quantile-expectile-bo.md §4.2 (paper 003, "heuristic_Controller_6d" of its public code). The
controller is gymnasium's own `heuristic` (gymnasium/envs/box2d/lunar_lander.py) with six of its constants
made parameters ``w`` in [0, 1.2]^6:

    angle_targ = clip(0.5 s[0] + 1.0 s[2], -0.4, 0.4);   hover_targ = 0.55 |s[0]|
    angle_todo = (angle_targ - s[4]) * w0 - s[5] * w1      (gymnasium: 0.5, 1.0)
    hover_todo = (hover_targ - s[1]) * w2 - s[3] * w3      (gymnasium: 0.5, 0.5)
    if a leg touches:  angle_todo = w4,  hover_todo = -s[3] * w5   (gymnasium: 0, 0.5)
    action = main engine if hover_todo > |angle_todo| and hover_todo > 0.05,
             else left/right engine if angle_todo < -0.05 / > 0.05, else nothing.

So ``w = (0.5, 1.0, 0.5, 0.5, 0.0, 0.5)`` (`GYMNASIUM_HEURISTIC`) reproduces gymnasium's heuristic exactly.
One evaluation is one episode of ``LunarLander-v3`` (the paper's v2 no longer exists in gymnasium 1.x), reset
with the evaluation's seed; ``env_id="gym:LunarLander-v2"`` flies the paper's v2 from the legacy ``gym``
package (0.26, ``pip install gym==0.26.2``) instead, to check that the version does not matter. Step limit
1000. A11: an episode still flying at the limit gets a penalty of 100 *subtracted* (the pubcode's
``total -= timeout_reward`` with ``timeout_reward = -100`` adds 100, which is read as a sign bug: a hovering
lander must not be rewarded; as read from the public code only, its branch ``steps > steps_limit`` is never
reached, since gym's ``LunarLander-v2`` ends the episode at 1000 steps first, so it applies no penalty at
all: ``timeout_penalty=0``). The reward is returned as is (not /300).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from objectives.base import EvalResult, Objective, ObjectiveError, Resources, check_params
from objectives.options import check_float, check_int, check_str

__all__ = ["GYMNASIUM_HEURISTIC", "LunarLander", "heuristic_controller_6d"]

#: the six gains that reproduce gymnasium's `heuristic`
GYMNASIUM_HEURISTIC: tuple[float, ...] = (0.5, 1.0, 0.5, 0.5, 0.0, 0.5)
#: `env_id` prefix that selects the legacy ``gym`` package instead of gymnasium
LEGACY_PREFIX = "gym:"
_NAMES = (
    "angle_gain",
    "angular_speed_gain",
    "hover_gain",
    "vertical_speed_gain",
    "contact_angle",
    "contact_damping",
)


def heuristic_controller_6d(s: Sequence[float], w: Sequence[float]) -> int:
    """Discrete action of the 6-gain heuristic controller (see module docstring) for state `s`."""
    angle_targ = min(max(s[0] * 0.5 + s[2] * 1.0, -0.4), 0.4)
    hover_targ = 0.55 * abs(s[0])
    angle_todo = (angle_targ - s[4]) * w[0] - s[5] * w[1]
    hover_todo = (hover_targ - s[1]) * w[2] - s[3] * w[3]
    if s[6] or s[7]:
        angle_todo = w[4]
        hover_todo = -s[3] * w[5]
    if hover_todo > abs(angle_todo) and hover_todo > 0.05:
        return 2
    if angle_todo < -0.05:
        return 3
    if angle_todo > 0.05:
        return 1
    return 0


def _missing_dependency(exc: BaseException | None) -> bool:
    """Whether `exc` says a package the environment needs is not installed (gym's DependencyNotInstalled)."""
    return isinstance(exc, ImportError) or type(exc).__name__ == "DependencyNotInstalled"


class LunarLander(Objective):
    """Reward of one LunarLander episode flown by the 6-gain heuristic controller (maximize).

    Parameters are the six gains, named ``angle_gain``, ``angular_speed_gain``, ``hover_gain``,
    ``vertical_speed_gain``, ``contact_angle``, ``contact_damping`` (w0..w5 of the pubcode), each in [0, 1.2].
    The evaluation's seed seeds ``env.reset``, so the same seed and gains give the same episode.

    Args:
        steps_limit: maximum number of steps of an episode (1000 in the paper).
        timeout_penalty: subtracted from the reward of an episode that reaches the limit (A11; 100).
        env_id: gymnasium environment id, or ``"gym:<id>"`` for an environment of the legacy ``gym`` package
            (0.26 API: ``reset(seed=...)`` and five-valued ``step``), e.g. ``"gym:LunarLander-v2"``.
        upper: upper bound of every gain (1.2 in the pubcode).
    """

    name = "lunar-lander"
    direction = "maximize"
    noisy = True
    resources = Resources(num_cpus=1.0)

    def __init__(
        self,
        steps_limit: int = 1000,
        timeout_penalty: float = 100.0,
        env_id: str = "LunarLander-v3",
        upper: float = 1.2,
    ) -> None:
        self.steps_limit = check_int("steps_limit", steps_limit, 1)
        self.timeout_penalty = check_float("timeout_penalty", timeout_penalty)
        upper = check_float("upper", upper, 0.0, low_open=True)
        self.env_id = check_str("env_id", env_id)
        self._env: Any = None
        self._check_env_id()  # an unknown id fails here, not as every evaluation of the run
        self.space = {n: {"type": "float", "low": 0.0, "high": float(upper), "log": False} for n in _NAMES}

    def __getstate__(self) -> dict[str, Any]:
        # the Box2D world does not pickle; a copy (e.g. on a Ray worker) makes its own
        state = self.__dict__.copy()
        state["_env"] = None
        return state

    def _package(self) -> tuple[Any, str]:
        """The module (gymnasium, or gym for a ``gym:`` id) and the bare id `env_id` names."""
        legacy = self.env_id.startswith(LEGACY_PREFIX)
        package, env_id = ("gym", self.env_id[len(LEGACY_PREFIX):]) if legacy else ("gymnasium", self.env_id)
        try:
            return importlib.import_module(package), env_id
        except ImportError as exc:
            hint = "pip install gym==0.26.2" if legacy else "pip install 'qbatch[lander]'"
            raise ObjectiveError(f"option 'env_id'={self.env_id!r} needs the {package!r} package: "
                                 f"{hint}") from exc

    def _check_env_id(self) -> None:
        """Raise `ObjectiveError` naming `env_id` when its package is missing or does not register the id."""
        gym, env_id = self._package()
        try:
            gym.spec(env_id)
        except Exception as exc:  # gymnasium.error.NameNotFound, VersionNotFound, ...
            raise ObjectiveError(
                f"option 'env_id'={self.env_id!r} is not an environment of {gym.__name__!r}: {exc}"
            ) from None
        # the controller reads LunarLander's 8-value state and fires one of its 4 discrete engines: another
        # environment (LunarLanderContinuous, CartPole) would fail every episode with a bare IndexError.
        # `make_env` checks that wherever the environment is made; where a dependency is missing here (Box2D
        # on the node that starts the run, not on the worker nodes), each evaluation makes it, checks it and
        # says what is wrong
        try:
            self.make_env()
        except ObjectiveError as exc:
            if not _missing_dependency(exc.__cause__):
                raise

    def make_env(self) -> Any:
        """The (cached) environment `env_id` names, made on first use; raises `ObjectiveError` naming `env_id`
        when its package is missing or the id is unknown (call it to check an `env_id` before flying)."""
        if self._env is None:
            gym, env_id = self._package()
            legacy = gym.__name__ == "gym"
            # gym 0.26's passive checker calls numpy aliases that numpy 2 removed; the episode loop checks
            # itself
            options = {"disable_env_checker": True} if legacy else {}
            try:
                env = gym.make(env_id, max_episode_steps=self.steps_limit, **options)
            except Exception as exc:
                raise ObjectiveError(f"cannot make {gym.__name__} environment env_id={self.env_id!r}: "
                                     f"{exc}") from exc
            obs, act = env.observation_space, env.action_space
            if tuple(getattr(obs, "shape", ()) or ()) != (8,) or getattr(act, "n", None) != 4:
                env.close()
                raise ObjectiveError(
                    f"option 'env_id'={self.env_id!r} is not a LunarLander with discrete engines: the "
                    "heuristic controller needs an 8-value observation and 4 discrete actions; got "
                    f"observations of shape {getattr(obs, 'shape', None)} and actions {type(act).__name__}"
                    f"({getattr(act, 'n', None) or getattr(act, 'shape', None)})")
            self._env = env
        return self._env

    def params_to_gains(self, params: Mapping[str, Any]) -> np.ndarray:
        """Validate `params` and return the six gains ``w`` in pubcode order."""
        check_params(self.space, params)
        return np.array([float(params[n]) for n in _NAMES], dtype=np.float64)

    def gains_to_params(self, w: Sequence[float]) -> dict[str, float]:
        """The parameter dict of six gains in pubcode order."""
        if len(w) != 6:
            raise ObjectiveError(f"expected 6 gains; got {len(w)}")
        return {n: float(v) for n, v in zip(_NAMES, w)}

    def episode(self, w: Sequence[float], seed: int) -> tuple[float, int, bool]:
        """Fly one episode with gains `w` from ``env.reset(seed=seed)``: (reward, steps, timed_out)."""
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ObjectiveError(f"seed must be an integer; got {seed!r}")
        env = self.make_env()
        s, _ = env.reset(seed=int(seed) % 2**63)
        total, steps = 0.0, 0
        while True:
            s, r, terminated, truncated, _ = env.step(heuristic_controller_6d(s, w))
            total += float(r)
            steps += 1
            if terminated:
                return total, steps, False
            if truncated or steps >= self.steps_limit:
                return total - self.timeout_penalty, steps, True

    def evaluate(self, params: Mapping[str, Any], seed: int) -> EvalResult:
        reward, steps, timed_out = self.episode(self.params_to_gains(params), seed)
        return EvalResult(value=reward, metrics={"steps": float(steps), "timed_out": float(timed_out)})

    def empirical_quantile(
        self, params: Mapping[str, Any], tau: float, n_episodes: int = 100, seed0: int = 10**6
    ) -> float:
        """Empirical tau-quantile of the reward over `n_episodes` episodes with seeds ``seed0, seed0+1, ...``.

        The paper scores a recommendation by this quantity with 100 episodes (quantile-expectile-bo.md §4.2).
        """
        if not (0.0 < float(tau) < 1.0):
            raise ObjectiveError(f"quantile level tau must be in (0, 1); got {tau!r}")
        return float(np.quantile(self.episode_rewards(params, n_episodes, seed0), tau))

    def episode_rewards(
        self, params: Mapping[str, Any], n_episodes: int = 100, seed0: int = 10**6
    ) -> np.ndarray:
        """Rewards of `n_episodes` episodes with seeds ``seed0, seed0+1, ...`` (what `empirical_quantile`
        reads)."""
        n_episodes = check_int("n_episodes", n_episodes, 1)  # 0 would end in numpy's IndexError
        w = self.params_to_gains(params)
        return np.array([self.episode(w, seed0 + i)[0] for i in range(n_episodes)])
