"""CNN training objective: the papers' space, real training on digits, seeds, errors (objectives/cnn.py)."""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from objectives.base import EvalResult, ObjectiveError, Resources
from objectives.cnn import CNN_SPACE, CNNTraining
from objectives.registry import load_objective

#: sensible settings: SGD step 0.03, mild decay and L2, the narrowest layers (fastest on the CPU)
GOOD = {
    "batch_size": 64,
    "learning_rate": 0.03,
    "lr_decay": 1e-4,
    "l2": 1e-5,
    "fc_units": 256,
    "conv_channels": 128,
}


@pytest.fixture(scope="module")
def cnn() -> CNNTraining:
    return CNNTraining()  # digits, default epochs, one CPU


@pytest.fixture(scope="module")
def short_cnn() -> CNNTraining:
    return CNNTraining(epochs=2)


def test_space_is_the_papers_table() -> None:
    """Table 6 [A] / Table 1 [B] of calibrated-bo.md §2.3, bound for bound."""
    assert list(CNN_SPACE) == ["batch_size", "learning_rate", "lr_decay", "l2", "fc_units", "conv_channels"]
    assert CNN_SPACE["batch_size"] == {"type": "int", "low": 32, "high": 512, "step": 32, "log": False}
    assert CNN_SPACE["learning_rate"] == {"type": "float", "low": 1e-7, "high": 0.1, "log": True}
    assert CNN_SPACE["lr_decay"] == {"type": "float", "low": 1e-7, "high": 1e-3, "log": True}
    assert CNN_SPACE["l2"] == {"type": "float", "low": 1e-7, "high": 1e-3, "log": True}
    assert CNN_SPACE["fc_units"] == {"type": "int", "low": 256, "high": 512, "step": 16, "log": False}
    assert CNN_SPACE["conv_channels"] == {"type": "int", "low": 128, "high": 256, "step": 16, "log": False}
    obj = CNNTraining()
    assert obj.space is CNN_SPACE and obj.direction == "minimize" and obj.noisy


def test_trains_to_low_error_within_a_minute(cnn: CNNTraining) -> None:
    """Acceptance: sensible settings on digits reach test error < 0.2 in < 60 s on the CPU."""
    t0 = time.perf_counter()
    res = cnn(GOOD, seed=0)
    wall = time.perf_counter() - t0
    assert isinstance(res, EvalResult)
    assert res.value < 0.2, res
    assert wall < 60.0, f"one evaluation took {wall:.1f} s"
    assert res.metrics["epochs"] == cnn.epochs and res.metrics["diverged"] == 0.0
    assert res.metrics["final_train_loss"] < 0.5
    assert 0.0 < res.metrics["train_time_s"] < wall
    assert res.metrics["used_gpu"] == float(torch.cuda.is_available())


def test_tiny_learning_rate_stays_near_chance(cnn: CNNTraining) -> None:
    """Acceptance: at learning rate 1e-7 nothing is learnt, so the error is near chance (0.9 for 10
    classes)."""
    res = cnn({**GOOD, "learning_rate": 1e-7}, seed=0)
    assert res.value > 0.7, res
    assert res.metrics["final_train_loss"] > 2.0  # ~log(10) = 2.30


def test_same_seed_same_value_different_seed_different_value(short_cnn: CNNTraining) -> None:
    params = {**GOOD, "batch_size": 128, "learning_rate": 0.01}
    a = short_cnn(params, seed=3)
    b = short_cnn(params, seed=3)
    c = short_cnn(params, seed=4)
    assert a.value == b.value
    assert a.metrics["final_train_loss"] == b.metrics["final_train_loss"]
    assert c.value != a.value
    assert c.metrics["final_train_loss"] != a.metrics["final_train_loss"]


def test_seed_sets_initial_weights(short_cnn: CNNTraining) -> None:
    w = [
        torch.cat(
            [
                p.flatten()
                for p in short_cnn.build_model(128, 256, torch.Generator().manual_seed(s)).parameters()
            ]
        )
        for s in (0, 0, 1)
    ]
    assert torch.equal(w[0], w[1]) and not torch.equal(w[0], w[2])


def test_evaluation_restores_torch_global_settings() -> None:
    assert (
        CNNTraining(num_cpus=2).num_threads == 2 and CNNTraining(num_cpus=2, num_threads=3).num_threads == 3
    )
    before = torch.get_num_threads()
    det = torch.are_deterministic_algorithms_enabled()
    try:
        torch.set_num_threads(2)  # the evaluation runs on its 1 thread, then puts 2 back
        CNNTraining(epochs=1)({**GOOD, "batch_size": 512}, seed=0)
        assert torch.get_num_threads() == 2
        assert torch.are_deterministic_algorithms_enabled() == det
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("batch_size", 16, r"parameter 'batch_size'=16 is outside \[32, 512\]"),
        ("learning_rate", 0.5, r"parameter 'learning_rate'=0.5 is outside"),
        ("lr_decay", 0.0, r"parameter 'lr_decay'"),
        ("l2", float("nan"), r"parameter 'l2' must be a finite number"),
        ("fc_units", 600, r"parameter 'fc_units'=600"),
        ("conv_channels", 140.5, r"parameter 'conv_channels'=140.5 must be an integer"),
        ("batch_size", 40, r"parameter 'batch_size'=40 is not on the grid 32, 64, ..., 512 \(step 32\)"),
        ("fc_units", 260, r"parameter 'fc_units'=260 is not on the grid 256, 272"),
    ],
)
def test_out_of_space_params_are_rejected_by_name(
    short_cnn: CNNTraining, key: str, value: float, match: str
) -> None:
    with pytest.raises(ObjectiveError, match=match):
        short_cnn({**GOOD, key: value}, seed=0)


def test_missing_and_unknown_params_are_named(short_cnn: CNNTraining) -> None:
    params = dict(GOOD)
    del params["l2"]
    with pytest.raises(ObjectiveError, match=r"missing parameter\(s\) \['l2'\]"):
        short_cnn(params, seed=0)
    with pytest.raises(ObjectiveError, match=r"unknown parameter\(s\) \['dropout'\]"):
        short_cnn({**GOOD, "dropout": 0.5}, seed=0)


def test_bad_options_are_named(tmp_path: Path) -> None:
    with pytest.raises(ObjectiveError, match=r"option 'dataset' must be one of \['digits', 'cifar10', "
                                             r"'svhn'\]; got 'mnist'"):
        CNNTraining(dataset="mnist")
    with pytest.raises(ObjectiveError, match=r"option 'data_dir' is required for dataset 'svhn'"):
        CNNTraining(dataset="svhn")
    with pytest.raises(ObjectiveError, match=r"option 'epochs'"):
        CNNTraining(epochs=0)
    with pytest.raises(ObjectiveError, match=r"option 'device'"):
        CNNTraining(device="tpu")
    with pytest.raises(ObjectiveError, match=r"option 'conv_layers'=4 pools 'digits' images of side 8"):
        CNNTraining(conv_layers=4)  # refused when built, before a run starts
    with pytest.raises(ObjectiveError, match=r"option 'data_dir' must be None for dataset 'digits'"):
        CNNTraining(data_dir=tmp_path)
    # the loaded images are checked too, on every access: the worker keeps the objective for many evaluations,
    # and a failed first check used to leave the data cached, so later ones hit a bare ZeroDivisionError
    deep = CNNTraining(conv_layers=3)
    deep.conv_layers = 4  # as if the files held smaller images than the data set's known size
    for _ in range(2):
        with pytest.raises(ObjectiveError, match=r"option 'conv_layers'=4 pools 'digits' images of side 8"):
            _ = deep.data
    # a wrong data folder is refused when built, not at every evaluation (the README: every key is checked
    # before Ray starts), naming the option and what is missing
    with pytest.raises(ObjectiveError, match=r"option 'data_dir': CIFAR-10 directory '.*absent' does not "
                                             r"exist.*'check_data': false if it exists only on the worker "
                                             r"nodes"):
        CNNTraining(dataset="cifar10", data_dir=tmp_path / "absent")
    # a worker-only folder
    far = CNNTraining(dataset="cifar10", data_dir=tmp_path / "absent", check_data=False)
    with pytest.raises(ObjectiveError, match="absent"):
        far(GOOD, seed=0)  # ... that this machine lacks: the evaluation fails, naming it
    with pytest.raises(ObjectiveError, match=r"option 'data_dir': SVHN file '.*train_32x32.mat' is missing"):
        CNNTraining(dataset="svhn", data_dir=tmp_path)
    for name in ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(ObjectiveError, match=r"option 'data_dir': CIFAR-10 file '.*test_batch' is missing"):
        CNNTraining(dataset="cifar10", data_dir=tmp_path)
    (tmp_path / "test_batch").write_bytes(b"not a pickle")
    obj = CNNTraining(dataset="cifar10", data_dir=tmp_path)  # the files are there; their format is read later
    with pytest.raises(ObjectiveError, match="test_batch|data_batch"):
        obj(GOOD, seed=0)
    # device 'cuda' with no GPU asked of Ray: every evaluation would fail (it sees none: workers/evaluate.py),
    # so refused now
    for device in ("cuda", "cuda:1"):
        with pytest.raises(ObjectiveError, match=rf"option 'device'='{device}' needs option 'num_gpus' > 0"):
            CNNTraining(device=device)
    # 'cuda:1' with one GPU per evaluation names a device the task never sees (Ray gives it cuda:0)
    with pytest.raises(ObjectiveError, match=r"option 'device'='cuda:1': an evaluation with num_gpus=1 sees "
                                             r"cuda:0 to cuda:0"):
        CNNTraining(device="cuda:1", num_gpus=1)
    with pytest.raises(ObjectiveError, match=r"'cuda:x'"):
        CNNTraining(device="cuda:x", num_gpus=1)
    CNNTraining(device="cuda:1", num_gpus=2)
    if not torch.cuda.is_available():
        with pytest.raises(ObjectiveError, match=r"option 'device'='cuda' but no CUDA device"):
            CNNTraining(device="cuda", num_gpus=1)(GOOD, seed=0)
    # types are not coerced: the value and the option are named
    for key, value, match in (
        ("epochs", 2.0, "an integer >= 1"),
        ("num_gpus", True, "a finite number >= 0"),
        ("num_cpus", float("inf"), "a finite number > 0"),
        ("momentum", 1.0, r"a finite number in \[0, 1\)"),
        ("num_threads", 0, "None or an integer >= 1"),
        ("data_dir", 5, "None or a path"),
    ):
        with pytest.raises(ObjectiveError, match=rf"option '{key}' must be {match}; got {value!r}"):
            CNNTraining(**{key: value})


def test_resources_default_cpu_and_optional_gpu() -> None:
    assert CNNTraining().resources == Resources(num_cpus=1.0, num_gpus=0.0)
    assert CNNTraining(num_cpus=4, num_gpus=0.5).resources.to_ray_options() == {
        "num_cpus": 4.0,
        "num_gpus": 0.5,
    }
    assert CNNTraining.resources == Resources()  # the class default is untouched
    # a user can declare the memory a CIFAR-10/SVHN evaluation needs
    assert CNNTraining(memory=2 * 2**30).resources.to_ray_options() == {"num_cpus": 1.0, "num_gpus": 0.0,
                                                                      "memory": 2 * 2**30}
    with pytest.raises(ObjectiveError, match=r"option 'memory' must be None or an integer >= 1; got 1.5"):
        CNNTraining(memory=1.5)


def test_channel_stats_sum_in_chunks_without_a_float64_copy_of_the_set() -> None:
    """The per-channel statistics make no float64 copy of the whole training set (2.9 GB peak for CIFAR-10 in
    every CNN worker): chunked sums give the same mean and std with a small, bounded peak."""
    import tracemalloc

    from objectives.datasets import ImageDataset

    X = np.random.default_rng(0).integers(0, 256, size=(4000, 3, 32, 32), dtype=np.uint8)
    data = ImageDataset(
        "random", X, np.zeros(4000, dtype=np.int64), X[:8], np.zeros(8, dtype=np.int64), 10, 255.0
    )
    tracemalloc.start()
    try:
        mean, std = data.channel_stats()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    full = X.astype(np.float64) / 255.0  # 98 MB
    assert peak < full.nbytes / 5, peak
    np.testing.assert_allclose(mean, full.mean(axis=(0, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(std, full.std(axis=(0, 2, 3)), rtol=1e-10)


def test_registry_builds_it_with_options() -> None:
    obj = load_objective("cnn", {"epochs": 3, "device": "cpu"})
    assert isinstance(obj, CNNTraining) and obj.epochs == 3


def test_pickling_leaves_loaded_data_behind(short_cnn: CNNTraining) -> None:
    short_cnn.data  # noqa: B018 - loads
    clone = pickle.loads(pickle.dumps(short_cnn))
    assert clone._data is None and clone._tensors == {}
    assert clone.epochs == short_cnn.epochs


def test_trains_on_cifar_format_files(tmp_path: Path) -> None:
    """End to end on 3-channel 32x32 images read from CIFAR-10's pickle format (tiny, synthetic)."""
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 256, size=(8, 3072), dtype=np.uint8), b"labels": list(range(8))}
        (tmp_path / "cifar").mkdir(exist_ok=True)
        with open(tmp_path / "cifar" / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)
    obj = CNNTraining(dataset="cifar10", data_dir=tmp_path / "cifar", epochs=1)
    res = obj({**GOOD, "batch_size": 32}, seed=0)
    assert 0.0 <= res.value <= 1.0 and np.isfinite(res.metrics["final_train_loss"])
    assert res.value * 8 == pytest.approx(round(res.value * 8))  # a count of errors over 8 test images


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_uses_the_gpu_when_present() -> None:
    obj = CNNTraining(epochs=3)
    a = obj(GOOD, seed=0)
    assert a.metrics["used_gpu"] == 1.0 and a.value < 0.2
    cpu = CNNTraining(epochs=3, device="cpu")(GOOD, seed=0)
    assert cpu.metrics["used_gpu"] == 0.0 and cpu.value < 0.2


@pytest.mark.slow
def test_most_expensive_point_still_trains_within_a_minute() -> None:
    """Widest layers and the smallest batch (most updates): the worst case of one CPU evaluation."""
    params = {
        "batch_size": 32,
        "learning_rate": 0.01,
        "lr_decay": 1e-7,
        "l2": 1e-3,
        "fc_units": 512,
        "conv_channels": 256,
    }
    t0 = time.perf_counter()
    res = CNNTraining()(params, seed=0)
    assert time.perf_counter() - t0 < 60.0
    assert res.value < 0.2 and res.metrics["diverged"] == 0.0


def test_n_train_trains_on_a_fixed_subset_and_is_checked(tmp_path: Path, short_cnn: CNNTraining) -> None:
    """`n_train`: the same subset of the training images in every instance (a worker builds its own), the
    test set whole; more than the set holds, or a non-integer, is refused naming the option."""
    full = short_cnn.data
    a, b = CNNTraining(epochs=2, n_train=300), CNNTraining(epochs=2, n_train=300)
    assert a.data.X_train.shape == (300, 1, 8, 8) and np.array_equal(a.data.X_train, b.data.X_train)
    assert np.array_equal(a.data.X_test, full.X_test) and np.array_equal(a.data.y_test, full.y_test)
    # rows of the full set, with their own labels, not its first 300
    rows = {r.tobytes(): y for r, y in zip(full.X_train, full.y_train)}
    assert all(rows[r.tobytes()] == y for r, y in zip(a.data.X_train, a.data.y_train))
    assert not np.array_equal(a.data.X_train, full.X_train[:300]) and len(set(a.data.y_train.tolist())) == 10
    clone = pickle.loads(pickle.dumps(a))  # as shipped to a worker: loads and subsets the same way
    assert np.array_equal(clone.data.X_train, a.data.X_train)
    res_small, res_full = a(GOOD, seed=0), short_cnn(GOOD, seed=0)
    assert res_small.value == a(GOOD, seed=0).value and 0.0 <= res_small.value <= 1.0
    assert res_small.value != res_full.value
    with pytest.raises(ObjectiveError, match=r"option 'n_train'=5000 exceeds the 1257 training images of "
                                             r"dataset 'digits'"):
        CNNTraining(n_train=5000)
    for value in (0, 2.5, True):
        with pytest.raises(ObjectiveError, match=r"option 'n_train' must be None or an integer >= 1; got "
                                                 rf"{value!r}"):
            CNNTraining(n_train=value)
    assert load_objective("cnn", {"n_train": 200}).n_train == 200
