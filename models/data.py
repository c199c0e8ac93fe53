"""Offline datasets for the model zoo: scikit-learn's bundled 8x8 digits, and CIFAR-10 from disk.

Nothing here downloads. The digits ship inside scikit-learn; CIFAR-10 is read from a copy the
user already has (the "python version" directory ``cifar-10-batches-py``).
"""

from __future__ import annotations

import os
import pickle

import numpy as np

DIGITS_LEVELS = 17  # the digits' pixels are integer counts 0..16


def load_digits(test_fraction=0.2, seed=0):
    """scikit-learn's 1,797 8x8 handwritten digits as images, split into train and test.

    Args:
      test_fraction: the share of examples held out for testing (stratified by class).
      seed: seed of the split.

    Returns:
      ``((x_train, y_train), (x_test, y_test))``: ``x`` float32 ``[N, 8, 8, 1]`` in [0, 1]
      (the pixel count divided by 16), ``y`` int32 class labels 0..9.

    Example:
      >>> (x, y), (x_test, y_test) = load_digits()
      >>> x.shape, x_test.shape
      ((1438, 8, 8, 1), (359, 8, 8, 1))
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1). Received: {test_fraction!r}")
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError as error:  # pragma: no cover - scikit-learn is a dependency
        raise ImportError(
            "The digits data ships with scikit-learn: pip install scikit-learn"
        ) from error
    bunch = sklearn_digits()
    images = (bunch.images.astype(np.float32) / 16.0)[..., None]
    labels = bunch.target.astype(np.int32)
    rng = np.random.default_rng(seed)
    test = np.zeros(len(labels), dtype=bool)
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        count = int(round(test_fraction * len(members)))
        test[rng.choice(members, size=count, replace=False)] = True
    return (images[~test], labels[~test]), (images[test], labels[test])


def load_cifar10(path):
    """CIFAR-10 from a local copy of the "python version" (``cifar-10-batches-py``).

    Args:
      path: the directory holding ``data_batch_1`` .. ``data_batch_5`` and ``test_batch``.

    Returns:
      ``((x_train, y_train), (x_test, y_test))``: ``x`` float32 ``[N, 32, 32, 3]`` in [0, 1],
      ``y`` int32 labels.

    Example:
      >>> (x, y), (x_test, y_test) = load_cifar10("~/data/cifar-10-batches-py")  # doctest: +SKIP
    """
    path = os.path.expanduser(str(path))
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    missing = [n for n in names if not os.path.isfile(os.path.join(path, n))]
    if missing:
        raise FileNotFoundError(
            f"CIFAR-10 expects the python-version batches ({', '.join(names)}) in one "
            f"directory; memgrad never downloads it. Missing in {path!r}: {', '.join(missing)}"
        )

    def read(name):
        with open(os.path.join(path, name), "rb") as handle:
            batch = pickle.load(handle, encoding="bytes")
        images = batch[b"data"].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        return images.astype(np.float32) / 255.0, np.asarray(batch[b"labels"], dtype=np.int32)

    parts = [read(n) for n in names[:5]]
    train = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    return train, read("test_batch")


def load(name, cifar10_path=None, seed=0):
    """The dataset a training entry point asked for: ``"digits"`` or ``"cifar10"``.

    Args:
      name: ``"digits"`` (bundled) or ``"cifar10"`` (needs ``cifar10_path``).
      cifar10_path: the ``cifar-10-batches-py`` directory.
      seed: seed of the digits' train/test split.

    Returns:
      ``((x_train, y_train), (x_test, y_test))`` as from `load_digits` / `load_cifar10`.

    Example:
      >>> (x, y), _ = load("digits")
    """
    if name == "digits":
        return load_digits(seed=seed)
    if name == "cifar10":
        if not cifar10_path:
            raise ValueError("--data cifar10 needs --cifar10-path DIR (memgrad never downloads data)")
        return load_cifar10(cifar10_path)
    raise ValueError(f"Unknown dataset: expected 'digits' or 'cifar10'. Received: {name!r}")
