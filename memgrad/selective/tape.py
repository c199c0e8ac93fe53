"""The two tape operations the selective layers are built on.

TensorFlow's eager tape keeps, for every recorded op, whatever that op type's
gradient *might* need (Conv2D keeps both inputs even when its kernel is frozen).
These layers instead run their forward pass unrecorded and record one operation
whose backward function holds only what the requested gradients need.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.eager import record


def is_watched(tensor) -> bool:
    """Whether any active ``GradientTape`` will want a gradient with respect to ``tensor``."""
    return bool(record.should_record_backprop([tensor]))


def weights_wanted(layer) -> bool:
    """Whether a tape may want ``layer``'s weight gradients: it is trainable and a tape is active.

    Without an active tape (plain inference) nothing is recorded, so a layer keeps
    nothing and builds no backward function.
    """
    return bool(layer.trainable and record.could_possibly_record())


def stop_recording():
    """A context in which no tape records anything."""
    return record.stop_recording()


def record_backward(name, output, inputs, backward):
    """Records ``output = op(*inputs)`` on the active tapes with a hand-written ``backward``.

    Args:
      name: an op name for the tape.
      output: the forward result (computed without recording).
      inputs: the tensors the gradient flows to (variables as read tensors).
      backward: ``backward(d_output) -> list`` with one gradient (or ``None``)
        per input; it must capture only what it needs.
    """
    record.record_operation(name, [output], list(inputs), lambda d_output: backward(d_output))


def watched_read(variable):
    """Reads a Keras variable so that an active tape connects the read to the variable."""
    return tf.convert_to_tensor(getattr(variable, "value", variable))
