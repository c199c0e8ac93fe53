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


class OneInputLean:
    """Base of the selective layers with one input and no weights of their own.

    It owns the guard and the recording: where an eager tape watches the input and
    `lean_applies` agrees, the forward pass runs unrecorded and one operation is recorded
    whose backward function is the one `lean_forward` returns; anywhere else (inside a
    ``tf.function``, no tape, a setting the layer does not handle) Keras's own computation
    runs. A layer states only what its backward keeps, by what that function captures.
    Subclasses call `_lean_call` from their ``call``, whose signature Keras reads.
    """

    def lean_applies(self, inputs, **kwargs) -> bool:
        """Whether this call takes the lean path (default: always, when watched)."""
        del inputs, kwargs
        return True

    def lean_forward(self, inputs, **kwargs):
        """``(outputs, backward)``, computed unrecorded: Keras's outputs and
        `lean_backward`'s function (subclasses that compute more override this)."""
        outputs = super().call(inputs, **kwargs)
        return outputs, self.lean_backward(inputs, outputs)

    def lean_backward(self, inputs, outputs):
        """``backward(d_outputs) -> [d_inputs]``, capturing only what it needs."""
        raise NotImplementedError(f"{type(self).__name__} must define lean_backward or lean_forward")

    def _lean_call(self, inputs, **kwargs):
        inputs = tf.convert_to_tensor(inputs)
        if not (tf.executing_eagerly() and is_watched(inputs) and self.lean_applies(inputs, **kwargs)):
            return super().call(inputs, **kwargs)
        with stop_recording():
            outputs, backward = self.lean_forward(inputs, **kwargs)
        record_backward(f"memgrad_{type(self).__name__}", outputs, [inputs], backward)
        return outputs
