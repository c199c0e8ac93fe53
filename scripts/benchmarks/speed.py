"""'speed' on keras.applications models: at or under plain's time, for whatever it frees."""

from __future__ import annotations

import gc

import keras
import tensorflow as tf

import memgrad

from benchmarks.common import sgd_step
from benchmarks.peers import peer_rows

SPEED_TIME_TARGET = 1.05  # 'speed' vs plain backprop: at plain's time, within the rounds' noise

# (model, input side): the inputs the docs' table has used (InceptionV3 and Xception need 75+).
APPLICATIONS = (("ResNet50", 64), ("VGG16", 64), ("EfficientNetV2B0", 64), ("InceptionV3", 80),
                ("Xception", 80), ("DenseNet169", 64), ("NASNetMobile", 64), ("MobileNetV3Small", 64))


def speed_suite(rounds, batch=16, models=APPLICATIONS):
    """Plain backprop and 'speed' on each model (weights=None, 10 classes, training mode; an
    SGD step of one ``assign_sub`` per gradient), one model after another in this process.
    The variant names what the rewrite kept and ran again."""
    rows = []
    for name, side in models:
        keras.utils.set_random_seed(0)
        model = getattr(keras.applications, name)(weights=None, input_shape=(side, side, 3), classes=10)
        x = tf.random.stateless_normal([batch, side, side, 3], seed=[0, 11])

        def loss_of(t, model=model):
            return tf.reduce_mean(tf.square(model(t, training=True)))

        plain = sgd_step(model.trainable_variables, loss_of)
        speed = sgd_step(model.trainable_variables, loss_of,
                         lambda: memgrad.GradientTape(checkpoints="speed"))
        with memgrad.record_rewrites() as log:
            speed(x).numpy()
        record = log[0]
        if record.plan is not None and record.plan.details.get("same_as_plain"):
            label = "memgrad 'speed' (plain backprop: nothing worth freeing)"
        else:
            label = (f"memgrad 'speed' ({record.checkpoints} tensors kept, {record.recomputed_ops} "
                     f"ops run twice)")
        case = f"keras.applications {name} (weights=None), batch {batch}x{side}x{side}x3"
        for row in peer_rows(case, {"plain": plain, label: speed}, x, rounds):
            row["suite"] = "speed"
            rows.append(row)
        del model, plain, speed
        gc.collect()
    return rows
