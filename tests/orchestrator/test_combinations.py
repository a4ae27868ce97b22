"""Model, proposer, calibrator and run-argument checks made before a run starts: without them, each of these
would pass validation, start Ray, make the run directory, spend the initial design and only then fail at the
first model batch, or crash with a Python traceback."""

from __future__ import annotations

import pytest

from orchestrator.ask_tell import AskTellOptimizer
from orchestrator.config import load_config, load_config_text
from orchestrator.errors import ConfigError
from orchestrator.runner import _check_objective, _check_run_args

BASE = {"objective": "forrester", "budget": 6, "initial_design": 4, "batch_size": 2}
CAL = {"type": "calibrated"}


@pytest.mark.parametrize(
    "patch, match",
    [
        (
            {"proposer": "calibrated"},
            r"`proposer.type` 'calibrated' with `model.type` 'quantile': .*Gaussian-likelihood",
        ),
        ({"proposer": "calibrated", "model": "gpr-replicates"}, r"Gaussian-likelihood"),
        (
            {"proposer": "qgibbon", "model": "exact-gp"},
            r"`proposer.type` 'qgibbon' with `model.type` 'exact-gp'",
        ),
        ({"proposer": "qgibbon", "model": "heteroscedastic"}, r"two-latent quantile or expectile"),
        ({"proposer": "qgibbon", "model": "gpr-replicates"}, r"two-latent quantile or expectile"),
        (
            {
                "proposer": {**CAL, "options": {"acquisition": "ucb"}},
                "model": "exact-gp",
                "calibrator": "locbo",
            },
            r"and `calibrator.type` 'locbo': calibrator 'locbo' defines EI only",
        ),
        (
            {
                "proposer": {**CAL, "options": {"acquisition": "pi"}},
                "model": "exact-gp",
                "calibrator": "conformal",
            },
            r"calibrator 'conformal' defines EI and UCB",
        ),
        (
            {"proposer": "calibrated", "model": "heteroscedastic", "calibrator": "conformal"},
            r"exact Gaussian GP",
        ),
        # both optimize HetGP's f, the mean, whatever tau; its recommendation is the tau-quantile
        (
            {"proposer": "qlognei", "model": "heteroscedastic", "tau": 0.2},
            r"qLogNEI optimizes the model's f, which for HeteroscedasticSVGP is the "
            r"mean.*tau-quantile.*ignore tau",
        ),
        (
            {"proposer": "calibrated", "model": "heteroscedastic", "tau": 0.9},
            r"calibrated EI optimizes the model's f",
        ),
        (
            {"proposer": "sobol", "calibrator": "online"},
            r"`calibrator.type` 'online' does not work with `proposer.type` 'sobol'",
        ),
        ({"proposer": "qlognei", "calibrator": "online"}, r"does not work with `proposer.type` 'qlognei'"),
        # conformal's options would change nothing (only a spread factor acts)
        (
            {"proposer": "thompson", "model": "exact-gp", "calibrator": "conformal"},
            r"`calibrator.type` 'conformal' does not work with `proposer.type` 'thompson': "
            r".*'online-interval'",
        ),
        ({"proposer": "qgibbon", "calibrator": "conformal"}, r"does not work with `proposer.type` 'qgibbon'"),
        # its fold refits would be paid for a level map nothing reads (only a spread factor acts)
        (
            {"calibrator": "offline-cv"},
            r"`calibrator.type` 'offline-cv' does not work with `proposer.type` 'thompson'",
        ),
        # GPR-EI optimizes HetGP's f, the mean, whatever tau
        ({"proposer": "gpr-ei", "model": "heteroscedastic", "tau": 0.1}, r"GPR-EI optimizes the model's f"),
        (
            {"model": {"type": "quantile", "options": {"tau": 0.3}}},
            r"`model.options`: `tau` is not a model option",
        ),
        (
            {"model": {"type": "gpr-replicates", "options": {"num_inducing": 5}}},
            r"`model.options`: bad option .*num_inducing.*; valid options: "
            r"\['fit_maxiter', 'min_noise', 'num_bootstrap', 'seed', 'use_priors'\]",
        ),
        # these name the valid options, and exact-gp's list does not hold `tau`, which it refuses
        (
            {"proposer": {"type": "thompson", "options": {"foo": 1}}},
            r"bad `proposer.options` for 'thompson'.*'foo'; valid options: \['chunk_bytes', "
            r"'local_fraction', 'maxiter', 'method', ",
        ),
        (
            {"model": {"type": "exact-gp", "options": {"foo": 1}}},
            r"valid options: \['fit_maxiter', 'warm_start'\] \(tau is the",
        ),
        (
            {"model": {"type": "exact-gp", "options": {"fit_maxiter": 0}}},
            r"^`model.options`: `fit_maxiter` must be an integer >= 1 or null \(no cap\); got 0$",
        ),
        # refused: accepted, the proposer would hold the string 'locbo' as its calibrator
        (
            {"proposer": {**CAL, "options": {"calibrator": "locbo"}}, "model": "exact-gp"},
            r"`proposer.options` \['calibrator'\] are set by the `calibrator` section",
        ),
        # an option the proposer never reads names the option, not a type mismatch, and how to resume
        (
            {"calibrator": {"type": "online", "options": {"eta": 0.05}}},
            r"^`calibrator.options` \['eta'\] act only inside .*config.yaml\) \(`proposer.type` "
            r"'thompson'\)$",
        ),
        (
            {"model": {"type": "quantile", "options": {"seed": 2**64}}},
            r"`seed` must be an integer in \[0, 2\*\*63\)",
        ),
        (
            {"model": {"type": "expectile", "options": {"noise_scale": "fixed"}}},
            r"`model.options`: `noise_scale` must be one of \['gp', 'constant'\]; got 'fixed'",
        ),
        (
            {"model": {"type": "quantile", "options": {"min_delta": True}}},
            r"`min_delta` must be a non-negative number; got True",
        ),
        (
            {
                "calibrator": {"type": "locbo", "options": {"alpha": "0.2"}},
                "proposer": "calibrated",
                "model": "exact-gp",
            },
            r"`calibrator.options.alpha` is out of range; got '0.2'",
        ),
        (
            {
                "calibrator": {"type": "conformal", "options": {"density_ratio": "no"}},
                "proposer": "calibrated",
                "model": "exact-gp",
            },
            r"`calibrator.options.density_ratio` must be true or false; got 'no'",
        ),
        (
            {"calibrator": {"type": "online", "options": {"spread_coverage": "0.8"}}},
            r"`calibrator.options.spread_coverage` is out of range; got '0.8'",
        ),
        (
            {
                "calibrator": {"type": "offline-cv", "options": {"model": "quantil"}},
                "proposer": "calibrated",
                "model": "exact-gp",
            },
            r"calibrator.options.*unknown model 'quantil'",
        ),
        (
            {
                "calibrator": {"type": "offline-cv", "options": {"model_options": {"foo": 1}}},
                "proposer": "calibrated",
                "model": "exact-gp",
            },
            r"calibrator.options.*\['foo'\]",
        ),
        (
            {"proposer": {"type": "qgibbon", "options": {"floor_max_values": "no"}}},
            r"floor_max_values must be true or false",
        ),
        (
            {"proposer": {**CAL, "options": {"beta": True}}, "model": "exact-gp"},
            r"`proposer.options.beta` must be a finite",
        ),
        (
            {"proposer": {**CAL, "options": {"xi": float("nan")}}, "model": "exact-gp"},
            r"`proposer.options.xi` must be a finite",
        ),
    ],
)
def test_bad_combinations_and_options_are_config_errors_before_the_run(patch, match):
    with pytest.raises(ConfigError, match=match):
        _check_objective(load_config({**BASE, **patch}))


@pytest.mark.parametrize(
    "patch",
    [
        {"proposer": "calibrated", "model": "exact-gp", "calibrator": "conformal"},
        {"proposer": "calibrated", "model": "heteroscedastic", "calibrator": "online"},
        {"proposer": "calibrated", "model": "exact-gp", "calibrator": "locbo"},
        {"proposer": "qgibbon", "model": "expectile", "calibrator": "online"},
        {"proposer": "thompson", "model": "gpr-replicates"},
        {"proposer": "gpr-ei", "model": "gpr-replicates"},
        {"proposer": "qlognei", "model": "exact-gp"},
        # the plug-in quantile is the mean + a constant
        {"proposer": "qlognei", "model": "exact-gp", "tau": 0.1},
        {"proposer": "qlognei", "model": "heteroscedastic"},  # tau 0.5: the target is the mean
        {"proposer": "sobol"},
        {"calibrator": "offline-cv", "proposer": "calibrated", "model": "exact-gp"},
        {"model": {"type": "expectile", "options": {"noise_scale": "constant"}}, "proposer": "qgibbon"},
    ],
)
def test_working_combinations_pass(patch):
    _check_objective(load_config({**BASE, **patch}))


def test_the_library_optimizer_checks_at_construction():
    space = {"x": {"type": "float", "low": 0.0, "high": 1.0}}
    # these name the key that is wrong, not `model.options` and `proposer.options`
    with pytest.raises(ConfigError, match=r"^`model.type` must be one of .*; got 'quantil'$"):
        AskTellOptimizer(space, model="quantil")
    with pytest.raises(ConfigError, match=r"^`proposer.type` must be one of .*; got 'thompsn'$"):
        AskTellOptimizer(space, proposer="thompsn")
    with pytest.raises(ConfigError, match="`tau` is not a model option"):
        AskTellOptimizer(space, model_options={"tau": 0.3})
    with pytest.raises(ConfigError, match=r"`seed` must be an integer in \[0, 2\*\*63\)"):
        AskTellOptimizer(space, seed=2**70)
    with pytest.raises(ConfigError, match="qgibbon"):
        AskTellOptimizer(space, model="exact-gp", proposer="qgibbon")


def test_yaml_exponent_floats_are_numbers():
    """PyYAML (YAML 1.1) reads `1e-3` as a string; `lr: 1e-3` was refused as "got '1e-3'"."""
    cfg = load_config_text("objective: forrester\ntau: 1e-1\nmodel: {type: quantile, options: {lr: 1e-3, "
                           "min_lr: 2E-5}}\n")
    assert cfg.tau == 0.1 and cfg.model.options == {"lr": 1e-3, "min_lr": 2e-5}
    assert load_config_text("objective: forrester\nname: 1e3x\n").name == "1e3x"  # not a number: stays text
    import yaml

    assert yaml.safe_load("a: 1e-3") == {"a": "1e-3"}  # the global SafeLoader is untouched
    # a dot and an unsigned exponent (1.5e3) make a number, not a string, so `timeout_s: 1.5e3` is taken
    for text, value in [
        ("1.5e3", 1500.0),
        ("1.0e0", 1.0),
        ("-2.5E-3", -2.5e-3),
        (".5e2", 50.0),
        ("1.5e+3", 1500.0),
        ("7", 7),
        ("1.5e", "1.5e"),
        ("e3", "e3"),
        ("1.2.3e4", "1.2.3e4"),
    ]:
        got = load_config_text(f"objective: {{name: forrester, options: {{v: {text}}}}}\n").objective.options[
            "v"
        ]
        assert got == value and type(got) is type(value), text
    assert load_config_text("objective: forrester\ntimeout_s: 1.5e3\n").timeout_s == 1500.0


def test_run_arguments_are_checked_before_ray_starts():
    assert _check_run_args(None, None, None) == {}
    assert _check_run_args(2, 4, {"isolate": "thread", "queue_low": 0}) == {
        "isolate": "thread",
        "queue_low": 0,
    }
    for args, match in [
        ((0, None, None), r"`max_concurrent` must be None or an integer >= 1; got 0"),
        ((2.5, None, None), r"`max_concurrent` must be None or an integer >= 1; got 2.5"),
        ((None, True, None), r"`num_cpus` must be None or an integer >= 1; got True"),
        ((None, None, {"queue_lo": 3}), r"unknown `actor_options` \['queue_lo'\]"),
        ((None, None, {"isolate": "fork"}), r"`actor_options.isolate` must be 'process' or 'thread'"),
        ((None, None, {"refit_interval_s": -1}), r"`actor_options.refit_interval_s`"),
        # 0 is refused here, not by the actor inside Ray with a run dir left behind
        ((None, None, {"max_refit_failures": 0}), r"`actor_options.max_refit_failures` must be an integer >= "
                                                  r"1"),
    ]:
        with pytest.raises(ConfigError, match=match):
            _check_run_args(*args)


def test_an_objective_that_fails_to_build_keeps_its_traceback_and_is_not_blamed_on_options(
    tmp_path, monkeypatch
):
    """Library use: a bug in a user objective's constructor does not read "`objective.options` ... were
    refused" for a config with no options, and its traceback is kept (not `from None`)."""
    (tmp_path / "badinit_obj.py").write_text(
        "from objectives.base import Objective\ndef helper(d):\n    return d['missing_key']\n"
        "class BadInit(Objective):\n"
        "    name = 'badinit'\n    space = {'x': {'type': 'float', 'low': 0.0, 'high': 1.0}}\n"
        "    def __init__(self):\n        self.v = helper({})\n"
        "    def evaluate(self, params, seed):\n        return 0.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as info:
        _check_objective(load_config({**BASE, "objective": {"name": "badinit_obj:BadInit"}}))
    assert str(info.value) == ("`objective` 'badinit_obj:BadInit' failed to build (no options given): "
                               "KeyError: 'missing_key'")
    assert isinstance(info.value.__cause__, KeyError)
    import traceback

    assert "in helper" in "".join(traceback.format_exception(info.value.__cause__))
    # through a YAML file (the CLI's way), whose name the error gains, the cause stays
    import yaml

    from orchestrator.runner import run_experiment

    path = tmp_path / "badinit.yaml"
    path.write_text(yaml.safe_dump({**BASE, "objective": {"name": "badinit_obj:BadInit"},
                                    "run_dir": str(tmp_path / "never")}))
    with pytest.raises(ConfigError, match=f"^{path}: `objective` 'badinit_obj:BadInit' failed to "
                                          "build") as info:
        run_experiment(str(path), progress=False)
    assert isinstance(info.value.__cause__, KeyError) and not (tmp_path / "never").exists()


def test_an_objective_in_main_is_refused_before_ray_with_the_way_out(monkeypatch):
    """`__main__:MyObj` (a notebook's class) is refused in the driver, which can import its own __main__:
    passed, the central actor would fail to load it after Ray starts, with no hint."""
    import __main__
    from objectives.functions import Forrester

    monkeypatch.setattr(__main__, "MyObj", Forrester, raising=False)
    with pytest.raises(ConfigError, match=r"`objective.name` '__main__:MyObj' is defined in __main__ .* "
                                          r"cannot import: put it in a module file .* name it "
                                          r"'my_objective:MyObj'"):
        _check_objective(load_config({**BASE, "objective": {"name": "__main__:MyObj"}}))
