"""Handwritten digits for the training notebooks, offline by default.

The course cannot download anything at run time, so the default data set is scikit-learn's
bundled 8x8 digits (1797 images, shipped inside the wheel). Users who have the real MNIST
IDX files (``train-images-idx3-ubyte`` and friends, optionally gzipped) point ``--data`` at
their folder and the same code trains on 28x28 MNIST.
"""

from __future__ import annotations

import gzip
import importlib.util
import struct
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte",
}
IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def load_dataset(spec: str = "digits") -> tuple[TensorDataset, TensorDataset]:
    """(train, test) for ``"digits"`` or a folder with the four MNIST IDX files."""
    if spec == "digits":
        return load_digits_split()
    folder = Path(spec).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(
            f"--data {spec!r}: not 'digits' and not a folder. Pass --data digits (bundled, "
            "offline) or a folder holding the MNIST IDX files "
            f"({', '.join(MNIST_FILES.values())}, optionally .gz).")
    return load_mnist_idx(folder)


def load_digits_split(test_fraction: float = 0.2, seed: int = 0):
    """scikit-learn's 8x8 digits as N x 1 x 8 x 8 floats in [0, 1], split reproducibly."""
    pixels, target = digits_arrays()
    images = torch.tensor(pixels, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(target, dtype=torch.int64)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    n_test = int(len(labels) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return TensorDataset(images[train], labels[train]), TensorDataset(images[test], labels[test])


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(images N x 8 x 8, labels N): what ``sklearn.datasets.load_digits()`` returns, read
    from the file it reads (``digits.csv.gz`` in scikit-learn's package, found without
    importing scikit-learn). Importing ``sklearn.datasets`` takes a second or more on
    these cores, in every rank that loads the data; reading the file takes milliseconds.
    A scikit-learn that keeps the file elsewhere gets the import."""
    spec = importlib.util.find_spec("sklearn")
    where = [Path(p) / "datasets" / "data" / "digits.csv.gz"
             for p in (spec.submodule_search_locations or [])] if spec else []
    found = next((p for p in where if p.is_file()), None)
    if found is None:
        from sklearn.datasets import load_digits
        digits = load_digits()
        return digits.images, digits.target
    table = np.loadtxt(found, delimiter=",")
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)


def load_mnist_idx(folder) -> tuple[TensorDataset, TensorDataset]:
    """MNIST from its IDX files (as published, gzipped or not) as 1 x 28 x 28 floats in [0, 1]."""
    paths = {key: _find_idx(Path(folder), name) for key, name in MNIST_FILES.items()}
    arrays = {key: read_idx(path) for key, path in paths.items()}
    return (_as_dataset(arrays["train_images"], arrays["train_labels"], paths["train_images"]),
            _as_dataset(arrays["test_images"], arrays["test_labels"], paths["test_images"]))


def read_idx(path) -> np.ndarray:
    """One IDX file: 2 zero bytes, a dtype byte, a rank byte, big-endian sizes, the data."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[:2] != b"\0\0" or raw[2] not in IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic number {raw[:4].hex()!r}); "
                         "MNIST files start with 0x00000803 (images) or 0x00000801 (labels)")
    ndim = raw[3]
    shape = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=IDX_DTYPES[raw[2]], offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{path} is truncated: header says {shape}, found {data.size} values")
    return data.reshape(shape)


def _find_idx(folder: Path, name: str) -> Path:
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{folder} has no {name} (or {name}.gz); an MNIST folder holds "
                            f"{', '.join(MNIST_FILES.values())}")


def _as_dataset(images: np.ndarray, labels: np.ndarray, where: Path) -> TensorDataset:
    if images.ndim != 3 or len(images) != len(labels):
        raise ValueError(f"{where}: expected N x H x W images and N labels, got "
                         f"{images.shape} and {labels.shape}")
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    return TensorDataset(x, torch.from_numpy(labels.astype(np.int64)))
