"""memgrad.recompute around Keras blocks against plain backprop and tf.recompute_grad."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

import memgrad

from benchmarks.common import median_peak, sgd_step, time_side_by_side


def _recompute_blocks(depth, width, momentum, seed=0):
    """``depth`` blocks Dense(4w) -> BatchNormalization -> ReLU -> Dropout(0.1) -> Dense(w)."""
    keras.utils.set_random_seed(seed)
    blocks = []
    for _ in range(depth):
        block = keras.Sequential([keras.layers.Dense(4 * width), keras.layers.BatchNormalization(momentum=momentum),
                                  keras.layers.ReLU(), keras.layers.Dropout(0.1), keras.layers.Dense(width)])
        block.build((None, width))
        blocks.append(block)
    return blocks


def _bn_updates_per_step(moving_mean, plain_moving_mean, momentum):
    """Updates of a moving mean that started at 0, from its value and the plain step's (one update).

    After k updates with the same batch mean m, the moving mean is ``(1 - momentum**k) * m``.
    """
    batch_mean = plain_moving_mean / (1.0 - momentum)
    usable = np.abs(batch_mean) > 1e-3
    fraction = np.clip(moving_mean[usable] / batch_mean[usable], 1e-9, 1 - 1e-9)
    return float(np.median(np.log(1.0 - fraction) / np.log(momentum)))


def recompute_suite(rounds, batch=512, width=128, depth=16, momentum=0.5):
    """memgrad.recompute vs tf.recompute_grad vs keras.RematScope vs plain, per block, same model."""
    x = tf.random.stateless_normal([batch, width], seed=[0, 7])
    blocks = _recompute_blocks(depth, width, momentum)

    def state(block):  # weights, statistics and Dropout's seed state
        seeds = [layer.seed_generator.state for layer in block.layers if hasattr(layer, "seed_generator")]
        return block.weights + [v for v in seeds if all(v is not w for w in block.weights)]

    initial = [[v.numpy() for v in state(b)] for b in blocks]
    wrapped = [memgrad.layers.Recompute(b) for b in blocks]

    def forward_of(call_block):
        def forward(t):
            h = t
            for i in range(depth):
                h = h + call_block(i, h)
            return h
        return forward

    variants = {
        "plain": (blocks, forward_of(lambda i, h: blocks[i](h, training=True))),
        "memgrad.layers.Recompute per block": (blocks, forward_of(lambda i, h: wrapped[i](h, training=True))),
        "tf.recompute_grad per block": (blocks, forward_of(
            lambda i, h: tf.recompute_grad(lambda t, b=blocks[i]: b(t, training=True))(h))),
    }
    failures = []
    try:
        with keras.RematScope(mode="full"):
            remat_blocks = _recompute_blocks(depth, width, momentum)
        variants["keras.RematScope(mode='full')"] = (
            remat_blocks, forward_of(lambda i, h: remat_blocks[i](h, training=True)))
    except Exception as error:  # noqa: BLE001 - a peer that fails is reported, not fatal
        from memgrad.cli.report import one_line

        failures.append(("keras.RematScope(mode='full')", f"{type(error).__name__}: {one_line(error)[:200]}"))

    def reset(variant_blocks):
        for block, values in zip(variant_blocks, initial):
            for variable, value in zip(state(block), values):
                variable.assign(value)

    def variables_of(variant_blocks):
        return [v for b in variant_blocks for v in b.trainable_variables]

    def loss_of(forward):
        return lambda t: tf.reduce_mean(tf.square(forward(t)))

    # One step's gradients and BatchNormalization updates, from the same weights, seeds and statistics.
    checks, steps = {}, {}
    for name, (variant_blocks, forward) in variants.items():
        reset(variant_blocks)
        variables = variables_of(variant_blocks)

        def gradients_of(forward, variables):
            @tf.function
            def gradients(t):
                with tf.GradientTape() as tape:
                    loss = loss_of(forward)(t)
                return tape.gradient(loss, variables)
            return gradients

        gradients = gradients_of(forward, variables)

        try:
            grads = [None if g is None else g.numpy() for g in gradients(x)]
            missing = [v.path for v, g in zip(variables, grads) if g is None]
            if missing:
                raise ValueError(f"no gradient for {len(missing)} of {len(variables)} variables, e.g. {missing[0]}")
        except Exception as error:  # noqa: BLE001
            from memgrad.cli.report import one_line

            failures.append((name, f"{type(error).__name__}: {one_line(error)[:200]}"))
            continue
        moving_mean = variant_blocks[0].layers[1].moving_mean.numpy()
        checks[name] = (grads, moving_mean)
        reset(variant_blocks)
        steps[name] = sgd_step(variables, loss_of(forward))
    if "plain" not in checks:
        raise RuntimeError(f"the plain variant failed: {failures}")
    plain_grads, plain_mean = checks["plain"]
    seconds = time_side_by_side(steps, x, rounds)
    peaks = {name: median_peak(step, x) for name, step in steps.items()}
    rows = []
    for name in steps:
        grads, moving_mean = checks[name]
        error = max(float(np.max(np.abs(g - p)) / max(np.max(np.abs(p)), 1e-12)) for g, p in zip(grads, plain_grads))
        rows.append({"suite": "recompute", "variant": name, "failure": None,
                     "time_ratio": seconds[name] / seconds["plain"], "ms": seconds[name] * 1e3,
                     "memory_ratio": peaks[name] / peaks["plain"], "peak_mib": peaks[name] / 2**20,
                     "bn_updates": _bn_updates_per_step(moving_mean, plain_mean, momentum),
                     "gradient_error": error})
    rows += [{"suite": "recompute", "variant": name, "failure": failure} for name, failure in failures]
    case = (f"{depth} residual blocks Dense({4 * width})-BN-ReLU-Dropout(0.1)-Dense({width}), "
            f"batch {batch}x{width}, tf.function SGD step")
    for row in rows:
        row["case"] = case
    return rows
