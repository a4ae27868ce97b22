"""The `orchestrator` package's public names: each one resolves, and importing the package stays light
(torch and Ray load only when a name that needs them is used), as the package docstring promises."""

from __future__ import annotations

import subprocess
import sys

import orchestrator


def test_every_exported_name_resolves_to_its_module_object():
    from orchestrator import ask_tell, config, runner

    expected = {
        "AskTellOptimizer": ask_tell.AskTellOptimizer,
        "Trial": ask_tell.Trial,
        "TrialError": ask_tell.TrialError,
        "ExperimentConfig": config.ExperimentConfig,
        "load_config": config.load_config,
        "run_experiment": runner.run_experiment,
        "resume_experiment": runner.resume_experiment,
    }
    for name, obj in expected.items():
        assert name in orchestrator.__all__
        assert getattr(orchestrator, name) is obj
    for name in orchestrator.__all__:
        getattr(orchestrator, name)
    assert set(orchestrator.__all__) <= set(dir(orchestrator))


def test_importing_the_package_loads_neither_torch_nor_ray():
    code = "import sys, orchestrator; print(sorted(m for m in ('torch', 'ray') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
