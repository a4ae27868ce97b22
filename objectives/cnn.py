"""CNN training as a noisy black box: 6 hyperparameters -> held-out classification error.

Implements the CNN task of the calibrated-BO papers (calibrated-bo.md §2.3, Table 6 [A] / Table 1 [B]):
batch size, learning rate, learning-rate decay, L2 regularisation, units of the fully connected layer
and channels of the convolutional layers. The papers fix the search space only; architecture, epochs,
optimiser and the meaning of "learning rate decay" are unspecified (§5.2 item 11), so this module
chooses them and says so in `CNNTraining`'s docstring. The seed sets the initial weights and the order
of the minibatches, so repeated evaluations at one point differ as real training runs do.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from objectives.base import EvalResult, Objective, ObjectiveError, Resources
from objectives.datasets import (
    IMAGE_DATASETS,
    DatasetError,
    ImageDataset,
    check_image_source,
    load_image_dataset,
)
from objectives.options import check_choice, check_float, check_int, check_path

#: image side of each data set (digits 8x8, CIFAR-10 and SVHN 32x32): `conv_layers` halvings must leave >= 1
_IMAGE_SIDE = {"digits": 8, "cifar10": 32, "svhn": 32}

__all__ = ["CNNTraining", "CNN_SPACE"]

#: the search space of the papers' Table 6 [A] / Table 1 [B], verbatim bounds
CNN_SPACE: dict[str, dict[str, Any]] = {
    "batch_size": {"type": "int", "low": 32, "high": 512, "step": 32, "log": False},
    "learning_rate": {"type": "float", "low": 1e-7, "high": 0.1, "log": True},
    "lr_decay": {"type": "float", "low": 1e-7, "high": 1e-3, "log": True},
    "l2": {"type": "float", "low": 1e-7, "high": 1e-3, "log": True},
    "fc_units": {"type": "int", "low": 256, "high": 512, "step": 16, "log": False},
    "conv_channels": {"type": "int", "low": 128, "high": 256, "step": 16, "log": False},
}

#: seed of the fixed permutation whose first `n_train` training images an `n_train` run trains on
TRAIN_SUBSET_SEED = 0
#: rows evaluated at once when scoring the held-out set
_EVAL_BATCH = 1024


class CNNTraining(Objective):
    """Train a small CNN with PyTorch and return its held-out classification error (minimize).

    Choices where the papers are silent (calibrated-bo.md §5.2 item 11):

    * **Architecture.** `conv_layers` blocks of ``Conv2d(3x3, padding 1, conv_channels) -> ReLU ->
      MaxPool(2)``, then ``Linear(fc_units) -> ReLU -> Linear(num_classes)``. "Outchannels in conv layer"
      is the width of every conv block; "outchannels in fc layer" the width of the hidden dense layer.
      Weights start from PyTorch's default (Kaiming-uniform) initialisation drawn from the seeded generator.
      No data augmentation, dropout or batch norm.
    * **Optimiser.** SGD with momentum (`momentum`, 0.9 by default), which tolerates the table's
      learning rates up to 0.1.
    * **Learning-rate decay.** Keras' time-based decay, whose typical values match the table's
      range [1e-7, 1e-3]: after t minibatch updates the rate is ``learning_rate / (1 + lr_decay * t)``.
    * **L2 regularisation.** Keras semantics, a penalty ``l2 * sum(W**2)`` over weight tensors (not
      biases) added to the loss, i.e. SGD weight decay ``2 * l2`` on the weights.
    * **Grid.** Integer parameters must lie on the table's step grid (a batch size of 40 is rejected).
    * **Score.** Error on the fixed test split (as in the papers, "test classification error"). A run
      whose loss becomes non-finite stops early; its non-finite predictions count as errors.

    Determinism: a `torch.Generator` seeded with the evaluation's seed draws the initial weights and
    each epoch's minibatch order; deterministic algorithms are switched on during the run (and restored
    after), so on the CPU the same seed and thread count give the same value bit for bit. On a GPU
    determinism is best effort (cuDNN deterministic mode; ops without a deterministic kernel warn).

    Args:
        dataset: ``"digits"`` (scikit-learn's 8x8 digits, built in; the default), ``"cifar10"`` or
            ``"svhn"`` (read from `data_dir`; see `objectives.datasets`).
        data_dir: local directory of CIFAR-10 or SVHN files; nothing is ever downloaded.
        check_data: check that `data_dir` holds the dataset's files when the objective is built, i.e. before a
            run starts (the driver and the central actor build it too). False for a folder that exists only on
            the worker nodes of a cluster: a missing file then fails each evaluation instead.
        epochs: passes over the training set (6 by default: on digits, 1-10 s per evaluation on one
            CPU core, and test error ~0.02-0.05 at good settings).
        device: ``None`` (a GPU when the evaluation has one, else the CPU), ``"cpu"`` or ``"cuda"``.
        num_cpus: CPUs one evaluation asks the cluster for.
        num_gpus: GPUs (may be fractional) one evaluation asks the cluster for; 0 by default.
        memory: bytes of memory one evaluation asks the cluster for (Ray's `memory`); None (default) asks for
            none, so Ray packs evaluations by CPUs alone. CIFAR-10 and SVHN hold their training set in every
            worker (about 0.2 and 0.25 GB of uint8 images; float32 batches come on top): give it on small
            nodes.
        num_threads: torch CPU threads during an evaluation; default ``int(num_cpus)``.
        momentum: SGD momentum in [0, 1).
        conv_layers: number of conv blocks (1 to 4; the image must stay at least 1x1 after pooling).
        n_train: train on this many images of the training set (a fixed random subset, the same in every
            evaluation and worker: `TRAIN_SUBSET_SEED`), or None (default) for all of it. Cuts an evaluation's
            cost on CIFAR-10 or SVHN (50,000 and 73,257 images) where a CPU cluster cannot train on all of
            them; the test set stays whole. More than the training set holds is refused when the data are
            loaded (at once for digits, whose training set has 1,257 images).
    """

    name = "cnn"
    path_options = ("data_dir",)
    direction = "minimize"
    noisy = True
    space = CNN_SPACE

    def __init__(
        self,
        dataset: str = "digits",
        data_dir: str | os.PathLike[str] | None = None,
        epochs: int = 6,
        device: str | None = None,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        num_threads: int | None = None,
        momentum: float = 0.9,
        conv_layers: int = 2,
        memory: int | None = None,
        check_data: bool = True,
        n_train: int | None = None,
    ) -> None:
        check_choice("dataset", dataset, IMAGE_DATASETS)
        check_int("epochs", epochs, 1)
        if device not in (None, "cpu", "cuda") and not (
            isinstance(device, str) and device.startswith("cuda:")
        ):
            raise ObjectiveError(f"option 'device' must be None, 'cpu', 'cuda' or 'cuda:N'; got {device!r}")
        num_cpus = check_float("num_cpus", num_cpus, 0.0, low_open=True)
        num_gpus = check_float("num_gpus", num_gpus, 0.0)
        if isinstance(device, str) and device.startswith("cuda") and num_gpus == 0:
            # an evaluation that asks for no GPU sees an empty CUDA_VISIBLE_DEVICES (qbatch sets Ray's
            # RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO, workers/evaluate.py): every evaluation would fail
            raise ObjectiveError(f"option 'device'={device!r} needs option 'num_gpus' > 0 (an evaluation "
                                 "sees no GPU unless it asks for one); got num_gpus=0")
        if isinstance(device, str) and device.startswith("cuda:"):
            # Ray numbers the GPUs it gives a task from 0: a task of num_gpus g sees cuda:0 .. cuda:ceil(g)-1
            index = device[len("cuda:"):]
            if not index.isdigit() or int(index) >= math.ceil(num_gpus):
                raise ObjectiveError(f"option 'device'={device!r}: an evaluation with num_gpus={num_gpus:g} "
                                     f"sees cuda:0 to cuda:{math.ceil(num_gpus) - 1} (Ray numbers a task's "
                                     "GPUs from 0)")
        check_int("num_threads", num_threads, 1, optional=True)
        momentum = check_float("momentum", momentum, 0.0, 1.0, high_open=True)
        check_int("conv_layers", conv_layers, 1, 4)
        check_int("n_train", n_train, 1, optional=True)
        self.n_train = None if n_train is None else int(n_train)
        data_dir = check_path("data_dir", data_dir)
        self.dataset = dataset
        self.data_dir = None if data_dir is None else str(data_dir)
        self.epochs = epochs
        self.device = device
        self.num_threads = num_threads if num_threads is not None else max(1, int(num_cpus))
        self.momentum = float(momentum)
        self.conv_layers = conv_layers
        check_int("memory", memory, 1, optional=True)
        self.resources = Resources(num_cpus=float(num_cpus), num_gpus=float(num_gpus), memory=memory)
        if dataset != "digits" and data_dir is None:
            raise ObjectiveError(f"option 'data_dir' is required for dataset {dataset!r} (nothing is "
                                 "downloaded)")
        if dataset == "digits" and data_dir is not None:
            raise ObjectiveError("option 'data_dir' must be None for dataset 'digits' (it ships with "
                                 "scikit-learn)")
        if not isinstance(check_data, bool):
            raise ObjectiveError(f"option 'check_data' must be true or false; got {check_data!r}")
        # the files are there (not read): a wrong folder is refused now, not at every evaluation
        if check_data:
            try:
                check_image_source(dataset, data_dir)
            except DatasetError as exc:
                raise DatasetError(f"option 'data_dir': {exc} (option 'check_data': false if it exists only "
                                   "on the worker nodes)") from None
        # the known image sides: a too deep network is refused here, before any run starts
        self._check_side(_IMAGE_SIDE[dataset])
        self._data: ImageDataset | None = None
        self._tensors: dict[str, Any] = {}
        # built in and small: a too large n_train fails now
        if dataset == "digits" and self.n_train is not None:
            _ = self.data

    # the loaded data stays behind when the objective is shipped to a worker; each worker loads its own
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_data"] = None
        state["_tensors"] = {}
        return state

    @property
    def data(self) -> ImageDataset:
        """The data set, loaded on first use."""
        if self._data is None:
            data = load_image_dataset(self.dataset, self.data_dir)
            self._check_side(min(data.image_shape[1:]))  # before caching: every later access must fail too
            if self.n_train is not None:
                n = data.X_train.shape[0]
                if self.n_train > n:
                    raise ObjectiveError(f"option 'n_train'={self.n_train} exceeds the {n} training images "
                                         f"of dataset {self.dataset!r}")
                keep = np.sort(np.random.default_rng(TRAIN_SUBSET_SEED).permutation(n)[: self.n_train])
                data = dataclasses.replace(data, X_train=data.X_train[keep], y_train=data.y_train[keep])
            self._data = data
        return self._data

    def _check_side(self, side: int) -> None:
        if side < 2**self.conv_layers:
            raise ObjectiveError(
                f"option 'conv_layers'={self.conv_layers} pools {self.dataset!r} images of side {side} below "
                "1x1"
            )

    def _device(self) -> Any:
        import torch

        if self.device is None:
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ObjectiveError(f"option 'device'={self.device!r} but no CUDA device is available here")
        return torch.device(self.device)

    def _device_tensors(self, device: Any) -> dict[str, Any]:
        import torch

        key = str(device)
        if key not in self._tensors:
            data = self.data
            mean, std = data.channel_stats()
            shape = (1, -1, 1, 1)
            self._tensors[key] = {
                "X_train": torch.from_numpy(data.X_train).to(device),
                "y_train": torch.from_numpy(data.y_train).to(device),
                "X_test": torch.from_numpy(data.X_test).to(device),
                "y_test": torch.from_numpy(data.y_test).to(device),
                "scale": float(data.pixel_scale),
                "mean": torch.tensor(mean, dtype=torch.float32, device=device).reshape(shape),
                "std": torch.tensor(std, dtype=torch.float32, device=device).reshape(shape),
            }
        return self._tensors[key]

    def build_model(self, conv_channels: int, fc_units: int, generator: Any) -> Any:
        """The network for this data set, initialised from `generator` (a CPU `torch.Generator`)."""
        import torch
        from torch import nn

        c, h, w = self.data.image_shape
        layers: list[nn.Module] = []
        in_ch = c
        for _ in range(self.conv_layers):
            layers += [nn.Conv2d(in_ch, conv_channels, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            in_ch = conv_channels
            h, w = h // 2, w // 2
        layers += [
            nn.Flatten(),
            nn.Linear(conv_channels * h * w, fc_units),
            nn.ReLU(),
            nn.Linear(fc_units, self.data.num_classes),
        ]
        model = nn.Sequential(*layers)
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, (nn.Conv2d, nn.Linear)):
                    # PyTorch's default initialisation of these layers, drawn from the seeded generator
                    nn.init.kaiming_uniform_(m.weight, a=math.sqrt(5), generator=generator)
                    fan_in = m.weight[0].numel()
                    bound = 1.0 / math.sqrt(fan_in)
                    nn.init.uniform_(m.bias, -bound, bound, generator=generator)
        return model

    def evaluate(self, params: Mapping[str, Any], seed: int) -> EvalResult:
        """Train at `params` with `seed`; value = held-out classification error in [0, 1]."""
        import torch

        device = self._device()
        prev_threads = torch.get_num_threads()
        prev_det = torch.are_deterministic_algorithms_enabled()
        prev_det_warn = torch.is_deterministic_algorithms_warn_only_enabled()
        prev_cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
        if device.type == "cuda":
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
        torch.set_num_threads(self.num_threads)
        torch.use_deterministic_algorithms(True, warn_only=device.type == "cuda")
        try:
            return self._train(params, int(seed), device)
        finally:
            torch.use_deterministic_algorithms(prev_det, warn_only=prev_det_warn)
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = prev_cudnn
            torch.set_num_threads(prev_threads)

    def _train(self, params: Mapping[str, Any], seed: int, device: Any) -> EvalResult:
        import torch
        from torch import nn

        batch_size = int(round(float(params["batch_size"])))
        lr = float(params["learning_rate"])
        lr_decay = float(params["lr_decay"])
        l2 = float(params["l2"])
        fc_units = int(round(float(params["fc_units"])))
        conv_channels = int(round(float(params["conv_channels"])))

        t0 = time.perf_counter()
        data = self._device_tensors(device)
        gen = torch.Generator(device="cpu").manual_seed(seed)
        model = self.build_model(conv_channels, fc_units, gen).to(device)
        weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
        biases = [p for n, p in model.named_parameters() if not n.endswith("weight")]
        opt = torch.optim.SGD(
            [{"params": weights, "weight_decay": 2.0 * l2}, {"params": biases, "weight_decay": 0.0}],
            lr=lr,
            momentum=self.momentum,
        )
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1.0 / (1.0 + lr_decay * t))
        loss_fn = nn.CrossEntropyLoss()

        def prep(x: torch.Tensor) -> torch.Tensor:
            return (x.float() / data["scale"] - data["mean"]) / data["std"]

        n = data["X_train"].shape[0]
        epochs_done, last_loss, diverged = 0, float("nan"), False
        model.train()
        for _ in range(self.epochs):
            order = torch.randperm(n, generator=gen).to(device)
            loss_sum = torch.zeros((), device=device, dtype=torch.float64)
            for start in range(0, n, batch_size):
                idx = order[start : start + batch_size]
                loss = loss_fn(model(prep(data["X_train"][idx])), data["y_train"][idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
                loss_sum += loss.detach().double() * idx.numel()
            last_loss = float(loss_sum) / n
            epochs_done += 1
            if not math.isfinite(last_loss):
                diverged = True
                break
        train_time = time.perf_counter() - t0

        model.eval()
        wrong = 0
        X_te, y_te = data["X_test"], data["y_test"]
        with torch.no_grad():
            for start in range(0, X_te.shape[0], _EVAL_BATCH):
                logits = model(prep(X_te[start : start + _EVAL_BATCH]))
                ok = ((logits.argmax(dim=1) == y_te[start : start + _EVAL_BATCH])
                      & torch.isfinite(logits).all(dim=1))
                wrong += int((~ok).sum())
        error = wrong / int(X_te.shape[0])
        return EvalResult(
            value=float(error),
            metrics={
                "train_time_s": float(train_time),
                "eval_time_s": float(time.perf_counter() - t0 - train_time),
                "final_train_loss": float(last_loss),
                "epochs": float(epochs_done),
                "diverged": float(diverged),
                "used_gpu": float(device.type == "cuda"),
            },
        )
