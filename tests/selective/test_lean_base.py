"""The base every selective layer is built on, `LeanLayer`, on a toy layer ``y = x * w``:
which path each call takes, what its backward is told is wanted, and gradients equal to
plain autodiff of the same computation."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from memgrad import selective
from memgrad._src.selective.lean_layer import LeanLayer, Wanted


class Scale(keras.layers.Layer):
    """``y = x * w``, Keras's way (what the tape records in full)."""

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1],), initializer=keras.initializers.Constant(1.5))

    def call(self, inputs):
        return inputs * self.w


class LeanScale(LeanLayer, Scale):
    """The same layer on the base: its backward keeps ``x`` only for ``w``'s gradient."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seen = []  # the `wanted` of each call that took the lean path

    def call(self, inputs):
        return self.lean_call(inputs)

    def lean_weights(self):
        return [self.w]

    def lean_backward(self, inputs, outputs, wanted):
        self.seen.append(wanted)
        kept = inputs if wanted.weights else None
        w = tf.convert_to_tensor(self.w.value) if wanted.inputs else None

        def backward(d_out):
            grads = [d_out * w if wanted.inputs else None]
            if wanted.weights:
                grads.append(tf.reduce_sum(d_out * kept, axis=0))
            return grads

        return backward


def _pair(trainable):
    layers = [Scale(), LeanScale()]
    for layer in layers:
        layer.build((None, 3))
        layer.w.assign([0.5, -2.0, 3.0])
        layer.trainable = trainable
    return layers


X = np.array([[1.0, 2.0, -1.0], [0.5, -0.25, 4.0]], "float32")


def _step(layer, watch_input, watch_weight=False):
    x = tf.constant(X)
    with tf.GradientTape() as tape:
        if watch_input:
            tape.watch(x)
        if watch_weight:
            tape.watch(layer.w.value)
        y = layer(x)
        loss = tf.reduce_sum(tf.sin(y))
    return y, tape.gradient(loss, [x, layer.w])


@pytest.mark.parametrize("trainable, watch_input, watch_weight, wanted", [
    (True, True, False, Wanted(inputs=True, weights=True)),
    (True, False, False, Wanted(inputs=False, weights=True)),
    (False, True, False, Wanted(inputs=True, weights=False)),
    (False, True, True, Wanted(inputs=True, weights=True)),  # a frozen layer's weight asked for
])
def test_the_backward_is_told_what_is_wanted_and_matches_autodiff(trainable, watch_input, watch_weight, wanted):
    plain, lean = _pair(trainable)
    y_ref, g_ref = _step(plain, watch_input, watch_weight)
    y, g = _step(lean, watch_input, watch_weight)
    assert lean.seen == [wanted]
    np.testing.assert_array_equal(y, y_ref)
    for got, want, is_wanted in zip(g, g_ref, wanted, strict=True):
        if is_wanted:
            np.testing.assert_allclose(got, want, rtol=1e-6)
        else:
            assert got is None


def test_a_call_no_gradient_can_flow_through_records_nothing():
    plain, lean = _pair(trainable=False)
    _, g_ref = _step(plain, watch_input=False)
    y, g = _step(lean, watch_input=False)
    assert lean.seen == []
    assert g == [None, None]
    assert g_ref[1] is not None  # Keras's tape records the frozen weight's read anyway
    np.testing.assert_array_equal(y, X * np.array([0.5, -2.0, 3.0], "float32"))


def test_inside_a_tf_function_keras_computes_and_autodiff_differentiates():
    plain, lean = _pair(trainable=True)

    @tf.function
    def grads(layer):
        return _step(layer, watch_input=True)

    (y_ref, g_ref), (y, g) = grads(plain), grads(lean)
    assert lean.seen == []
    np.testing.assert_array_equal(y, y_ref)
    for got, want in zip(g, g_ref, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_setting_the_layer_rejects_runs_keras_recorded():
    class Picky(LeanScale):
        def lean_applies(self, inputs):
            return False

    layer = Picky()
    layer.build((None, 3))
    _, g = _step(layer, watch_input=True)
    assert layer.seen == [] and all(t is not None for t in g)


def test_a_list_input_gets_one_gradient_per_element():
    a, b = tf.constant([1.0, 2.0]), tf.constant([3.0, -1.0])
    with tf.GradientTape() as tape:
        tape.watch(b)  # only b is watched: the recorded op still returns a gradient per input
        loss = tf.reduce_sum(selective.Add()([a, b]) ** 2)
    np.testing.assert_allclose(tape.gradient(loss, b), 2 * (a + b))


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_public_selective_layer_is_registered_once_on_the_base():
    """A drop-in layer is one entry in registry.LAYERS: memgrad.selective's names and
    convert's table come from there, and every layer built on the base under the name of a
    Keras layer is in it (so none is public yet unconvertible, or written but unlisted)."""
    import importlib
    import inspect

    from memgrad._src.selective import registry

    convert_module = importlib.import_module("memgrad._src.selective.convert")  # the package's `convert` is the function

    public = {getattr(selective, name) for name in selective.__all__}
    layers = {c for c in public if inspect.isclass(c) and issubclass(c, keras.layers.Layer)
              and not issubclass(c, keras.Model)}
    assert layers == set(registry.LAYERS) and len(registry.LAYERS) == len(set(registry.LAYERS))
    assert [c.__name__ for c in layers if not issubclass(c, LeanLayer)] == []
    assert set(convert_module.REPLACEMENTS.values()) == layers
    assert all(convert_module.REPLACEMENTS[registry.keras_counterpart(c)] is c for c in layers)
    named_after_keras = {c for c in _subclasses(LeanLayer) if c.__module__.startswith("memgrad.")
                         and getattr(keras.layers, c.__name__, None) in c.__mro__}
    assert named_after_keras == layers
    assert LeanLayer in public  # the base users subclass (docs/design.md)
    documented = convert_module.convert.__doc__
    assert [c.__name__ for c in layers if c.__name__ not in documented] == [], "convert's docstring lists them"


def test_a_layer_not_named_after_its_keras_base_cannot_be_registered():
    from memgrad._src.selective import registry

    class Renamed(LeanLayer, keras.layers.Dense):
        pass

    with pytest.raises(TypeError, match="of its own name.*Renamed"):
        registry.keras_counterpart(Renamed)
