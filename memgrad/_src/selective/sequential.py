"""`LeanSequential`: a Sequential whose eager forward releases intermediates as it goes."""

from __future__ import annotations

import keras
import tensorflow as tf

from memgrad._src.selective.runner import call_operation


@keras.saving.register_keras_serializable(package="memgrad")
class LeanSequential(keras.Sequential):
    """A ``keras.Sequential`` that, when called eagerly, runs its layers in a plain loop.

    Keras runs a Sequential model through its functional graph, which keeps every
    layer's output until the call returns, so an eager forward pass peaks at all
    activations whatever the tape keeps. Looping over the layers lets each output
    go as soon as the next layer (and the tape, if it needs it) is done with it;
    a layer no gradient can flow through (frozen, on inputs no tape watches) runs
    unrecorded.
    Inside ``tf.function`` (``fit``, ``predict``) the functional graph is used
    unchanged: there TensorFlow frees tensors itself.

    Example:
      >>> model = LeanSequential([keras.Input((8,)), keras.layers.Dense(4)])
    """

    def call(self, inputs, training=None, mask=None):
        if not tf.executing_eagerly() or mask is not None:
            return super().call(inputs, training=training, mask=mask)
        outputs = inputs
        for layer in self.layers:
            outputs = call_operation(layer, layer, (outputs,), {"training": training})
        return outputs
