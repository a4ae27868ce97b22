"""Dataset loaders read the real on-disk formats and name what is missing (objectives/datasets.py)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from objectives.base import ObjectiveError
from objectives.datasets import (
    CIFAR10_TEST_FILE,
    CIFAR10_TRAIN_FILES,
    DatasetError,
    check_text_source,
    load_cifar10,
    load_digits,
    load_image_dataset,
    load_lee,
    load_newsgroups,
    load_svhn,
    load_text_corpus,
)


def _cifar_image(label: int, k: int) -> np.ndarray:
    """A distinct `3 x 32 x 32` uint8 image: channel c holds value 10*c + label + k everywhere but pixel (0,
    1)."""
    img = np.zeros((3, 32, 32), dtype=np.uint8)
    for c in range(3):
        img[c] = 10 * c + label + k
        img[c, 0, 1] = 200 + c  # marks row-major order inside each plane
    return img


def _write_cifar(directory: Path, n_per_batch: int = 4) -> dict[str, tuple[np.ndarray, list[int]]]:
    """Write CIFAR-10 python batches: a pickled dict with bytes keys, b'data' `n x 3072` uint8, b'labels'."""
    directory.mkdir(parents=True, exist_ok=True)
    written = {}
    for b, name in enumerate((*CIFAR10_TRAIN_FILES, CIFAR10_TEST_FILE)):
        labels = [(b + i) % 10 for i in range(n_per_batch)]
        images = np.stack([_cifar_image(lab, b) for lab in labels])
        batch = {
            b"batch_label": name.encode(),
            b"labels": labels,
            b"data": images.reshape(n_per_batch, 3072),  # the official layout: R plane, G plane, B plane
            b"filenames": [f"img{i}.png".encode() for i in range(n_per_batch)],
        }
        with open(directory / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)
        written[name] = (images, labels)
    return written


def test_cifar10_reads_official_pickle_layout(tmp_path: Path) -> None:
    written = _write_cifar(tmp_path / "cifar-10-batches-py")
    ds = load_cifar10(tmp_path / "cifar-10-batches-py")
    assert ds.X_train.shape == (20, 3, 32, 32) and ds.X_train.dtype == np.uint8
    assert ds.X_test.shape == (4, 3, 32, 32)
    assert ds.y_train.dtype == np.int64 and ds.num_classes == 10 and ds.pixel_scale == 255.0
    expected_train = np.concatenate([written[n][0] for n in CIFAR10_TRAIN_FILES])
    np.testing.assert_array_equal(ds.X_train, expected_train)
    np.testing.assert_array_equal(ds.y_train, sum((written[n][1] for n in CIFAR10_TRAIN_FILES), []))
    np.testing.assert_array_equal(ds.X_test, written[CIFAR10_TEST_FILE][0])
    # channel planes and row-major pixels land where they belong
    assert ds.X_test[0, 2, 0, 1] == 202 and ds.X_test[0, 1, 5, 5] == 10 + written[CIFAR10_TEST_FILE][1][0] + 5
    assert ds.image_shape == (3, 32, 32)


def test_cifar10_missing_directory_and_file_are_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(DatasetError, match="nowhere"):
        load_cifar10(missing)
    _write_cifar(tmp_path / "c")
    (tmp_path / "c" / "data_batch_3").unlink()
    with pytest.raises(DatasetError, match=r"data_batch_3"):
        load_cifar10(tmp_path / "c")
    assert issubclass(DatasetError, ObjectiveError)


def test_cifar10_bad_content_is_reported(tmp_path: Path) -> None:
    _write_cifar(tmp_path / "c")
    with open(tmp_path / "c" / "test_batch", "wb") as f:
        pickle.dump({b"data": np.zeros((2, 100), dtype=np.uint8), b"labels": [0, 1]}, f)
    with pytest.raises(DatasetError, match=r"test_batch.*3072"):
        load_cifar10(tmp_path / "c")


def _write_svhn(directory: Path, name: str, labels: list[int]) -> np.ndarray:
    """Write an SVHN .mat: X `32 x 32 x 3 x n` uint8 and y `n x 1` with 10 for the digit 0."""
    from scipy.io import savemat

    n = len(labels)
    X = np.zeros((32, 32, 3, n), dtype=np.uint8)
    for i in range(n):
        X[:, :, 0, i] = i
        X[:, :, 1, i] = 100 + i
        X[3, 7, 2, i] = 250  # row 3, column 7 of the blue channel
    directory.mkdir(parents=True, exist_ok=True)
    savemat(directory / name, {"X": X, "y": np.asarray(labels, dtype=np.uint8).reshape(-1, 1)})
    return X


def test_svhn_reads_mat_files_and_maps_label_10_to_0(tmp_path: Path) -> None:
    _write_svhn(tmp_path, "train_32x32.mat", [1, 10, 5, 10, 9])
    _write_svhn(tmp_path, "test_32x32.mat", [10, 3])
    ds = load_svhn(tmp_path)
    assert ds.X_train.shape == (5, 3, 32, 32) and ds.X_test.shape == (2, 3, 32, 32)
    assert ds.X_train.dtype == np.uint8
    np.testing.assert_array_equal(ds.y_train, [1, 0, 5, 0, 9])
    np.testing.assert_array_equal(ds.y_test, [0, 3])
    assert ds.X_train[4, 0, 10, 10] == 4 and ds.X_train[4, 1, 0, 0] == 104
    assert ds.X_train[1, 2, 3, 7] == 250 and ds.X_train[1, 2, 7, 3] == 0  # height, width not swapped


def test_svhn_missing_file_is_named(tmp_path: Path) -> None:
    _write_svhn(tmp_path, "train_32x32.mat", [1, 2])
    with pytest.raises(DatasetError, match=r"test_32x32\.mat"):
        load_svhn(tmp_path)
    with pytest.raises(DatasetError, match="no_such_dir"):
        load_svhn(tmp_path / "no_such_dir")


def test_digits_default_split_is_fixed_and_stratified() -> None:
    a, b = load_digits(), load_digits()
    assert a.X_train.shape == (1257, 1, 8, 8) and a.X_test.shape == (540, 1, 8, 8)
    assert a.X_train.dtype == np.float32 and 0.0 <= a.X_train.min() and a.X_train.max() <= 1.0
    np.testing.assert_array_equal(a.y_test, b.y_test)
    np.testing.assert_array_equal(a.X_test, b.X_test)
    test_counts = np.bincount(a.y_test, minlength=10)
    all_counts = test_counts + np.bincount(a.y_train, minlength=10)
    assert np.all(np.abs(test_counts - 0.3 * all_counts) <= 1.0)  # stratified: 30% of every class
    assert load_image_dataset("digits").name == "digits"


def test_image_dataset_dispatch_errors() -> None:
    with pytest.raises(DatasetError, match="unknown image dataset 'mnist'"):
        load_image_dataset("mnist")
    with pytest.raises(DatasetError, match="'cifar10' needs data_dir"):
        load_image_dataset("cifar10")


def test_lee_split_is_fixed_and_disjoint() -> None:
    c = load_lee()
    assert len(c.train) == 233 and len(c.test) == 60  # 300 lines, 7 repeated
    assert set(c.train).isdisjoint(c.test)
    assert load_lee().test == c.test
    assert len(load_lee(n_train=100, n_test=20).train) == 100


def _write_newsgroups(root: Path) -> None:
    for part in ("20news-bydate-train", "20news-bydate-test"):
        for group in ("sci.space", "rec.autos"):
            d = root / part / group
            d.mkdir(parents=True)
            for i in range(3):
                (d / str(1000 + i)).write_text(
                    f"From: someone@example.com\nSubject: {group} {part} {i}\n\nbody of {group} {part} "
                    f"message {i}\n",
                    encoding="latin-1",
                )


def test_newsgroups_reads_bydate_layout_and_drops_headers(tmp_path: Path) -> None:
    _write_newsgroups(tmp_path / "news")
    c = load_newsgroups(tmp_path / "news", n_train=8, n_test=4)
    assert len(c.train) == 8 and len(c.test) == 4
    docs = c.train + c.test
    assert all(d.startswith("body of ") for d in docs)
    assert not any("From:" in d for d in docs)
    assert len(set(docs)) == 12
    assert load_text_corpus("20newsgroups", tmp_path / "news", n_train=8, n_test=4).test == c.test


def test_newsgroups_reads_the_18828_layout_but_prefers_bydate(tmp_path: Path) -> None:
    """`20news-18828.tar.gz` unpacks to `20news-18828/<group>/<file>`, headers reduced to From and Subject:
    read alone, and never pooled with bydate folders beside it (mostly the same messages)."""
    root = tmp_path / "news"
    for group in ("sci.space", "rec.autos", "talk.politics.misc"):
        (root / "20news-18828" / group).mkdir(parents=True)
        for i in range(4):
            (root / "20news-18828" / group / str(50 + i)).write_text(
                f"From: a@b.c\nSubject: {group} {i}\n\n18828 body of {group} {i}\n", encoding="latin-1")
    c = load_newsgroups(root, n_train=9, n_test=3)
    docs = c.train + c.test
    assert len(set(docs)) == 12 and all(d.startswith("18828 body of ") for d in docs)
    check_text_source("20newsgroups", root, n_train=9, n_test=3)
    with pytest.raises(DatasetError, match=r"it is one of them itself: give its parent '.*news'"):
        load_newsgroups(root / "20news-18828")
    _write_newsgroups(root)  # bydate folders beside it: those are read, alone
    c = load_newsgroups(root, n_train=8, n_test=4)
    assert all(d.startswith("body of ") for d in c.train + c.test)


def test_newsgroups_missing_paths_are_named(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="absent_dir"):
        load_newsgroups(tmp_path / "absent_dir")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="20news-bydate-train"):
        load_newsgroups(tmp_path / "empty")
    _write_newsgroups(tmp_path / "small")
    with pytest.raises(DatasetError, match="n_test must be in \\[1, 11\\] for 12 documents; got 2200"):
        load_newsgroups(tmp_path / "small")  # the papers' 2,200 test documents do not fit
    with pytest.raises(DatasetError, match="n_train \\+ n_test must be at most 12 documents; got 11000 \\+ "
                                           "4"):
        load_newsgroups(tmp_path / "small", n_test=4)


def test_lee_file_is_the_one_gensim_names() -> None:
    from gensim.test.utils import datapath

    from objectives.datasets import _gensim_test_file

    assert str(_gensim_test_file("lee_background.cor")) == datapath("lee_background.cor")


def test_pixels_and_labels_that_are_not_as_stored_are_refused(tmp_path: Path) -> None:
    """Float pixels in [0, 1] are not cast to 0/1, ints do not wrap (300 -> 44), SVHN's 1.5 is not cut to 1,
    and bytes labels do not escape as numpy's ValueError with no path: the CNN never trains on garbage
    silently."""
    from scipy.io import savemat

    bad_cifar = [
        ({b"data": np.zeros((2, 3072)), b"labels": [0, 1]}, r"test_batch.*b'data' must hold uint8 pixels; "
                                                            r"got dtype float64"),
        ({b"data": np.full((2, 3072), 300), b"labels": [0, 1]}, r"uint8 pixels; got dtype int64"),
        ({b"data": np.zeros((2, 3072), dtype=np.uint8), b"labels": [b"cat", b"dog"]}, r"b'labels' must be "
                                                                                      r"integers"),
    ]
    for batch, match in bad_cifar:
        _write_cifar(tmp_path / "c")
        with open(tmp_path / "c" / "test_batch", "wb") as f:
            pickle.dump(batch, f)
        with pytest.raises(DatasetError, match=match):
            load_cifar10(tmp_path / "c")
    X = np.zeros((32, 32, 3, 2), dtype=np.uint8)
    for mat, match in [({"X": X.astype(np.float64), "y": np.array([[1], [2]])}, "'X' must hold uint8 pixels"),
                       ({"X": X, "y": np.array([[1.5], [2.0]])}, "'y' must hold whole-number labels")]:
        _write_svhn(tmp_path / "s", "train_32x32.mat", [1, 2])
        savemat(tmp_path / "s" / "test_32x32.mat", mat)
        with pytest.raises(DatasetError, match=match):
            load_svhn(tmp_path / "s")


def test_the_usual_wrong_folders_get_a_hint(tmp_path: Path) -> None:
    """The CIFAR parent folder, an archive, and the bydate-train folder itself get errors that say what to
    give instead."""
    _write_cifar(tmp_path / "cifar" / "cifar-10-batches-py")
    with pytest.raises(DatasetError, match=r"holds the batches in 'cifar-10-batches-py': give "
                                           r"'.*cifar-10-batches-py'"):
        load_cifar10(tmp_path / "cifar")
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"\x1f\x8b")
    with pytest.raises(DatasetError, match=r"is a file; .*extract an archive first"):
        load_cifar10(tmp_path / "cifar-10-python.tar.gz")
    _write_newsgroups(tmp_path / "news")
    with pytest.raises(DatasetError, match=r"it is one of them itself: give its parent '.*news'"):
        load_newsgroups(tmp_path / "news" / "20news-bydate-train")


def test_hidden_files_are_not_newsgroup_messages(tmp_path: Path) -> None:
    """A `.DS_Store` or macOS `._1000` in a group folder is not read as a document."""
    _write_newsgroups(tmp_path / "news")
    group = tmp_path / "news" / "20news-bydate-train" / "sci.space"
    (group / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1\x00")
    (group / "._1000").write_bytes(b"\x00\x05\x16\x07")
    c = load_newsgroups(tmp_path / "news", n_train=None, n_test=2)
    assert len(c.train) + len(c.test) == 12
    assert all(d.startswith("body of ") for d in c.train + c.test)
