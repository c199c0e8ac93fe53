"""The two tape operations the selective layers are built on.

TensorFlow's eager tape keeps, for every recorded op, whatever that op type's
gradient *might* need (Conv2D keeps both inputs even when its kernel is frozen).
These layers instead run their forward pass unrecorded and record one operation
whose backward function holds only what the requested gradients need.
"""

from __future__ import annotations

from typing import NamedTuple

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


def computed_weights(layer) -> bool:
    """Whether ``layer``'s weights are computed (LoRA, quantization) rather than its variables."""
    return bool(getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None))


def lean_apply(name, x, keras_fn, lean_forward):
    """The guard of the selective activation functions (`masked_relu`, `lean_gelu`).

    ``keras_fn(x)`` unless an eager tape watches ``x``; then ``lean_forward(x) ->
    (y, backward)`` runs unrecorded and ``y`` is recorded with that ``backward``
    (``backward(dy) -> [dx]``). `LeanLayer` is the same guard for layers.
    """
    if not (tf.executing_eagerly() and is_watched(x)):
        return keras_fn(x)
    with stop_recording():
        y, backward = lean_forward(x)
    record_backward(name, y, [x], backward)
    return y


class Wanted(NamedTuple):
    """Which gradients a recorded call may be asked for."""

    inputs: bool   # an active tape watches an input
    weights: bool  # the gradients of the layer's `lean_weights` may be requested


class LeanLayer:
    """Base of memgrad's selective layers: it owns the guard and the recording.

    Anywhere Keras's computation is exact and lean enough (inside a ``tf.function``, or a
    setting `lean_applies` rejects) the layer runs `keras_call`. In eager mode, a call
    through which no gradient can flow (no tape watches an input, and the gradients of
    `lean_weights` cannot be requested: see `weights_wanted`) runs unrecorded. Anywhere
    else the forward pass runs unrecorded through `lean_forward`, and one operation is
    recorded whose backward function is the one it returns. A layer states only what its
    backward keeps, by what that function captures.

    The backward function, ``backward(d_outputs) -> list``, returns one gradient (or
    ``None``) per input tensor (per element of a list input) and then, when
    ``wanted.weights``, one per variable of `lean_weights`, in order. Subclasses call
    `lean_call` from their ``call``, whose signature Keras reads; a layer that keeps
    its input for its backward calls `share_kept_input` on it, so a masked ReLU before
    it need not keep a mask too.

    Example:
      ```python
      class LeanScale(memgrad.selective.LeanLayer, Scale):   # Scale: y = x * w, a Keras layer
          def call(self, inputs):
              return self.lean_call(inputs)

          def lean_weights(self):
              return [self.w]

          def lean_backward(self, inputs, outputs, wanted):
              kept = inputs if wanted.weights else None      # x, only for w's gradient
              w = tf.convert_to_tensor(self.w.value)

              def backward(d_out):
                  grads = [d_out * w if wanted.inputs else None]
                  if wanted.weights:
                      grads.append(tf.reduce_sum(d_out * kept, axis=0))
                  return grads

              return backward
      ```
      docs/design.md runs it whole.
    """

    def lean_weights(self) -> list:
        """The variables whose gradients the backward returns (default: none)."""
        return []

    def lean_applies(self, inputs, **kwargs) -> bool:
        """Whether this call takes the lean path (default: always, in eager mode)."""
        del inputs, kwargs
        return True

    def keras_call(self, inputs, **kwargs):
        """Keras's own computation of this call."""
        return super().call(inputs, **kwargs)

    def lean_forward(self, inputs, wanted, **kwargs):
        """``(outputs, backward)``, computed unrecorded: `keras_call`'s outputs and
        `lean_backward`'s function (subclasses that compute more override this)."""
        outputs = self.keras_call(inputs, **kwargs)
        return outputs, self.lean_backward(inputs, outputs, wanted)

    def lean_backward(self, inputs, outputs, wanted):
        """The backward function (see the class docstring), capturing only what it needs."""
        raise NotImplementedError(f"{type(self).__name__} must define lean_backward or lean_forward")

    def lean_call(self, inputs, **kwargs):
        """Runs this call on the path the class docstring describes; a subclass's ``call``
        returns ``self.lean_call(inputs, **kwargs)``."""
        if isinstance(inputs, (list, tuple)):
            inputs = [tf.convert_to_tensor(t) for t in inputs]
            tensors = list(inputs)
        else:
            inputs = tf.convert_to_tensor(inputs)
            tensors = [inputs]
        if not (tf.executing_eagerly() and self.lean_applies(inputs, **kwargs)):
            return self.keras_call(inputs, **kwargs)
        weights = self.lean_weights()
        wanted = Wanted(inputs=any(is_watched(t) for t in tensors),
                        weights=bool(weights) and weights_wanted(self, weights))
        if not any(wanted):  # no gradient can flow through this call: record nothing
            with stop_recording():
                return self.keras_call(inputs, **kwargs)
        with stop_recording():
            outputs, backward = self.lean_forward(inputs, wanted, **kwargs)
        reads = [watched_read(v) for v in weights] if wanted.weights else []
        record_backward(f"memgrad_{type(self).__name__}", outputs, tensors + reads, backward)
        return outputs
