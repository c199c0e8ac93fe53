"""Peak memory of one training step of zoo models (run as a script, in a fresh process).

`densenet(["40:1", "100:1"])` (depth:efficient pairs) and `glow(["4:1", "16:1"])` (steps per
level:reversible) return the peaks, bytes above the baseline, the median of three calls;
tests/models/test_memory.py calls them in fresh processes. By hand:
``python -m tests.models.memory_probe densenet 40:1,100:1,100:0`` prints ``PEAKS {json}``.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import memgrad  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.zoo_checkout import import_zoo_from_this_checkout  # noqa: E402

import_zoo_from_this_checkout()  # the zoo under test, as in the test process


def sgd_step(model, loss_fn):
    variables = model.trainable_variables

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(model, x, y)
        for variable, grad in zip(variables, tape.gradient(loss, variables)):
            variable.assign_sub(0.01 * grad)
        return loss

    return step


def peak(step, args):
    values = sorted(memgrad.profiler.measure(step, args=args, device="CPU:0").peak_above_baseline_bytes
                    for _ in range(3))
    return values[1]


def densenet(configs):
    from memgrad_zoo.densenet import densenet_bc

    x = tf.random.stateless_normal([DENSENET_BATCH, 16, 16, 3], seed=[0, 1])
    y = tf.zeros([DENSENET_BATCH], tf.int32)

    def loss_fn(model, x, y):
        logits = model(x, training=True)
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))

    peaks = {}
    for config in configs:
        depth, efficient = (int(v) for v in config.split(":"))
        model = densenet_bc(depth, 12, efficient=bool(efficient), input_shape=(16, 16, 3))
        peaks[config] = peak(sgd_step(model, loss_fn), (x, y))
    return peaks


DENSENET_BATCH = 8
GLOW_BATCH, GLOW_IMAGE = 64, (16, 16, 3)


def glow(configs):
    """Configs ``steps:reversible``: one Glow level (squeeze + K steps) on 16x16x3 images."""
    from memgrad_zoo.glow import Glow

    x = tf.random.stateless_uniform([GLOW_BATCH, *GLOW_IMAGE], seed=[0, 2])

    def loss_fn(model, x, y):
        return tf.reduce_mean(model(x, training=True))

    peaks = {}
    for config in configs:
        steps, reversible = (int(v) for v in config.split(":"))
        model = Glow(GLOW_IMAGE, levels=1, steps=steps, hidden=32, n_bins=256,
                     reversible=bool(reversible))
        model.build()
        peaks[config] = peak(sgd_step(model, loss_fn), (x, None))
    return peaks


if __name__ == "__main__":
    kind, configs = sys.argv[1], sys.argv[2].split(",")
    print("PEAKS " + json.dumps({"densenet": densenet, "glow": glow}[kind](configs)), flush=True)
