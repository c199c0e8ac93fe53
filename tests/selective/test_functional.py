"""LeanFunctional: same outputs and gradients as Keras's runner, .keras round trip,
nested models, intermediates released, and converted keras-hub / keras.applications models."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import memgrad
from memgrad import selective

FRESH_PROCESSES = {"lean forward": dict(target="tests.selective.memory_probe:lean_forward_peaks", timeout=300)}


def _small_resnet(tuning):
    """A functional ResNet-style model with a nested functional block and every layer type of
    keras.applications' ResNet/MobileNet families."""
    keras.utils.set_random_seed(12)
    block_in = keras.Input((8, 8, 8))
    h = keras.layers.DepthwiseConv2D(3, padding="same")(block_in)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.ReLU(6.0)(h)
    h = keras.layers.SeparableConv2D(8, 3, padding="same", activation="relu")(h)
    block = keras.Model(block_in, keras.layers.Add()([block_in, h]), name="block")

    inputs = keras.Input((16, 16, 3))
    h = keras.layers.ZeroPadding2D(1)(inputs)
    h = keras.layers.Conv2D(8, 3, strides=2)(h)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.Activation("relu")(h)
    h = block(h)
    skip = keras.layers.AveragePooling2D(2)(h)
    h = keras.layers.MaxPooling2D(2)(h)
    h = keras.layers.Concatenate()([h, skip])
    h = keras.layers.LayerNormalization()(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    model = keras.Model(inputs, keras.layers.Dense(3)(h))
    for layer in model.layers + block.layers:
        if tuning == "frozen" and layer.name != model.layers[-1].name:
            layer.trainable = False
        if tuning == "batchnorm":
            layer.trainable = isinstance(layer, (keras.layers.BatchNormalization, keras.layers.Dense, keras.Model))
    return model


def _grads(model, x):
    with tf.GradientTape() as tape:
        y = model(x, training=False)
        loss = tf.reduce_sum(tf.sin(y))
    return y, tape.gradient(loss, model.trainable_variables)


@pytest.mark.parametrize("tuning", ["trainable", "frozen", "batchnorm"])
def test_converted_functional_outputs_and_gradients_match_keras(tuning):
    model = _small_resnet(tuning)
    converted, report = memgrad.selective.convert(model, return_report=True)
    assert isinstance(converted, selective.LeanFunctional)
    assert isinstance(converted.get_layer("block"), selective.LeanFunctional)
    assert report.kept == []  # every layer of this model has a memgrad version
    x = tf.constant(np.random.default_rng(13).normal(size=(4, 16, 16, 3)).astype("float32"))
    (y_ref, g_ref), (y, g) = _grads(model, x), _grads(converted, x)
    np.testing.assert_array_equal(y, y_ref)
    assert len(g) == len(g_ref) > 0
    for got, want in zip(g, g_ref, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_lean_functional_keras_round_trip(tmp_path):
    converted = memgrad.selective.convert(_small_resnet("batchnorm"))
    path = tmp_path / "lean.keras"
    converted.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded, selective.LeanFunctional)
    assert isinstance(loaded.get_layer("block"), selective.LeanFunctional)
    assert {type(layer) for layer in loaded.get_layer("block").layers[1:]} <= {
        selective.DepthwiseConv2D, selective.BatchNormalization, selective.ReLU, selective.SeparableConv2D,
        selective.Add}
    x = tf.constant(np.random.default_rng(14).normal(size=(2, 16, 16, 3)).astype("float32"))
    np.testing.assert_array_equal(loaded(x), converted(x))
    assert [v.path for v in loaded.trainable_variables] == [v.path for v in converted.trainable_variables]


def test_lean_functional_dict_inputs_and_multiple_outputs():
    a, b = keras.Input((4,), name="a"), keras.Input((4,), name="b")
    h = keras.layers.Dense(5, activation="relu")(keras.layers.Concatenate()([a, b]))
    model = keras.Model({"a": a, "b": b}, {"sum": keras.layers.Add()([h, h]), "raw": h})
    converted = memgrad.selective.convert(model)
    feed = {"a": tf.ones((2, 4)), "b": tf.fill((2, 4), 2.0)}
    out, ref = converted(feed), model(feed)
    assert set(out) == {"sum", "raw"}
    for key in ref:
        np.testing.assert_array_equal(out[key], ref[key])


@pytest.mark.memory
def test_lean_functional_frees_frozen_activations_during_the_forward_pass(fresh_results):
    """Peak of the forward pass of a frozen 6-block chain under a tape, above what existed before
    (measured in a fresh process: tests/selective/memory_probe.py:lean_forward_peaks)."""
    keras_peak, lean_peak = fresh_results["lean forward"]
    # Keras's runner keeps all 12 outputs until the call returns (48 MiB); the lean one holds
    # a layer's input, its matmul and its bias sum (measured: 48.0 vs 12.0 MiB).
    assert keras_peak >= 44 * 2**20, f"{keras_peak / 2**20:.1f} MiB"
    assert lean_peak <= 16 * 2**20, f"{lean_peak / 2**20:.1f} MiB"


@pytest.mark.slow
def test_converted_keras_hub_bert_with_adapters_gradients_match_keras():
    from tests.selective.finetune_probe import bert_with_adapters

    model = bert_with_adapters(num_layers=2, hidden_dim=16, num_heads=2, intermediate_dim=32, sequence_length=8)
    converted, report = memgrad.selective.convert(model, return_report=True)
    swapped = {name for name, _ in report.swapped}
    assert "transformer_layer_1/self_attention_layer/query" in swapped
    assert "transformer_layer_1/feedforward_intermediate_dense" in swapped
    kept = dict(report.kept)
    assert "custom layer" in kept["transformer_layer_1"] and "GetItem" in kept[
        next(name for name in kept if "get_item" in name)]
    ids = tf.constant(np.random.default_rng(15).integers(0, 1000, size=(3, 8)), tf.int32)
    feed = {"token_ids": ids, "segment_ids": tf.zeros_like(ids), "padding_mask": tf.ones_like(ids)}
    (y_ref, g_ref), (y, g) = _grads(model, feed), _grads(converted, feed)
    np.testing.assert_array_equal(y, y_ref)
    assert [v.path for v in converted.trainable_variables] == [v.path for v in model.trainable_variables]
    assert len(g) == 10  # two adapters (down/up, kernel/bias) and the head
    for got, want in zip(g, g_ref, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_unconverted_layers_are_reported_with_reasons():
    inputs = keras.Input((6, 4))
    h = keras.layers.Conv1D(4, 3, padding="causal")(inputs)  # unsupported setting
    h = keras.layers.Activation("tanh")(h)  # no lean version of tanh
    h = keras.layers.Flatten()(h)
    h = keras.layers.Dense(2)(h)
    converted, report = memgrad.selective.convert(keras.Model(inputs, h), return_report=True)
    kept = dict(report.kept)
    assert len(kept) == 3 and len(report.swapped) == 1
    assert "Received: padding='causal'" in kept[converted.layers[1].name]
    assert "Received: activation='tanh'" in kept[converted.layers[2].name]
    assert "keeps no tensor" in kept[converted.layers[3].name]


@pytest.mark.slow
def test_converted_functional_fits_like_keras():
    """model.fit (a graph) of the converted BN-only model takes Keras's steps."""
    x = np.random.default_rng(16).normal(size=(16, 16, 16, 3)).astype("float32")
    y = np.arange(16) % 3
    weights = []
    for convert in (False, True):
        model = _small_resnet("batchnorm")
        if convert:
            model = memgrad.selective.convert(model)
        model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, epochs=2, batch_size=8, shuffle=False, verbose=0)
        weights.append(model.get_weights())
    for got, want in zip(weights[1], weights[0], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
