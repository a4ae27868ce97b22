"""Lunar lander objective (quantile-expectile-bo.md §4.2): the 6-gain controller reproduces gymnasium's
heuristic, good gains beat bad ones, seeds fix episodes, the timeout penalty is subtracted (A11)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

pytest.importorskip("Box2D", reason="the lunar lander needs gymnasium[box2d]")

from objectives.base import EvalResult, ObjectiveError  # noqa: E402
from objectives.lunar_lander import GYMNASIUM_HEURISTIC, LunarLander, heuristic_controller_6d  # noqa: E402


@pytest.fixture(scope="module")
def lander() -> LunarLander:
    return LunarLander()


def test_default_gains_reproduce_gymnasiums_heuristic():
    import gymnasium
    from gymnasium.envs.box2d.lunar_lander import heuristic

    env = gymnasium.make("LunarLander-v3")
    n_checked = 0
    for seed in range(2):
        s, _ = env.reset(seed=seed)
        while True:
            a = heuristic(env, s)
            assert heuristic_controller_6d(s, GYMNASIUM_HEURISTIC) == a
            s, _, terminated, truncated, _ = env.step(a)
            n_checked += 1
            if terminated or truncated:
                break
    assert n_checked > 100
    # and other gains change the actions somewhere
    s = np.array([0.1, 0.8, 0.2, -0.3, 0.05, 0.1, 0.0, 0.0])
    assert heuristic_controller_6d(s, GYMNASIUM_HEURISTIC) != heuristic_controller_6d(s, [1.2, 0, 0, 0, 0, 0])


def test_good_gains_score_higher_than_bad_gains_over_20_seeds(lander):
    good = lander.gains_to_params(GYMNASIUM_HEURISTIC)
    bad = lander.gains_to_params([0.1, 0.1, 0.1, 0.1, 1.0, 0.1])
    r_good = [lander(good, seed=s).value for s in range(20)]
    r_bad = [lander(bad, seed=s).value for s in range(20)]
    print(f"mean reward: good {np.mean(r_good):.1f}, bad {np.mean(r_bad):.1f}")
    assert np.mean(r_good) > np.mean(r_bad) + 100
    assert np.mean(r_good) > 200  # gymnasium's heuristic lands reliably


def test_seed_fixes_the_episode_and_result_carries_metrics(lander):
    p = lander.gains_to_params(GYMNASIUM_HEURISTIC)
    a, b, c = lander(p, seed=3), lander(p, seed=3), lander(p, seed=4)
    assert isinstance(a, EvalResult) and np.isfinite(a.value)
    assert a.value == b.value and a.value != c.value
    assert a.metrics["steps"] > 0 and a.metrics["timed_out"] == 0.0


def test_timeout_penalty_is_subtracted():
    w = [0.5, 1.0, 0.5, 0.5, 0.0, 0.5]
    short = LunarLander(steps_limit=30)
    free = LunarLander(steps_limit=30, timeout_penalty=0.0)
    r, steps, timed_out = short.episode(w, seed=1)
    r0, steps0, _ = free.episode(w, seed=1)
    assert timed_out and steps == steps0 == 30
    assert r == pytest.approx(r0 - 100.0)


def test_pickles_after_use_and_checks_params(lander):
    p = lander.gains_to_params(GYMNASIUM_HEURISTIC)
    v = lander(p, seed=0).value
    clone = pickle.loads(pickle.dumps(lander))
    assert clone(p, seed=0).value == v
    with pytest.raises(ObjectiveError, match="hover_gain"):
        lander.evaluate({**p, "hover_gain": 1.5}, seed=0)
    with pytest.raises(ObjectiveError, match="steps_limit"):
        LunarLander(steps_limit=0)
    with pytest.raises(ObjectiveError, match="tau"):
        lander.empirical_quantile(p, 0.0)
    for bad in (0, -5, 2.5):
        with pytest.raises(ObjectiveError, match=f"option 'n_episodes' must be an integer >= 1; got {bad}"):
            lander.empirical_quantile(p, 0.1, n_episodes=bad)


def test_empirical_quantile_over_episodes(lander):
    p = lander.gains_to_params(GYMNASIUM_HEURISTIC)
    q10 = lander.empirical_quantile(p, 0.1, n_episodes=10)
    q90 = lander.empirical_quantile(p, 0.9, n_episodes=10)
    assert np.isfinite(q10) and q10 <= q90
    # the rewards behind it: one episode per seed seed0 + i, in order
    rewards = lander.episode_rewards(p, n_episodes=10, seed0=10**6)
    assert rewards.shape == (10,) and q10 == float(np.quantile(rewards, 0.1))
    assert rewards[3] == lander.episode(lander.params_to_gains(p), 10**6 + 3)[0]


def test_legacy_gym_v2_flies_the_same_episodes_as_gymnasium_v3(lander):
    """`env_id="gym:LunarLander-v2"` flies the paper's environment from the legacy gym package: with the same
    gains and seeds the rewards equal gymnasium v3's (v3 changed only wind seeding, observation bounds,
    decorative particles and the world's reset, which makes v2 rarely non-deterministic)."""
    pytest.importorskip("gym", reason="the legacy gym package (test extra) flies LunarLander-v2")
    v2 = LunarLander(env_id="gym:LunarLander-v2")
    good = [1.135, 1.172, 0.186, 0.492, 0.0, 0.756]  # a recorded 10%-TS recommendation: crashes rarely
    for w in (GYMNASIUM_HEURISTIC, good, [0.2, 0.0, 1.2, 0.0, 0.6, 0.0]):
        a = np.array([lander.episode(w, seed)[0] for seed in range(12)])
        b = np.array([v2.episode(w, seed)[0] for seed in range(12)])
        assert np.mean(np.isclose(a, b, atol=1e-6)) >= 0.75, (w, a, b)
    assert pickle.loads(pickle.dumps(v2)).env_id == "gym:LunarLander-v2"


def test_legacy_env_id_without_gym_or_unknown_names_the_env_id(monkeypatch):
    """A missing package or an unknown id is refused when the objective is built (before a run starts), not
    by every evaluation of the run; a bad type or a bad number names its option too."""
    import sys

    for bad in ("NoSuchLander-v0", "gym:NoSuchLander-v0", "LunarLander-v99"):
        with pytest.raises(ObjectiveError, match=f"option 'env_id'='{bad}' is not an environment of"):
            LunarLander(env_id=bad)
    with pytest.raises(ObjectiveError, match="option 'env_id' must be a non-empty string; got 3"):
        LunarLander(env_id=3)
    # not any registered environment is taken (every episode would fail with a bare IndexError)
    for other, got in (("LunarLanderContinuous-v3", r"shape \(8,\) and actions Box\(\(2,\)\)"),
                       ("CartPole-v1", r"shape \(4,\) and actions Discrete\(2\)")):
        with pytest.raises(ObjectiveError, match=rf"option 'env_id'='{other}' is not a LunarLander with "
                                                 rf"discrete engines: .*; got observations of {got}"):
            LunarLander(env_id=other)
    with pytest.raises(ObjectiveError, match=r"option 'steps_limit' must be an integer >= 1; got 1.5"):
        LunarLander(steps_limit=1.5)
    with pytest.raises(ObjectiveError, match=r"option 'upper' must be a finite number > 0; got True"):
        LunarLander(upper=True)
    built = LunarLander(env_id="gym:LunarLander-v2")
    monkeypatch.setitem(sys.modules, "gym", None)  # what an installation without the legacy package sees
    with pytest.raises(ObjectiveError, match=r"option 'env_id'='gym:LunarLander-v2' needs.*pip install "
                                             r"gym==0.26.2"):
        LunarLander(env_id="gym:LunarLander-v2")
    with pytest.raises(ObjectiveError, match=r"option 'env_id'='gym:LunarLander-v2' needs.*pip install "
                                             r"gym==0.26.2"):
        # a worker without the package (a copy: the built one has made its environment): the evaluation fails
        pickle.loads(pickle.dumps(built)).episode(GYMNASIUM_HEURISTIC, 0)


def test_an_environment_this_node_cannot_make_is_left_to_the_workers(monkeypatch):
    """The spaces are checked where the environment can be made. Box2D missing on the node that
    starts the run (or hosts the central actor), not on the workers, must not refuse the objective; the
    evaluations then make the environment themselves, or fail naming env_id."""
    import gymnasium

    def no_box2d(*args, **kwargs):
        raise gymnasium.error.DependencyNotInstalled("Box2D is not installed")

    monkeypatch.setattr(gymnasium, "make", no_box2d)
    lander = LunarLander()
    with pytest.raises(ObjectiveError, match=r"cannot make gymnasium environment "
                                             r"env_id='LunarLander-v3'.*Box2D"):
        lander.episode(GYMNASIUM_HEURISTIC, 0)
    other = LunarLander(env_id="LunarLanderContinuous-v3")  # not checkable here ...
    monkeypatch.undo()
    assert np.isfinite(pickle.loads(pickle.dumps(lander)).episode(GYMNASIUM_HEURISTIC, 0)[0])
    with pytest.raises(ObjectiveError, match="is not a LunarLander with discrete engines"):
        pickle.loads(pickle.dumps(other)).episode(GYMNASIUM_HEURISTIC, 0)  # ... so the worker checks it

    def broken(*args, **kwargs):
        raise RuntimeError("the environment's constructor failed")

    monkeypatch.setattr(gymnasium, "make", broken)  # any other failure is no missing dependency: refused now
    with pytest.raises(ObjectiveError, match="cannot make gymnasium environment.*constructor failed"):
        LunarLander()
