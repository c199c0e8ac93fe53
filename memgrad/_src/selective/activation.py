"""Activations whose backward keeps less than TensorFlow's: ReLU a 1-byte mask, GELU its input."""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from memgrad._src.selective.relu import masked_relu_forward, masked_relu
from memgrad._src.selective.lean_layer import LeanLayer, lean_apply


def _gelu_slope(x, approximate):
    """d gelu(x) / dx, in float32 (float64 for float64 ``x``)."""
    t = tf.cast(x, tf.float64 if x.dtype == tf.float64 else tf.float32)
    if approximate:
        c = math.sqrt(2.0 / math.pi)
        th = tf.tanh(c * (t + 0.044715 * t ** 3))
        return 0.5 * (1.0 + th) + 0.5 * t * (1.0 - th * th) * c * (1.0 + 3 * 0.044715 * t * t)
    return 0.5 * (1.0 + tf.math.erf(t / math.sqrt(2.0))) + t * tf.exp(-0.5 * t * t) / math.sqrt(2 * math.pi)


def _lean_gelu_forward(x, approximate):
    """``(gelu(x), backward)``: the backward keeps ``x`` only."""
    y = keras.activations.gelu(x, approximate=approximate)

    def backward(dy):
        slope = _gelu_slope(x, approximate)
        return [tf.cast(tf.cast(dy, slope.dtype) * slope, dy.dtype)]

    return y, backward


def lean_gelu(x, approximate=False):
    """``keras.activations.gelu(x, approximate)`` whose backward keeps only ``x``.

    TensorFlow's tape keeps five tensors of ``x``'s size for GELU (measured: 20 MiB
    for a 4 MiB input); its derivative needs only ``x``. Outside an eager tape
    this is Keras's GELU. (In a graph, custom gradients that computed the slope in
    backprop, gated on the incoming gradient, or in the forward pass both left three
    tensors of ``x``'s size alive at the peak of a keras-hub BERT step, as Keras's
    does; the gated one peaked 2-3% higher.)

    Args:
      x: a float tensor.
      approximate: the tanh approximation, as in Keras.

    Returns:
      ``gelu(x)``, bit for bit Keras's, with the same gradient.

    Example:
      >>> y = lean_gelu(tf.constant([-1.0, 2.0]))
    """
    return lean_apply("memgrad_Gelu", x, lambda t: keras.activations.gelu(t, approximate=approximate),
                      lambda t: _lean_gelu_forward(t, approximate))


def _gelu_exact(x):
    return lean_gelu(x, approximate=False)


def _gelu_tanh(x):
    return lean_gelu(x, approximate=True)


def _is_keras_hub_gelu_approximate(activation):
    # keras-hub's BERT-family backbones use keras_hub's own
    # ``gelu_approximate(x) = keras.activations.gelu(x, approximate=True)``; recognised by
    # name, since memgrad does not import keras-hub.
    return (getattr(activation, "__name__", None) == "gelu_approximate"
            and getattr(activation, "__module__", "").startswith("keras_hub."))


def _lean_version(activation):
    """``(function, forward)`` of ``activation``'s memgrad version, or None if there is none:
    the function (`masked_relu`, `lean_gelu`) and its ``forward(x) -> (y, backward)``."""
    if activation is keras.activations.relu:
        return masked_relu, lambda x: masked_relu_forward(x, None)
    if activation is keras.activations.gelu:
        return _gelu_exact, lambda x: _lean_gelu_forward(x, approximate=False)
    if _is_keras_hub_gelu_approximate(activation):
        return _gelu_tanh, lambda x: _lean_gelu_forward(x, approximate=True)
    return None


def lean_activation(activation):
    """The memgrad version of a Keras activation function, or ``None`` if there is none.

    ``relu`` (Keras's defaults) becomes `masked_relu`, ``gelu`` (and keras-hub's
    ``gelu_approximate``) `lean_gelu`.
    """
    version = _lean_version(activation)
    return None if version is None else version[0]


def apply_activation(activation, x):
    """``activation(x)``, through its memgrad version when there is one."""
    lean = lean_activation(activation)
    return (lean or activation)(x)


@keras.saving.register_keras_serializable(package="memgrad")
class Activation(LeanLayer, keras.layers.Activation):
    """`keras.layers.Activation` that keeps a 1-byte mask for ``"relu"`` and only the input for ``"gelu"``.

    Same constructor and outputs as ``keras.layers.Activation``; only ``relu`` and
    ``gelu`` are supported (`convert` leaves other activations to Keras and says
    so in its report).

    Args:
      activation: ``"relu"`` or ``"gelu"`` (or those Keras functions).
      **kwargs: the base layer's keyword arguments.

    Returns:
      A layer computing ``activation(inputs)``.

    Example:
      >>> Activation("relu")(tf.constant([-1.0, 2.0])).numpy()
      array([0., 2.], dtype=float32)
    """

    def __init__(self, activation, **kwargs):
        super().__init__(activation, **kwargs)
        self._check_supported()

    def _check_supported(self):
        if lean_activation(self.activation) is None:
            name = getattr(self.activation, "__name__", repr(self.activation))
            raise ValueError(f"memgrad's Activation keeps less than Keras's only for 'relu' and 'gelu'. "
                             f"Received: activation={name!r}")

    def call(self, inputs):
        return self.lean_call(inputs)

    def lean_forward(self, inputs, wanted):
        return _lean_version(self.activation)[1](inputs)
