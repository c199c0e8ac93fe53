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


LEARNING_RATE = 1.0  # large, so the weight change is not lost in float32 rounding of w


@pytest.fixture(scope="module")
def convnext():
    """The model, a batch, and plain autodiff's gradients of the loss `fit` minimises."""
    keras.utils.set_random_seed(0)
    model = keras.applications.ConvNeXtTiny(
        weights=None, input_shape=(32, 32, 3), classes=10, include_preprocessing=False,
        classifier_activation=None)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((2, 32, 32, 3)).astype("float32"))
    y = tf.constant(rng.integers(0, 10, size=(2,)).astype("int32"))
    initial = [tf.constant(w) for w in model.get_weights()]

    @tf.function
    def plain(x, y):
        with tf.GradientTape() as tape:
            loss = _loss(model, x, y)
        return tape.gradient(loss, model.trainable_variables)

    return model, x, y, initial, plain(x, y)


def _loss(model, x, y):
    logits = model(x, training=True)
    return tf.reduce_mean(
        keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))


@pytest.mark.slow
def test_convnext_gradients_and_tape_match_plain_autodiff(convnext):
    model, x, y, _, reference = convnext
    variables = model.trainable_variables

    @tf.function
    def step(x, y):
        by_gradients = memgrad.gradients(_loss(model, x, y), variables, checkpoints="memory")
        with memgrad.GradientTape(checkpoints="speed") as tape:
            loss = _loss(model, x, y)
        return by_gradients, tape.gradient(loss, variables)

    with rewritten(calls=2):
        by_gradients, by_tape = step(x, y)
    assert max_relative_error(reference, by_gradients) <= 1e-5
    assert max_relative_error(reference, by_tape) <= 1e-5


@pytest.mark.slow
def test_convnext_fit_hook_takes_plain_autodiffs_step(convnext):
    model, x, y, initial, reference = convnext
    hooked = keras.models.clone_model(model)
    hooked.set_weights(initial)
    hooked.compile(optimizer=keras.optimizers.SGD(LEARNING_RATE),
                   loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    memgrad.enable_checkpointing(hooked, checkpoints="memory")
    with rewritten():
        hooked.fit(x, y, epochs=1, batch_size=2, verbose=0, shuffle=False)
    # One SGD step from the same weights: the update is -rate times plain autodiff's gradient.
    start = {id(w): value for w, value in zip(model.weights, initial)}
    steps = [(start[id(v)] - h) / LEARNING_RATE
             for v, h in zip(model.trainable_variables, hooked.trainable_variables)]
    assert max_relative_error(reference, steps) <= 1e-4


def _layer_names(model):
    """Every layer's name, nested models' included."""
    names = set()
    for layer in model._flatten_layers(include_self=True, recursive=True):
        names.add(layer.name)
    return names


def test_analyze_names_the_layers_the_checkpoints_come_out_of(convnext):
    model, x, y, _, _ = convnext
    report = memgrad.analyze(lambda x, y: _loss(model, x, y), args=(x, y), budget_points=0)
    assert report.checkpoints and len(report.checkpoint_layers) == len(report.checkpoints)
    known = _layer_names(model)
    for layer in report.checkpoint_layers:
        last = layer.split("/")[-1]
        # A layer called again in one graph gets a numbered name scope ("..._1").
        assert last in known or last.rsplit("_", 1)[0] in known, (layer, report.checkpoints)
    assert any("stage" in layer for layer in report.checkpoint_layers), report.checkpoint_layers
    line = next(line for line in report.summary().splitlines() if line.startswith("kept after layers"))
    assert report.checkpoint_layers[0] in line
    print(report.summary())
