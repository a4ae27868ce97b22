"""Dataset loaders for the machine-learning objectives (calibrated-bo.md §2.3).

The papers tune a CNN on CIFAR-10 and SVHN and online LDA on 20 Newsgroups. Nothing here downloads:
CIFAR-10, SVHN and 20 Newsgroups are read from a directory the user gives, in their official formats.
The defaults ship inside installed packages: scikit-learn's 8x8 digits images for the CNN and
gensim's Lee background corpus (300 news articles) for LDA. Every split is fixed (it does not depend
on an evaluation's seed), so all evaluations of one objective are scored on the same held-out data.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from objectives.base import ObjectiveError

__all__ = [
    "DatasetError",
    "check_image_source",
    "check_text_source",
    "ImageDataset",
    "TextCorpus",
    "IMAGE_DATASETS",
    "TEXT_CORPORA",
    "load_cifar10",
    "load_digits",
    "load_image_dataset",
    "load_lee",
    "load_newsgroups",
    "load_svhn",
    "load_text_corpus",
]

#: image dataset names accepted by `load_image_dataset`
IMAGE_DATASETS = ("digits", "cifar10", "svhn")
#: text corpus names accepted by `load_text_corpus`
TEXT_CORPORA = ("lee", "20newsgroups")

CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_FILE = "test_batch"
SVHN_TRAIN_FILE = "train_32x32.mat"
SVHN_TEST_FILE = "test_32x32.mat"
#: the local image datasets: display name and the files their loaders read (train first)
_IMAGE_FILES = {"cifar10": ("CIFAR-10", (*CIFAR10_TRAIN_FILES, CIFAR10_TEST_FILE)),
                "svhn": ("SVHN", (SVHN_TRAIN_FILE, SVHN_TEST_FILE))}
#: the folder `cifar-10-python.tar.gz` unpacks to
CIFAR10_DIR = "cifar-10-batches-py"
NEWSGROUPS_TRAIN_DIR = "20news-bydate-train"
NEWSGROUPS_TEST_DIR = "20news-bydate-test"
#: the folder `20news-18828.tar.gz` unpacks to (duplicates removed, headers but From and Subject dropped)
NEWSGROUPS_18828_DIR = "20news-18828"
#: the papers' fixed split of 20 Newsgroups ([A] App. A.5): training and held-out documents
NEWSGROUPS_SPLIT = (11000, 2200)


class DatasetError(ObjectiveError):
    """A dataset cannot be loaded: a missing directory or file (named in the message) or a bad format."""


@dataclass
class ImageDataset:
    """A classification data set with a fixed train/test split.

    Attributes:
        name: data set name.
        X_train: `n_train x c x h x w` array, `uint8` pixels (CIFAR-10, SVHN) or `float32` in [0, 1] (digits).
        y_train: `n_train` int64 labels in `[0, num_classes)`.
        X_test: `n_test x c x h x w` array, same dtype as `X_train`.
        y_test: `n_test` int64 labels.
        num_classes: number of classes.
        pixel_scale: divide pixels by this to get values in [0, 1] (255 for `uint8`, 1 for digits).
    """

    name: str
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    pixel_scale: float

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """`(c, h, w)` of one image."""
        return tuple(int(s) for s in self.X_train.shape[1:])  # type: ignore[return-value]

    def channel_stats(self, chunk: int = 256) -> tuple[np.ndarray, np.ndarray]:
        """Per-channel mean and standard deviation of the training images, in [0, 1] pixel units.

        Sums over `chunk` images at a time: a float64 copy of the whole set (1.2 GB for CIFAR-10's 50,000
        uint8 images, in every CNN evaluation's worker) is never made.
        """
        total = np.zeros(self.X_train.shape[1])
        squares = np.zeros(self.X_train.shape[1])
        for i in range(0, len(self.X_train), chunk):
            x = self.X_train[i : i + chunk].astype(np.float64) / self.pixel_scale
            total += x.sum(axis=(0, 2, 3))
            squares += np.einsum("nchw,nchw->c", x, x)
        count = max(1, self.X_train.shape[0] * self.X_train.shape[2] * self.X_train.shape[3])
        mean = total / count
        std = np.sqrt(np.maximum(squares / count - mean * mean, 0.0))
        return mean, np.maximum(std, 1e-6)


@dataclass
class TextCorpus:
    """Raw documents with a fixed train/test split (tokenisation is left to the model)."""

    name: str
    train: list[str]
    test: list[str]


def _require_dir(path: str | os.PathLike[str], what: str) -> Path:
    p = Path(path).expanduser()
    # the archive itself, or one of the dataset's files: the message says what to give instead
    if p.is_file():
        raise DatasetError(f"{what} directory {str(p)!r} is a file; give the directory that holds the "
                           "dataset's files (extract an archive first: nothing is unpacked or downloaded "
                           "here)")
    if not p.is_dir():
        raise DatasetError(f"{what} directory {str(p)!r} does not exist or is not a directory")
    return p


def _require_file(directory: Path, filename: str, what: str) -> Path:
    p = directory / filename
    if not p.is_file():
        raise DatasetError(f"{what} file {str(p)!r} is missing (expected {filename!r} in {str(directory)!r})")
    return p


def _required_files(name: str, data_dir: str | os.PathLike[str]) -> list[Path]:
    """The files of local image dataset `name` in `data_dir`, in `_IMAGE_FILES` order; DatasetError naming the
    directory or the first file that is missing."""
    what, filenames = _IMAGE_FILES[name]
    d = _require_dir(data_dir, what)
    if name == "cifar10" and not (d / filenames[0]).exists() and (d / CIFAR10_DIR / filenames[0]).is_file():
        raise DatasetError(f"CIFAR-10 directory {str(d)!r} holds the batches in {CIFAR10_DIR!r}: give "
                           f"{str(d / CIFAR10_DIR)!r} as data_dir")
    return [_require_file(d, filename, what) for filename in filenames]


def load_digits(test_fraction: float = 0.3, split_seed: int = 0) -> ImageDataset:
    """scikit-learn's handwritten digits (1797 images, `1 x 8 x 8`, 10 classes), stratified fixed split.

    Pixels (0..16 in the source) are scaled to [0, 1]. With the defaults, 1257 images train and 540 test.

    Args:
        test_fraction: fraction of images held out for testing, in (0, 1).
        split_seed: seed of the stratified split; fixed so every evaluation sees the same test set.
    """
    from sklearn.datasets import load_digits as _sk_load_digits
    from sklearn.model_selection import train_test_split

    if not 0.0 < test_fraction < 1.0:
        raise DatasetError(f"test_fraction must be in (0, 1); got {test_fraction!r}")
    bunch = _sk_load_digits()
    X = (bunch.images.astype(np.float32) / 16.0)[:, None, :, :]
    y = bunch.target.astype(np.int64)
    X_tr, X_te, y_tr, y_te = train_test_split(
        X, y, test_size=test_fraction, stratify=y, random_state=split_seed
    )
    return ImageDataset("digits", X_tr, y_tr, X_te, y_te, num_classes=10, pixel_scale=1.0)


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    # The official CIFAR-10 "python version" is a pickled dict with bytes keys (written by Python 2),
    # so it needs encoding="bytes". Unpickling runs code from the file: only user-given local files.
    with open(path, "rb") as f:
        try:
            batch = pickle.load(f, encoding="bytes")
        except Exception as exc:  # noqa: BLE001 - any unpickling failure is a format error
            raise DatasetError(f"CIFAR-10 file {str(path)!r} is not a CIFAR-10 python pickle: {exc}") from exc
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise DatasetError(f"CIFAR-10 file {str(path)!r} lacks b'data'/b'labels' (found {keys})")
    # as stored: uint8 pixels and integer labels (a cast would wrap 300 to 44 and floats in [0, 1] to 0/1, and
    # the CNN would train on that without a word)
    data = np.asarray(batch[b"data"])
    labels = np.asarray(batch[b"labels"])
    if data.dtype != np.uint8:
        raise DatasetError(f"CIFAR-10 file {str(path)!r}: b'data' must hold uint8 pixels; got dtype "
                           f"{data.dtype}")
    if labels.dtype.kind not in "iu":
        raise DatasetError(f"CIFAR-10 file {str(path)!r}: b'labels' must be integers; got dtype "
                           f"{labels.dtype}")
    labels = labels.astype(np.int64)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or data.shape[0] != labels.shape[0]:
        raise DatasetError(
            f"CIFAR-10 file {str(path)!r}: expected data `n x 3072` and n labels; "
            f"got data {data.shape} and {labels.shape[0]} labels"
        )
    # rows hold the red, green and blue 32x32 planes one after another, each row-major
    return data.reshape(-1, 3, 32, 32), labels


def load_cifar10(data_dir: str | os.PathLike[str]) -> ImageDataset:
    """CIFAR-10 from the official python-pickle batches in a local directory (never downloads).

    The directory (usually ``cifar-10-batches-py``) must hold ``data_batch_1`` .. ``data_batch_5`` and
    ``test_batch``. These files are Python pickles, the format in which the dataset is distributed; they
    are read with ``pickle.load(f, encoding="bytes")``. Unpickling can run arbitrary code, which is
    acceptable only because it is the dataset's official format and the path is one the user gave:
    never point this at files from an untrusted source.

    Args:
        data_dir: directory holding the six batch files.

    Returns:
        `ImageDataset` with `uint8` images `n x 3 x 32 x 32` (50000 train, 10000 test for the real set).

    Raises:
        DatasetError: naming the directory or the file that is missing or malformed.
    """
    paths = _required_files("cifar10", data_dir)
    parts = [_read_cifar_batch(p) for p in paths]
    X_tr = np.concatenate([x for x, _ in parts[:-1]])
    y_tr = np.concatenate([y for _, y in parts[:-1]])
    X_te, y_te = parts[-1]
    for p, (_, y) in zip(paths, parts):
        if y.size and (y.min() < 0 or y.max() > 9):
            raise DatasetError(f"CIFAR-10 file {str(p)!r} has labels outside 0..9")
    return ImageDataset("cifar10", X_tr, y_tr, X_te, y_te, num_classes=10, pixel_scale=255.0)


def _read_svhn_mat(path: Path) -> tuple[np.ndarray, np.ndarray]:
    from scipy.io import loadmat

    try:
        mat = loadmat(str(path))
    except Exception as exc:  # noqa: BLE001 - scipy raises several types for bad files
        raise DatasetError(f"SVHN file {str(path)!r} is not a readable .mat file: {exc}") from exc
    if "X" not in mat or "y" not in mat:
        raise DatasetError(f"SVHN file {str(path)!r} lacks the 'X' and 'y' arrays")
    X = np.asarray(mat["X"])
    y = np.asarray(mat["y"]).reshape(-1)
    if X.dtype != np.uint8:  # as the official files store them; a cast would wrap or truncate
        raise DatasetError(f"SVHN file {str(path)!r}: 'X' must hold uint8 pixels; got dtype {X.dtype}")
    if y.dtype.kind == "f" and y.size and not np.all(np.isfinite(y) & (y == np.round(y))):
        raise DatasetError(f"SVHN file {str(path)!r}: 'y' must hold whole-number labels 1..10")
    if y.dtype.kind not in "iuf":
        raise DatasetError(f"SVHN file {str(path)!r}: 'y' must hold numbers; got dtype {y.dtype}")
    y = y.astype(np.int64)
    if X.ndim != 4 or X.shape[:3] != (32, 32, 3) or X.shape[3] != y.shape[0]:
        raise DatasetError(
            f"SVHN file {str(path)!r}: expected X `32 x 32 x 3 x n` and n labels; got X {X.shape}, "
            f"{y.shape[0]} labels"
        )
    if y.size and (y.min() < 1 or y.max() > 10):
        raise DatasetError(f"SVHN file {str(path)!r} has labels outside 1..10")
    # SVHN stores the digit 0 as label 10
    y = np.where(y == 10, 0, y)
    X = np.ascontiguousarray(np.transpose(X, (3, 2, 0, 1)))
    return X, y


def load_svhn(data_dir: str | os.PathLike[str]) -> ImageDataset:
    """SVHN (cropped digits, format 2) from ``train_32x32.mat`` and ``test_32x32.mat`` (never downloads).

    The .mat files hold ``X`` (`32 x 32 x 3 x n`, uint8) and ``y`` (`n x 1`, 1..10, where 10 means the
    digit 0); they are read with `scipy.io.loadmat`, images become `n x 3 x 32 x 32` and label 10 becomes 0.
    The "extra" split is not used.

    Raises:
        DatasetError: naming the directory or the file that is missing or malformed.
    """
    tr, te = _required_files("svhn", data_dir)
    X_tr, y_tr = _read_svhn_mat(tr)
    X_te, y_te = _read_svhn_mat(te)
    return ImageDataset("svhn", X_tr, y_tr, X_te, y_te, num_classes=10, pixel_scale=255.0)


def _check_image_args(name: str, data_dir: str | os.PathLike[str] | None) -> None:
    """DatasetError unless `name` is a known image dataset given a `data_dir` exactly when it needs one."""
    if name == "digits":
        if data_dir is not None:
            raise DatasetError("dataset 'digits' ships with scikit-learn and takes no data_dir")
    elif name in _IMAGE_FILES:
        if data_dir is None:
            raise DatasetError(f"dataset {name!r} needs data_dir (a local directory; nothing is downloaded)")
    else:
        raise DatasetError(f"unknown image dataset {name!r}; choose one of {list(IMAGE_DATASETS)}")


def check_image_source(name: str, data_dir: str | os.PathLike[str] | None = None) -> None:
    """Check, without reading them, that the files `load_image_dataset(name, data_dir)` needs are there.

    Objectives call it when they are built, so a wrong `data_dir` is refused before a run starts rather
    than at every evaluation. The check runs where the objective is built (the machine that starts the
    run): a path must exist there as well as on the workers.

    Raises:
        DatasetError: naming the directory or the file that is missing.
    """
    _check_image_args(name, data_dir)
    if name in _IMAGE_FILES:
        _required_files(name, data_dir)


def load_image_dataset(name: str, data_dir: str | os.PathLike[str] | None = None) -> ImageDataset:
    """Load an image data set by name: ``"digits"`` (built in), ``"cifar10"`` or ``"svhn"`` (need
    `data_dir`)."""
    _check_image_args(name, data_dir)
    if name == "digits":
        return load_digits()
    return load_cifar10(data_dir) if name == "cifar10" else load_svhn(data_dir)


def _split_fixed(docs: list[str], n_train: int | None, n_test: int, split_seed: int, what: str) -> TextCorpus:
    # identical documents (the Lee corpus repeats 7) would leak from the training into the test split
    docs = list(dict.fromkeys(docs))
    n = len(docs)
    if n_test < 1 or n_test >= n:
        raise DatasetError(f"{what}: n_test must be in [1, {n - 1}] for {n} documents; got {n_test}")
    n_train = n - n_test if n_train is None else n_train
    if n_train < 1 or n_train + n_test > n:
        raise DatasetError(f"{what}: n_train + n_test must be at most {n} documents; got {n_train} + "
                           f"{n_test}")
    perm = np.random.default_rng(split_seed).permutation(n)
    test = [docs[i] for i in perm[:n_test]]
    train = [docs[i] for i in perm[n_test : n_test + n_train]]
    return TextCorpus(what, train, test)


def _gensim_test_file(name: str) -> Path:
    """Path of a file in gensim's bundled test data: what `gensim.test.utils.datapath(name)` returns,
    found without importing gensim (which takes seconds)."""
    import importlib.util

    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError("corpus 'lee' ships with gensim, which is not installed (pip install "
                           "'qbatch[lda]')")
    path = Path(list(spec.submodule_search_locations)[0]) / "test" / "test_data" / name
    if not path.is_file():
        raise DatasetError(f"gensim's test-data file {str(path)!r} is missing; reinstall gensim")
    return path


def load_lee(n_train: int | None = None, n_test: int = 60, split_seed: int = 0) -> TextCorpus:
    """gensim's Lee background corpus (300 news articles, one per line), with a fixed random split.

    The file repeats 7 articles; duplicates are dropped, leaving 293 distinct documents.

    Args:
        n_train: training documents (``None``: all 233 that are not held out, by default).
        n_test: documents held out for perplexity.
        split_seed: seed of the fixed split.
    """
    path = _gensim_test_file("lee_background.cor")
    docs = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines()]
    docs = [d for d in docs if d]
    return _split_fixed(docs, n_train, n_test, split_seed, "lee")


def _read_newsgroup_file(path: Path) -> str:
    text = path.read_text(encoding="latin-1")
    # drop the mail header block (From:, Subject:, ...): it ends at the first blank line
    head, sep, body = text.partition("\n\n")
    return body if sep else text


def load_newsgroups(
    data_dir: str | os.PathLike[str],
    n_train: int | None = NEWSGROUPS_SPLIT[0],
    n_test: int = NEWSGROUPS_SPLIT[1],
    split_seed: int = 0,
) -> TextCorpus:
    """20 Newsgroups from plain text files (never downloads), in the "bydate" or the "18828" layout.

    `data_dir` holds ``20news-bydate-train/`` and/or ``20news-bydate-test/`` (as unpacked from
    ``20news-bydate.tar.gz``), or else ``20news-18828/`` (from ``20news-18828.tar.gz``), each with one
    sub-directory per group and one file per message. The bydate folders are read when present (the two
    versions hold mostly the same messages: they are never pooled).
    As in the papers ([A] App. A.5), all messages are pooled and a fixed random 11,000 train and
    2,200 test documents are drawn. Mail headers (up to the first blank line) and exact duplicate
    documents are dropped.

    Args:
        data_dir: the directory described above.
        n_train: number of training documents (``None``: all that are not test documents).
        n_test: number of held-out documents.
        split_seed: seed of the fixed split.

    Raises:
        DatasetError: naming the directory that is missing or holds no documents.
    """
    d = Path(data_dir).expanduser()
    present = _newsgroup_parts(d)
    files = _newsgroup_files(present)
    if not files:
        raise DatasetError(f"20 Newsgroups directory {str(d)!r} has no documents under "
                           f"{[p.name for p in present]}")
    docs = [_read_newsgroup_file(f) for f in files]
    return _split_fixed(docs, n_train, n_test, split_seed, "20newsgroups")


def _newsgroup_parts(data_dir: str | os.PathLike[str]) -> list[Path]:
    """The bydate folders present in `data_dir`, or else its 18828 folder (one of them, else DatasetError)."""
    d = _require_dir(data_dir, "20 Newsgroups")
    present = [p for p in (d / NEWSGROUPS_TRAIN_DIR, d / NEWSGROUPS_TEST_DIR) if p.is_dir()]
    if not present and (d / NEWSGROUPS_18828_DIR).is_dir():
        present = [d / NEWSGROUPS_18828_DIR]
    if not present:
        hint = (f"; it is one of them itself: give its parent {str(d.parent)!r}"
                if d.name in (NEWSGROUPS_TRAIN_DIR, NEWSGROUPS_TEST_DIR, NEWSGROUPS_18828_DIR) else "")
        raise DatasetError(f"20 Newsgroups directory {str(d)!r} holds neither {NEWSGROUPS_TRAIN_DIR!r} nor "
                           f"{NEWSGROUPS_TEST_DIR!r} (from 20news-bydate.tar.gz) nor "
                           f"{NEWSGROUPS_18828_DIR!r} (from 20news-18828.tar.gz){hint}")
    return present


def _newsgroup_files(parts: list[Path]) -> list[Path]:
    """The message files of the folders `parts` (`<group>/<file>`), sorted; hidden files (a `.DS_Store`,
    macOS `._` forks) are not messages and are not read as documents."""
    return sorted(f for p in parts for f in p.glob("*/*")
                  if f.is_file() and not f.name.startswith(".") and not f.parent.name.startswith("."))


def _check_text_args(name: str, data_dir: str | os.PathLike[str] | None) -> None:
    """DatasetError unless `name` is a known corpus given a `data_dir` exactly when it needs one."""
    if name == "lee":
        if data_dir is not None:
            raise DatasetError("corpus 'lee' ships with gensim and takes no data_dir")
    elif name == "20newsgroups":
        if data_dir is None:
            raise DatasetError("corpus '20newsgroups' needs data_dir (a local directory; nothing is "
                               "downloaded)")
    else:
        raise DatasetError(f"unknown text corpus {name!r}; choose one of {list(TEXT_CORPORA)}")


def check_text_source(name: str, data_dir: str | os.PathLike[str] | None = None, **split: int | None) -> None:
    """Check what `load_text_corpus(name, data_dir, **split)` needs before any evaluation: the bundled Lee
    corpus and its split sizes (the file is small: it is read and split), or the 20 Newsgroups folder layout
    and its document count against the split sizes (files are counted, not read: duplicates dropped at load
    can still make the split fail then).

    Raises:
        DatasetError: naming the option, the directory or the file that is wrong.
    """
    _check_text_args(name, data_dir)
    if name == "lee":
        load_lee(**split)  # type: ignore[arg-type]
        return
    try:
        present = _newsgroup_parts(data_dir)  # type: ignore[arg-type]
    except DatasetError as exc:
        raise DatasetError(f"option 'data_dir': {exc}") from None
    # the files are counted, not read: duplicates dropped at load can still make the split fail there
    n_files = len(_newsgroup_files(present))
    n_train, n_test = split.get("n_train", NEWSGROUPS_SPLIT[0]), split.get("n_test", NEWSGROUPS_SPLIT[1])
    need = (n_train or 1) + (n_test or 0)
    if n_files < need:
        raise DatasetError(
            f"option 'data_dir': {str(data_dir)!r} holds {n_files} documents under "
            f"{[p.name for p in present]}; the split needs n_train + n_test = {need} (options 'n_train', "
            f"'n_test'; the defaults {NEWSGROUPS_SPLIT[0]} + {NEWSGROUPS_SPLIT[1]} need both bydate folders, "
            f"or {NEWSGROUPS_18828_DIR!r})"
        )


def load_text_corpus(
    name: str, data_dir: str | os.PathLike[str] | None = None, **split: int | None
) -> TextCorpus:
    """Load a text corpus by name: ``"lee"`` (built in) or ``"20newsgroups"`` (needs `data_dir`)."""
    _check_text_args(name, data_dir)
    if name == "lee":
        return load_lee(**split)  # type: ignore[arg-type]
    return load_newsgroups(data_dir, **split)  # type: ignore[arg-type]
