"""The two tape operations the selective layers are built on.

TensorFlow's eager tape keeps, for every recorded op, whatever that op type's
gradient *might* need (Conv2D keeps both inputs even when its kernel is frozen).
These layers instead run their forward pass unrecorded and record one operation
whose backward function holds only what the requested gradients need.
"""

from __future__ import annotations

import tensorflow as tf

from memgrad._src import tf_internals


def is_watched(tensor) -> bool:
    """Whether any active ``GradientTape`` will want a gradient with respect to ``tensor``."""
    return bool(tf_internals.should_record_backprop([tensor]))


def weights_wanted(layer, variables) -> bool:
    """Whether a tape may want the gradients of ``layer``'s ``variables``.

    They may be wanted if a tape is active and either the layer is trainable or a
    tape already watches one of the variables, i.e. the gradient of a frozen layer's
    weights was asked for before the forward pass (``tape.watch(layer.kernel.value)``).
    A tape learns which gradients are requested only when ``tape.gradient`` runs,
    after the forward pass; and Keras's variables are watched as soon as they are
    read (``trainable=False`` does not change that), so an explicit watch is the one
    request a layer can see in time. The layers' own reads run unrecorded, so they
    do not count as one. Without an active tape (plain inference) nothing is
    recorded, so a layer keeps nothing and builds no backward function.
    """
    if not tf_internals.could_possibly_record():
        return False
    return bool(layer.trainable or tf_internals.should_record_backprop([v.handle for v in variables]))


def stop_recording():
    """A context in which no tape records anything."""
    return tf_internals.stop_recording()


def record_backward(name, output, inputs, backward):
    """Records ``output = op(*inputs)`` on the active tapes with a hand-written ``backward``.

    Args:
      name: an op name for the tape.
      output: the forward result (computed without recording).
      inputs: the tensors the gradient flows to (variables as read tensors).
      backward: ``backward(d_output) -> list`` with one gradient (or ``None``)
        per input; it must capture only what it needs.
    """
    tf_internals.record_operation(name, [output], list(inputs), lambda d_output: backward(d_output))


def watched_read(variable):
    """Reads a Keras variable so that an active tape connects the read to the variable."""
    return tf.convert_to_tensor(getattr(variable, "value", variable))
