"""Selective-differentiation layers against Keras's, eager, and a frozen backbone fine-tuned."""

from __future__ import annotations

import os
import sys

import keras
import tensorflow as tf

import memgrad
from memgrad.profiler.workloads import conv_classifier

from benchmarks.common import ratio_row, time_side_by_side


def _eager_step(model, x, y):
    optimizer = keras.optimizers.SGD(1e-4)
    optimizer.build(model.trainable_variables)

    def step(_):
        with tf.GradientTape() as tape:
            logits = model(x, training=False)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return step


def selective_suite(rounds, batch=32):
    """memgrad.selective.convert(model) vs the Keras model: eager training steps (time and peak memory)."""
    x = tf.random.stateless_normal([batch, 32, 32, 8], seed=[0, 1])
    y = tf.range(batch) % 10
    rows = []
    for frozen in (True, False):
        model = conv_classifier(frozen)
        steps = {"memgrad": _eager_step(memgrad.selective.convert(model), x, y), "plain": _eager_step(model, x, y)}
        seconds = time_side_by_side(steps, x, rounds)
        peaks = {key: memgrad.profiler.measure(step, args=(x,)).peak_above_baseline_bytes for key, step in steps.items()}
        rows.append(ratio_row(
            "selective", (f"16 conv-BN-ReLU layers, {'frozen backbone + trainable head' if frozen else 'all trainable'}"
                          f", eager, batch {batch}x32x32"), 1.05, seconds, peaks))
    rows += finetune_rows(rounds)
    return rows


def finetune_rows(rounds):
    """The fine-tuning workloads (keras.applications, keras-hub BERT with adapters):
    converted vs Keras, eager and tf.function steps (time and peak memory).

    The workloads live beside their tests (tests/selective/finetune_probe.py: keras-hub is a
    test-only dependency); without keras-hub the BERT row is skipped.
    """
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests.selective import finetune_probe

    cases = {
        "resnet50_frozen": "keras.applications ResNet50 frozen + trainable head",
        "resnet50_batchnorm": "ResNet50, only BatchNormalization + head trainable",
        "mobilenetv2_frozen": "MobileNetV2 frozen + trainable head",
        "bert_adapters": "keras-hub BERT (2 layers, hidden 64) frozen, adapters + head trainable",
    }
    rows = []
    for name, title in cases.items():
        build, batch = finetune_probe.WORKLOADS[name]
        try:
            model = build()
        except ImportError as error:  # keras-hub not installed
            print(f"skipped {name}: {error}", file=sys.stderr)
            continue
        converted = memgrad.selective.convert(model)
        for graph in (False, True):
            steps = {key: finetune_probe.make_step(m, batch, graph) for key, m in
                     (("memgrad", converted), ("plain", model))}
            timed = {key: (lambda _, step=step: step()) for key, step in steps.items()}
            seconds = time_side_by_side(timed, None, rounds)
            peaks = {key: finetune_probe.step_peak(m, batch, graph) for key, m in (("memgrad", converted), ("plain", model))}
            rows.append(ratio_row("selective", f"{title}, {'tf.function' if graph else 'eager'}, batch {batch}",
                                  1.05, seconds, peaks))
    return rows
