"""The model stack on a device (`orchestrator/device.py`, `models.base.TKWARGS`): the config key, the
optimizer's device, the thread-local CPU fits, checkpoints that load anywhere, and every model and proposer
fitted and asked on each device: the CPU always, CUDA where torch sees one (skipped otherwise, and the report
says so)."""

from __future__ import annotations

import threading

import pytest
import torch

from orchestrator.ask_tell import AskTellOptimizer
from orchestrator.config import load_config
from orchestrator.device import check_device, rand, randn, resolve_device, wants_gpu
from orchestrator.errors import ConfigError
from orchestrator.models import build_model
from orchestrator.models.base import TKWARGS, model_device, on_cpu, use_device

CUDA = torch.cuda.is_available()
NO_CUDA = pytest.mark.skipif(not CUDA, reason="torch sees no CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=NO_CUDA)]
SPACE = {"x": {"type": "float", "low": 0.0, "high": 1.0}, "y": {"type": "float", "low": -1.0, "high": 1.0}}


@pytest.fixture(autouse=True)
def _restore_device():
    before = model_device()
    yield
    use_device(before)


def _data(n: int, d: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64)
    noise = 0.1 * (1 + X[:, 0]) * torch.randn(n, generator=g, dtype=torch.float64)
    Y = torch.sin(6 * X[:, 0]) + X[:, 1] + noise
    return X, Y


# ---------------------------------------------------------------------------------------------- names
@pytest.mark.parametrize("value", ["cpu", "cuda", "cuda:1", "auto"])
def test_device_names_are_accepted(value):
    assert check_device(value) == value


@pytest.mark.parametrize("value", ["gpu", "CUDA", "cuda:", "cuda:x", "", 0, None, "tpu"])
def test_a_bad_device_name_is_a_config_error_naming_the_key(value):
    with pytest.raises(ConfigError, match=r"`device` must be one of \['cpu', 'cuda', 'auto'\] or 'cuda:N'"):
        check_device(value)


def test_auto_resolves_to_what_torch_sees():
    assert resolve_device("auto").type == ("cuda" if CUDA else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(CUDA, reason="the error is for a process without CUDA")
def test_cuda_without_a_cuda_device_says_so():
    with pytest.raises(ConfigError, match=r"`device` is 'cuda' but torch sees no CUDA device"):
        resolve_device("cuda")
    with pytest.raises(ConfigError, match=r"`device` is 'cuda' but torch sees no CUDA device"):
        AskTellOptimizer(SPACE, device="cuda")


def test_the_actor_asks_for_a_gpu_when_told_to():
    assert wants_gpu("cuda", 0) and wants_gpu("cuda:0", 4)
    assert wants_gpu("auto", 1) and not wants_gpu("auto", 0)
    assert not wants_gpu("cpu", 8)


def test_the_config_key_defaults_to_cpu_and_round_trips():
    cfg = load_config({"objective": "forrester"})
    assert cfg.device == "cpu" and "device" not in cfg.to_dict()
    cfg = load_config({"objective": "forrester", "device": "auto"})
    assert cfg.device == "auto" and load_config(cfg.to_dict()).device == "auto"
    with pytest.raises(ConfigError, match=r"`device` must be one of"):
        load_config({"objective": "forrester", "device": "gpu"})


# ---------------------------------------------------------------------------------------------- TKWARGS
def test_tkwargs_spreads_the_process_device_and_on_cpu_overrides_it_in_one_thread_only():
    use_device(torch.device("meta"))  # a device every build of torch has: tensors without storage
    assert torch.zeros(2, **TKWARGS).device.type == "meta"
    assert dict(TKWARGS) == {"dtype": torch.float64, "device": torch.device("meta")}
    seen: dict[str, torch.device] = {}
    inside, release = threading.Event(), threading.Event()

    def fit_on_cpu() -> None:
        with on_cpu():
            seen["fit"] = torch.zeros(1, **TKWARGS).device
            inside.set()
            release.wait(10)

    t = threading.Thread(target=fit_on_cpu)
    t.start()
    assert inside.wait(10)
    seen["other"] = torch.zeros(1, **TKWARGS).device  # while the other thread is inside `on_cpu`
    release.set()
    t.join()
    assert seen == {"fit": torch.device("cpu"), "other": torch.device("meta")}
    with on_cpu(), on_cpu():
        assert TKWARGS["device"] == torch.device("cpu")
    assert TKWARGS["device"] == torch.device("meta")


def test_seeded_draws_are_the_same_whatever_the_target_device():
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a = randn(4, 3, generator=g1, device="cpu")
    b = randn(4, 3, generator=g2, device="meta")
    assert b.device.type == "meta" and a.shape == b.shape
    g1.manual_seed(5)
    plain = torch.rand(6, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    torch.testing.assert_close(rand(6, generator=g1), plain)


def test_the_optimizer_sets_its_device_before_it_fits(monkeypatch):
    opt = AskTellOptimizer(SPACE, model="quantile", tau=0.2, initial_design=6, seed=1, device="cpu")
    use_device(torch.device("meta"))  # another optimizer's (or caller's) device in this process
    for t in opt.ask(6):
        opt.tell(t.trial_id, t.params["x"] - t.params["y"] ** 2)
    opt.fit()
    assert model_device() == torch.device("cpu")
    assert opt.model.sparse_parts("f").Z.device == torch.device("cpu")


# ---------------------------------------------------------------------------------------------- models
MODELS = [("quantile", {}), ("expectile", {}), ("heteroscedastic", {}), ("exact-gp", {}),
          ("gpr-replicates", {}), ("quantile", {"num_inducing": 8}),
          ("quantile", {"optimizer": "adam", "max_steps": 30})]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name, options", MODELS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(MODELS)])
def test_every_model_fits_predicts_and_checkpoints_on_the_device(device, name, options):
    dev = resolve_device(device)
    use_device(dev)
    X, Y = _data(24)
    model = build_model(name, tau=0.2, **options)
    model.fit(X, Y)  # CPU inputs: the model moves them
    Xt = torch.rand(5, 2, dtype=torch.float64)
    mu, var = model.posterior_f(Xt, full_cov=False)
    assert mu.device.type == dev.type and var.device.type == dev.type
    parts = model.sparse_parts("f")
    assert parts.Z.device.type == dev.type and parts.u_covar.device.type == dev.type
    records = model.forecast(Xt).to_records()
    assert len(records) == 5 and all(isinstance(r["mu_f"], float) for r in records)
    q = model.predict_quantiles(Xt, [0.1, 0.9])
    assert q.shape == (5, 2) and bool((q[:, 0] <= q[:, 1]).all())
    state = model.get_state()
    tensors = [v for v in _leaves(state) if torch.is_tensor(v)]
    assert tensors and all(v.device.type == "cpu" for v in tensors), "a checkpoint must load on any machine"
    again = build_model(name, tau=0.2, **options)
    again.set_state(state)
    mu2, _ = again.posterior_f(Xt, full_cov=False)
    assert mu2.device.type == dev.type
    torch.testing.assert_close(mu2, mu)


def _leaves(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


@pytest.mark.parametrize("device", DEVICES)
def test_a_device_fit_matches_the_cpu_fit(device):
    """The same data and options: the full-variational fit (n <= 500, on the CPU's LAPACK whatever the model's
    device) and the minibatch fit on the device give the CPU's posterior to float64 round-off."""
    X, Y = _data(30, seed=2)
    Xt = torch.rand(7, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    out = {}
    for dev in ("cpu", device):
        use_device(resolve_device(dev))
        model = build_model("quantile", tau=0.2)
        model.fit(X, Y)
        out[dev] = model.posterior_f(Xt, full_cov=False)[0].cpu()
    torch.testing.assert_close(out[device], out["cpu"], rtol=1e-6, atol=1e-8)


# ---------------------------------------------------------------------------------------------- the loop
PROPOSERS = [("quantile", "thompson", "none"), ("quantile", "thompson", "online"),
             ("expectile", "qgibbon", "none"), ("heteroscedastic", "thompson", "online-interval"),
             ("exact-gp", "qlognei", "none"), ("gpr-replicates", "gpr-ei", "none"),
             ("exact-gp", "calibrated", "online")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model, proposer, calibrator", PROPOSERS, ids=["-".join(p) for p in PROPOSERS])
def test_ask_tell_runs_on_the_device(device, model, proposer, calibrator):
    opt = AskTellOptimizer(SPACE, model=model, proposer=proposer, calibrator=calibrator, tau=0.2,
                           initial_design=8, seed=4, device=device,
                           proposer_options={"num_restarts": 2, "raw_samples": 64}
                           if proposer in ("qlognei", "gpr-ei", "calibrated") else None)
    for _ in range(3):
        trials = opt.ask(4 if opt.uses_model() else 8)
        for t in trials:
            assert t.x.device.type == "cpu"  # the optimizer's trials stay on the CPU
            opt.tell(t.trial_id, t.params["x"] - (t.params["y"] - 0.3) ** 2)
    opt.fit()
    params, value = opt.best()
    assert set(params) == {"x", "y"} and isinstance(value, float)
    state = opt.get_state()
    assert all(v.device.type == "cpu" for v in _leaves(state) if torch.is_tensor(v))
