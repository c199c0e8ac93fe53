"""Checkpointing on a model nobody here wrote: keras.applications.ConvNeXtTiny (weights=None).

ConvNeXt's depthwise convolutions are grouped `Conv2D`s, which Keras runs on CPU as nested
XLA-compiled functions: function-call ops inside the training graph. The three entry points
(`memgrad.gradients`, `memgrad.GradientTape`, the Keras `fit` hook) must give plain
autodiff's gradients and a real rewrite.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import memgrad
from tests.checkpointing.models import max_relative_error, rewritten


@pytest.fixture(scope="module")
def convnext():
    keras.utils.set_random_seed(0)
    model = keras.applications.ConvNeXtTiny(
        weights=None, input_shape=(32, 32, 3), classes=10, include_preprocessing=False)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((2, 32, 32, 3)).astype("float32"))
    y = tf.constant(rng.integers(0, 10, size=(2,)).astype("int32"))
    return model, x, y


def _loss(model, x, y):
    logits = model(x, training=True)
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits))


def test_convnext_gradients_and_tape_match_plain_autodiff(convnext):
    model, x, y = convnext
    variables = model.trainable_variables

    @tf.function
    def step(x, y):
        with tf.GradientTape() as plain:
            loss = _loss(model, x, y)
        reference = plain.gradient(loss, variables)
        by_gradients = memgrad.gradients(loss, variables, checkpoints="memory")
        with memgrad.GradientTape(checkpoints="speed") as tape:
            loss = _loss(model, x, y)
        return reference, by_gradients, tape.gradient(loss, variables)

    with rewritten(calls=2):
        reference, by_gradients, by_tape = step(x, y)
    assert max_relative_error(reference, by_gradients) <= 1e-5
    assert max_relative_error(reference, by_tape) <= 1e-5


def test_convnext_fit_hook_trains_like_plain_fit(convnext):
    model, x, y = convnext
    plain = keras.models.clone_model(model)
    plain.set_weights(model.get_weights())
    hooked = keras.models.clone_model(model)
    hooked.set_weights(model.get_weights())
    for m in (plain, hooked):
        m.compile(optimizer=keras.optimizers.SGD(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    memgrad.enable_checkpointing(hooked, checkpoints="memory")
    plain.fit(x, y, epochs=1, batch_size=2, verbose=0, shuffle=False)
    with rewritten():
        hooked.fit(x, y, epochs=1, batch_size=2, verbose=0, shuffle=False)
    before = [tf.constant(w) for w in model.get_weights()]
    plain_steps = [a - tf.constant(b) for a, b in zip(plain.get_weights(), before)]
    hooked_steps = [a - tf.constant(b) for a, b in zip(hooked.get_weights(), before)]
    # Weights after one SGD step: compare the updates (the gradients times the rate).
    assert max_relative_error(plain_steps, hooked_steps) <= 1e-5
