"""The model zoo: the memory-efficient DenseNet and Glow against their plain twins."""

from __future__ import annotations

import os
import sys

import keras
import tensorflow as tf

from benchmarks.common import median_peak, ratio_row, sgd_step, time_side_by_side


def _classifier_step(model):
    def cross_entropy(x):
        logits = model(x, training=True)
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
            tf.zeros(tf.shape(x)[:1], tf.int32), logits, from_logits=True))

    return sgd_step(model.trainable_variables, cross_entropy)


def glow_twin_steps(size, steps_per_level, hidden, reversible_key, plain_key):
    """SGD steps of one Glow level trained through the constant-memory stack and by plain
    backprop, with the same weights: ``{reversible_key: step, plain_key: step}``."""
    from memgrad_zoo.glow import Glow

    glows = {key: Glow((size, size, 3), levels=1, steps=steps_per_level, hidden=hidden, n_bins=256,
                       reversible=key == reversible_key) for key in (reversible_key, plain_key)}
    for glow in glows.values():
        glow.build()
    glows[plain_key].set_weights(glows[reversible_key].get_weights())
    return {key: sgd_step(glow.trainable_variables, lambda t, g=glow: tf.reduce_mean(g(t, training=True)))
            for key, glow in glows.items()}, glows


def zoo_suite(rounds, batch=16, size=16):
    """The model zoo: memory-efficient DenseNet-BC and constant-memory Glow vs their plain twins."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from memgrad_zoo.densenet import densenet_bc

    rows = []
    x = tf.random.stateless_normal([batch, size, size, 3], seed=[0, 1])
    steps = {key: _classifier_step(densenet_bc(100, 12, efficient=key == "memgrad", input_shape=(size, size, 3)))
             for key in ("memgrad", "plain")}
    rows.append(_zoo_row(f"DenseNet-BC-100 k=12, efficient vs plain, batch {batch}x{size}x{size}x3",
                         steps, x, rounds, 1.2))
    images = tf.random.stateless_uniform([64, size, size, 3], seed=[0, 2])
    steps, _ = glow_twin_steps(size, 16, 32, "memgrad", "plain")
    rows.append(_zoo_row(f"Glow level (K=16, hidden 32), reversible vs plain, batch 64x{size}x{size}x3",
                         steps, images, rounds, 1.4))
    return rows


def _zoo_row(case, steps, x, rounds, target):
    seconds = time_side_by_side(steps, x, rounds)
    peaks = {key: median_peak(step, x) for key, step in steps.items()}
    return ratio_row("zoo", case, target, seconds, peaks)
