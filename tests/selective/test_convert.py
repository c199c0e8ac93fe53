"""convert(): swapped layers, identical outputs, save/load, training still works."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import memgrad
from memgrad import selective


def _sequential():
    return keras.Sequential([
        keras.Input((8, 8, 3)),
        keras.layers.Conv2D(4, 3, padding="same"),
        keras.layers.BatchNormalization(),
        keras.layers.ReLU(),
        keras.layers.Conv2D(4, 3, dilation_rate=2, padding="same"),  # kept: dilation unsupported
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(5, activation="relu"),
        keras.layers.Dense(3),
    ])


def _functional_with_nested():
    inner = keras.Sequential([keras.Input((6,)), keras.layers.Dense(6, activation="relu")], name="inner")
    inputs = keras.Input((6,))
    h = keras.layers.Dense(6, activation="relu")(inputs)
    h = keras.layers.Add()([h, inner(h)])
    outputs = keras.layers.Dense(2)(keras.layers.ReLU()(h))
    return keras.Model(inputs, outputs)


def test_sequential_conversion_swaps_and_preserves_outputs():
    model = _sequential()
    x = np.random.default_rng(0).normal(size=(4, 8, 8, 3)).astype("float32")
    converted, report = memgrad.selective.convert(model, return_report=True)
    assert isinstance(converted, selective.LeanSequential)
    kinds = [type(layer) for layer in converted.layers]
    assert kinds[:3] == [selective.Conv2D, selective.BatchNormalization, selective.ReLU]
    assert kinds[3] is keras.layers.Conv2D and kinds[4:] == [selective.GlobalAveragePooling2D, selective.Dense,
                                                             selective.Dense]
    assert len(report.swapped) == 6
    assert report.kept[0][0] == model.layers[3].name and "dilation_rate" in report.kept[0][1]
    assert len(report.kept) == 1
    assert "swapped 6 layer(s)" in str(report)
    np.testing.assert_array_equal(converted(x, training=False), model(x, training=False))
    assert all(type(layer).__module__.startswith("keras") for layer in model.layers)  # original untouched


def test_functional_and_nested_conversion():
    model = _functional_with_nested()
    x = np.random.default_rng(1).normal(size=(3, 6)).astype("float32")
    converted, report = memgrad.selective.convert(model, return_report=True)
    names = {name for name, _ in report.swapped}
    assert len(report.swapped) == 5  # three Dense (one nested), an Add and a ReLU
    assert isinstance(converted, selective.LeanFunctional)
    assert any(isinstance(layer, keras.Sequential) for layer in converted.layers)
    nested = [layer for layer in converted.layers if isinstance(layer, keras.Sequential)][0]
    assert isinstance(nested, selective.LeanSequential)
    assert isinstance(nested.layers[-1], selective.Dense)
    assert names
    np.testing.assert_array_equal(converted(x), model(x))


@pytest.mark.slow
def test_converted_model_save_load_round_trip(tmp_path):
    converted = memgrad.selective.convert(_sequential())
    x = np.random.default_rng(2).normal(size=(4, 8, 8, 3)).astype("float32")
    path = tmp_path / "converted.keras"
    converted.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded, selective.LeanSequential)
    assert isinstance(loaded.layers[0], selective.Conv2D)
    np.testing.assert_array_equal(loaded(x, training=False), converted(x, training=False))


@pytest.mark.slow
def test_converted_model_trains_with_fit_and_eager_gradients_match():
    model = _sequential()
    model.layers[0].trainable = False
    converted = memgrad.selective.convert(model)
    x = np.random.default_rng(3).normal(size=(16, 8, 8, 3)).astype("float32")
    y = np.arange(16) % 3

    def grads(m):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, m(x, training=False),
                                                                               from_logits=True))
        return tape.gradient(loss, m.trainable_variables)

    for got, want in zip(grads(converted), grads(model)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    converted.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = converted.fit(x, y, epochs=2, batch_size=8, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))


def test_convert_rejects_what_it_cannot_rewire():
    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    model = Subclassed()
    model(np.ones((1, 3), "float32"))
    with pytest.raises(ValueError, match="subclassed model.*Received: Subclassed"):
        memgrad.selective.convert(model)
    with pytest.raises(ValueError, match="expects a Keras Model"):
        memgrad.selective.convert(keras.layers.Dense(2))


def _frozen_trunk():
    """A model whose first three layers are frozen after building (as in fine-tuning)."""
    keras.utils.set_random_seed(4)
    model = keras.Sequential([
        keras.Input((6, 6, 2)),
        keras.layers.Conv2D(3, 3, padding="same", name="frozen_conv"),
        keras.layers.BatchNormalization(name="frozen_bn"),
        keras.layers.Flatten(),
        keras.layers.Dense(5, activation="relu", name="frozen_dense"),
        keras.layers.Dense(2, name="head"),
    ])
    for name in ("frozen_conv", "frozen_bn", "frozen_dense"):
        model.get_layer(name).trainable = False
    return model


def _frozen_weights(model):
    return [model.get_layer(name).kernel for name in ("frozen_conv", "frozen_dense")] + [
        model.get_layer("frozen_bn").gamma, model.get_layer("frozen_bn").beta]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_frozen_weight_gradients_asked_for_match_keras(graph):
    model = _frozen_trunk()
    converted = memgrad.selective.convert(model)
    x = tf.constant(np.random.default_rng(6).normal(size=(4, 6, 6, 2)).astype("float32"))

    def grads(m):
        sources = _frozen_weights(m) + m.trainable_variables
        with tf.GradientTape() as tape:
            tape.watch([v.value for v in _frozen_weights(m)])  # asked for before the forward pass
            loss = tf.reduce_sum(tf.sin(m(x, training=False)))
        return tape.gradient(loss, sources)

    grads = tf.function(grads) if graph else grads
    for got, want in zip(grads(converted), grads(model), strict=True):
        assert got is not None
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("frozen", [True, False], ids=["frozen backbone", "trainable"])
def test_a_converted_training_step_in_a_graph_is_kerass_own_graph(frozen):
    """In a tf.function the converted layers trace Keras's computation: the step's graph has
    the same ops, type for type, as the unconverted model's (so its peak is Keras's: the
    measured check is tests/selective/test_memory.py)."""
    from memgrad.profiler.workloads import conv_classifier
    from tests.selective.finetune_probe import op_types

    model = conv_classifier(frozen, depth=4, channels=8)
    converted = memgrad.selective.convert(model)
    assert any(type(layer).__module__.startswith("memgrad") for layer in converted.layers)
    x, y = tf.zeros([2, 32, 32, 8]), tf.range(2) % 10

    def step_of(m):
        @tf.function
        def step():
            with tf.GradientTape() as tape:
                logits = m(x, training=False)
                loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
            return tape.gradient(loss, m.trainable_variables)

        return step

    assert op_types(step_of(converted)) == op_types(step_of(model))


def test_frozen_weight_gradients_unwatched_match_keras_in_tf_function():
    model = _frozen_trunk()
    converted = memgrad.selective.convert(model)
    x = tf.constant(np.random.default_rng(7).normal(size=(4, 6, 6, 2)).astype("float32"))

    @tf.function
    def grads(m):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.sin(m(x, training=False)))
        return tape.gradient(loss, _frozen_weights(m))

    for got, want in zip(grads(converted), grads(model), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)



def _with_lambdas(kind):
    scale = 0.5  # a closure, as Lambda functions usually have

    if kind == "sequential":
        return keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="relu"),
                                 keras.layers.Lambda(lambda t: t * scale, name="halve"), keras.layers.Dense(2)])
    inputs = keras.Input((6,))
    h = keras.layers.Dense(4, activation="relu")(inputs)
    h = keras.layers.Lambda(lambda t: tf.nn.softplus(t) * scale, name="halve")(h)
    return keras.Model(inputs, keras.layers.Dense(2)(h))


@pytest.mark.parametrize("kind", ["sequential", "functional"])
def test_lambda_layers_are_kept_and_reported(kind):
    model = _with_lambdas(kind)
    x = np.random.default_rng(8).normal(size=(3, 6)).astype("float32")
    converted, report = memgrad.selective.convert(model, return_report=True)
    assert converted.get_layer("halve") is model.get_layer("halve")
    assert [name for name, _ in report.kept] == ["halve"] and "Lambda" in report.kept[0][1]
    assert "kept halve: Lambda" in str(report)
    assert len(report.swapped) == 2 and all(isinstance(layer, selective.Dense) for layer in converted.layers
                                            if isinstance(layer, keras.layers.Dense))
    np.testing.assert_array_equal(converted(x), model(x))
