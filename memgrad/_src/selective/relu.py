"""A ReLU that keeps a 1-byte mask for backprop instead of its float output."""

from __future__ import annotations

import weakref

import keras
import tensorflow as tf

from memgrad._src.selective.lean_layer import LeanLayer, lean_apply


class _SavedForRelu:
    """What a masked ReLU's backward reads: its mask, or its output if a consumer keeps that."""

    __slots__ = ("mask", "output")

    def __init__(self, mask):
        self.mask, self.output = mask, None


# What each masked ReLU output's backward reads, by id of the output (EagerTensors are not
# hashable, and memgrad sets no attributes on TensorFlow's objects). An entry leaves when its
# tensor is freed (a weakref finalizer) or once a consumer shares the tensor.
_saved_for_output = {}


def _remember(tensor, saved):
    key = id(tensor)
    _saved_for_output[key] = saved
    weakref.finalize(tensor, _saved_for_output.pop, key, None)


def share_kept_input(tensor) -> None:
    """Tells the masked ReLU that produced ``tensor`` (if one did) that ``tensor`` is kept anyway.

    A layer that keeps its input for its own backward calls this; the ReLU then
    drops its mask and reads ``tensor > 0`` instead, so a ReLU feeding a trainable
    layer costs no more than Keras's ReLU (which keeps its output).
    """
    saved = _saved_for_output.pop(id(tensor), None)  # popped: `saved` now holds the tensor
    if saved is not None:
        saved.output, saved.mask = tensor, None


def _relu(x, max_value):
    return tf.nn.relu(x) if max_value is None else keras.activations.relu(x, max_value=max_value)


def masked_relu_forward(x, max_value):
    """``(relu(x), backward)``: the backward keeps the mask, or the output once a consumer keeps it."""
    y = _relu(x, max_value)
    saved = _SavedForRelu(x > 0 if max_value is None else (y > 0) & (y < max_value))
    _remember(y, saved)  # lets the next layer share what it keeps

    def backward(dy):
        if saved.mask is None:  # the output is kept anyway: TensorFlow's own kernel
            if max_value is None:
                return [tf.raw_ops.ReluGrad(gradients=dy, features=saved.output)]
            inside = (saved.output > 0) & (saved.output < max_value)
            return [dy * tf.cast(inside, dy.dtype)]
        return [dy * tf.cast(saved.mask, dy.dtype)]

    return y, backward


def masked_relu(x, max_value=None):
    """``max(x, 0)`` whose gradient keeps only the boolean mask ``x > 0`` (1 byte per element).

    With ``max_value`` (``ReLU(6.0)``, MobileNet's) it is ``min(max(x, 0), max_value)``
    and the mask is ``0 < x < max_value``.

    In a graph (``tf.function``) this is ``tf.nn.relu``: TensorFlow's graph
    gradient already frees what is not needed, and a custom gradient there
    measured 1.5x *more* memory (it blocks grappler's fusions).

    Args:
      x: a float tensor.
      max_value: ``None``, or the upper clip.

    Returns:
      ``relu(x)``, with the same gradient as ``tf.nn.relu`` (``keras.activations.relu``
      with ``max_value``).

    Example:
      >>> masked_relu(tf.constant([-1.0, 2.0])).numpy()
      array([0., 2.], dtype=float32)
    """
    return lean_apply("memgrad_MaskedRelu", x, lambda t: _relu(t, max_value),
                      lambda t: masked_relu_forward(t, max_value))


@keras.saving.register_keras_serializable(package="memgrad")
class ReLU(LeanLayer, keras.layers.ReLU):
    """`keras.layers.ReLU` that keeps a 1-byte mask instead of its float output.

    The plain ReLU (``negative_slope=0``, ``threshold=0``) and the clipped one
    (``max_value``, e.g. MobileNet's ``ReLU(6.0)``) use the mask; other settings
    run Keras's computation (`convert` leaves those layers to Keras and says so).

    Example:
      >>> ReLU()(tf.constant([-1.0, 2.0])).numpy()
      array([0., 2.], dtype=float32)
    """

    def _check_supported(self):
        if self.negative_slope != 0 or self.threshold != 0:
            raise ValueError("memgrad's ReLU keeps a mask for negative_slope=0 and threshold=0. Received: "
                             f"negative_slope={self.negative_slope}, threshold={self.threshold}")

    def call(self, inputs):
        return self.lean_call(inputs)

    def lean_applies(self, inputs):
        return self.negative_slope == 0 and self.threshold == 0

    def lean_forward(self, inputs, wanted):
        return masked_relu_forward(inputs, self.max_value)
