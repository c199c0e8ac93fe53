"""Training entry points of the model zoo: ``memgrad-zoo revnet|resnet|densenet|glow`` (or ``python -m memgrad_zoo ...``).

Each trains on the bundled digits (or a local CIFAR-10 copy) with Keras's progress bar, saves
the model as a ``.keras`` checkpoint after every epoch and prints the test figure (accuracy,
or bits/dim for Glow) with a JSON summary. Nothing downloads.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

DEFAULT_DEPTH = {"revnet": 38, "resnet": 32, "densenet": 40}


def _build_for_fit(model):
    """Builds the model (from its own input shape) and its optimizer before `fit`.

    Keras 3 creates whatever is missing while it traces the first training step, and
    TensorFlow traces a function that creates variables on its first call twice: a RevNet-38's
    first epoch on the digits took 29 s that way and 12 s built first (one trace). Metrics are
    given to `compile` as objects for the same reason (a name such as "accuracy" makes Keras
    create the metric's variables inside the trace).
    """
    if not model.built:
        model.build()
    model.optimizer.build(model.trainable_variables)


def _common_arguments(parser, epochs, batch_size, lr):
    parser.add_argument("--data", choices=["digits", "cifar10"], default="digits",
                        help="digits: scikit-learn's bundled 8x8 digits (default); cifar10: a local "
                             "copy given by --cifar10-path (never downloaded)")
    parser.add_argument("--cifar10-path", help="directory holding CIFAR-10's python batches")
    parser.add_argument("--epochs", type=int, default=epochs, help=f"default {epochs}")
    parser.add_argument("--batch-size", type=int, default=batch_size, help=f"default {batch_size}")
    parser.add_argument("--lr", type=float, default=lr, help=f"Adam learning rate (default {lr})")
    parser.add_argument("--seed", type=int, default=0, help="weights, shuffling and split seed")
    parser.add_argument("--output", default=None,
                        help="checkpoint path (.keras), saved every epoch (default: <model>.keras)")
    parser.add_argument("--summary", default=None, help="also write the results as JSON here")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _check_positive(parser, args, names):
    for name in names:
        value = getattr(args, name)
        if value is None or value <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive. Received: {value}")


def _load(parser, args):
    from memgrad_zoo import data

    try:
        return data.load(args.data, args.cifar10_path, seed=args.seed)
    except (OSError, ValueError) as error:
        parser.error(str(error))


def _finish(args, results):
    line = ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in results.items())
    print(f"done: {line}")
    if args.summary:
        with open(args.summary, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2)


def train_classifier(model, data, epochs, batch_size, lr, output=None, verbose=1):
    """Trains a zoo classifier with Adam and cross-entropy; evaluates on the test split.

    Args:
      model: an uncompiled Keras classifier giving logits.
      data: ``((x_train, y_train), (x_test, y_test))``.
      epochs: training epochs.
      batch_size: examples per step.
      lr: Adam learning rate (cosine-decayed to 0 over training).
      output: ``.keras`` checkpoint path saved after every epoch, or ``None``.
      verbose: Keras verbosity (1: progress bar).

    Returns:
      A dict: ``model`` (its name), ``test_accuracy``, ``test_loss``, ``train_seconds``,
      ``parameters``.

    Example:
      >>> from memgrad_zoo import data, revnet
      >>> (x, y), test = data.load_digits()
      >>> model = revnet.revnet(14, input_shape=(8, 8, 1))
      >>> result = train_classifier(model, ((x[:128], y[:128]), (test[0][:64], test[1][:64])), epochs=1, batch_size=64,
      ...                           lr=1e-3, verbose=0)
      >>> sorted(result)
      ['model', 'parameters', 'test_accuracy', 'test_loss', 'train_seconds']
    """
    import keras

    (x, y), (x_test, y_test) = data
    steps = epochs * math.ceil(len(x) / batch_size)
    schedule = keras.optimizers.schedules.CosineDecay(lr, max(steps, 1))
    model.compile(keras.optimizers.Adam(schedule), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")])
    _build_for_fit(model)
    callbacks = [keras.callbacks.ModelCheckpoint(output)] if output else []
    start = time.perf_counter()
    model.fit(x, y, batch_size=batch_size, epochs=epochs, verbose=verbose, callbacks=callbacks)
    seconds = time.perf_counter() - start
    loss, accuracy = model.evaluate(x_test, y_test, batch_size=256, verbose=0)[:2]
    return {"model": model.name, "parameters": int(model.count_params()),
            "test_accuracy": float(accuracy), "test_loss": float(loss), "train_seconds": seconds}


def classifier_main(kind, argv=None):
    """``memgrad-zoo <kind>``: train a RevNet, ResNet or DenseNet-BC classifier."""
    parser = argparse.ArgumentParser(
        prog=f"memgrad-zoo {kind}",
        description=f"Train a {kind} classifier on offline data and save a .keras checkpoint.",
    )
    parser.add_argument("--depth", type=int, default=DEFAULT_DEPTH[kind],
                        help=f"network depth (default {DEFAULT_DEPTH[kind]})")
    if kind == "densenet":
        parser.add_argument("--growth-rate", type=int, default=12, help="k (default 12)")
        parser.add_argument("--plain", action="store_true",
                            help="plain autodiff instead of the memory-efficient bottleneck")
    _common_arguments(parser, epochs=30, batch_size=64, lr=2e-3)
    args = parser.parse_args(argv)
    _check_positive(parser, args, ["epochs", "batch_size", "lr", "depth"])
    data = _load(parser, args)

    import keras

    keras.utils.set_random_seed(args.seed)
    input_shape = tuple(data[0][0].shape[1:])
    num_classes = int(max(data[0][1].max(), data[1][1].max())) + 1
    try:
        if kind == "revnet":
            from memgrad_zoo.revnet import revnet as build
        elif kind == "resnet":
            from memgrad_zoo.resnet import resnet as build
        else:
            from memgrad_zoo.densenet import densenet_bc

            def build(depth, **kw):
                return densenet_bc(depth, args.growth_rate, efficient=not args.plain, **kw)
        model = build(args.depth, num_classes=num_classes, input_shape=input_shape)
    except ValueError as error:
        parser.error(str(error))
    output = args.output or f"{model.name}.keras"
    results = train_classifier(model, data, args.epochs, args.batch_size, args.lr, output,
                               verbose=0 if args.quiet else 1)
    results["checkpoint"] = output
    _finish(args, results)


def train_glow(model, data, epochs, batch_size, lr, output=None, verbose=1):
    """Trains a `memgrad_zoo.glow.Glow` by maximum likelihood and reports test bits/dim.

    Args:
      model: an uncompiled ``Glow``.
      data: ``((x_train, _), (x_test, _))`` with images in [0, 1].
      epochs: training epochs.
      batch_size: examples per step.
      lr: Adam learning rate (gradients clipped to a global norm of 50).
      output: ``.keras`` checkpoint path saved after every epoch, or ``None``.
      verbose: Keras verbosity (1: progress bar).

    Returns:
      A dict: ``model`` (``'glow'`` or ``'glow-plain'``), ``test_bits_per_dim`` (mean over 4
      dequantisation draws), ``train_bits_per_dim`` (last epoch), ``train_seconds``.

    Example:
      >>> from memgrad_zoo import data, glow
      >>> (x, y), test = data.load_digits()
      >>> model = glow.Glow((8, 8, 1), levels=2, steps=2)
      >>> result = train_glow(model, ((x[:128], y[:128]), (test[0][:64], test[1][:64])), epochs=1, batch_size=64, lr=1e-3,
      ...                     verbose=0)
      >>> sorted(result)
      ['model', 'test_bits_per_dim', 'train_bits_per_dim', 'train_seconds']
    """
    import keras
    import numpy as np

    (x, _), (x_test, _) = data
    model.compile(keras.optimizers.Adam(lr, clipnorm=50.0))
    _build_for_fit(model)  # ActNorm still initializes from the first training batch
    callbacks = [keras.callbacks.ModelCheckpoint(output)] if output else []
    start = time.perf_counter()
    history = model.fit(x, batch_size=batch_size, epochs=epochs, verbose=verbose, callbacks=callbacks)
    seconds = time.perf_counter() - start
    test = [float(np.mean(model.predict(x_test, batch_size=256, verbose=0))) for _ in range(4)]
    return {"model": "glow" if model.reversible else "glow-plain",
            "test_bits_per_dim": float(np.mean(test)),
            "train_bits_per_dim": float(history.history["loss"][-1]), "train_seconds": seconds}


def glow_main(argv=None):
    """``memgrad-zoo glow``: train a multi-scale Glow on offline data."""
    parser = argparse.ArgumentParser(
        prog="memgrad-zoo glow",
        description="Train a multi-scale Glow (constant-memory levels) and report test bits/dim.",
    )
    parser.add_argument("--levels", type=int, default=2, help="L, scales (default 2)")
    parser.add_argument("--steps", type=int, default=8, help="K, flow steps per level (default 8)")
    parser.add_argument("--hidden", type=int, default=64, help="coupling network width (default 64)")
    parser.add_argument("--plain", action="store_true",
                        help="plain backprop instead of the constant-memory stack (same model)")
    parser.add_argument("--samples", default=None,
                        help="write a PNG grid of 64 samples at temperature 0.7")
    _common_arguments(parser, epochs=40, batch_size=64, lr=1e-3)
    args = parser.parse_args(argv)
    _check_positive(parser, args, ["epochs", "batch_size", "lr", "levels", "steps", "hidden"])
    data = _load(parser, args)

    import keras

    from memgrad_zoo.glow import Glow

    keras.utils.set_random_seed(args.seed)
    n_bins = 17 if args.data == "digits" else 256
    try:
        model = Glow(tuple(data[0][0].shape[1:]), levels=args.levels, steps=args.steps,
                     hidden=args.hidden, n_bins=n_bins, reversible=not args.plain, seed=args.seed)
    except ValueError as error:
        parser.error(str(error))
    output = args.output or ("glow-plain.keras" if args.plain else "glow.keras")
    results = train_glow(model, data, args.epochs, args.batch_size, args.lr, output,
                         verbose=0 if args.quiet else 1)
    results["checkpoint"] = output
    if args.samples:
        save_sample_grid(model, args.samples)
        results["samples"] = args.samples
    _finish(args, results)


def save_sample_grid(model, path, count=64, temperature=0.7, seed=0):
    """Draws ``count`` samples from a Glow and saves them as a square PNG grid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    images = model.sample(count, temperature=temperature, seed=seed).numpy()
    side = int(math.ceil(math.sqrt(count)))
    figure, axes = plt.subplots(side, side, figsize=(side, side))
    for index, axis in enumerate(axes.flat):
        axis.axis("off")
        if index < count:
            axis.imshow(images[index].squeeze(), cmap="gray_r" if images.shape[-1] == 1 else None,
                        vmin=0, vmax=1)
    figure.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    figure.savefig(path, dpi=60)
    plt.close(figure)
