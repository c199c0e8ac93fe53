"""What a `ReversibleSequence` carries from block to block: an activation whole, or as the two
channel halves that coupling blocks work on, and its gradient in a dtype of its own.

Consecutive couplings pass the halves on as they are: joining them (a concatenation) and
splitting them again (a channel slice, which copies) at every block boundary cost four
half-sized copies of the activation and as many of its gradient, alive at once in the backward
pass. The stack joins them only for a block that takes a whole tensor, and at its ends.
"""

from __future__ import annotations

import tensorflow as tf

from memgrad._src.recompute import gate
from memgrad._src.reversible.base import split_channels

_WIDTH = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64}


def _owner(cls, name):
    """The class in ``cls``'s method resolution order that defines ``name``."""
    return next((klass for klass in cls.__mro__ if name in vars(klass)), object)


def takes_halves(block) -> bool:
    """Whether ``block`` works on channel halves (``forward_halves``/``backward_halves``).

    Not when a subclass overrides ``forward``, ``backward`` or ``forward_and_save`` below
    where the halves' methods are defined, nor when the instance replaces one: the stack then
    runs what was written.
    """
    if not getattr(block, "takes_halves", False):
        return False
    if any(method in vars(block) for method in ("forward", "backward", "forward_and_save")):
        return False  # replaced on the instance
    cls = type(block)
    return all(issubclass(_owner(cls, halves_method), _owner(cls, method))
               for halves_method in ("forward_halves", "backward_halves")
               for method in ("forward", "backward", "forward_and_save"))


def is_pair(carried) -> bool:
    return isinstance(carried, (list, tuple))


def whole(carried):
    """``carried`` as one tensor: a pair of halves joined along the channel axis."""
    return tf.concat(list(carried), axis=-1) if is_pair(carried) else carried


def halves(carried):
    """``carried`` as a new list of its two channel halves (a coupling may empty it)."""
    return list(carried) if is_pair(carried) else list(split_channels(carried))


def take(pair):
    """The two halves in ``pair``, a list, which is left empty: eagerly a tensor lives while
    anything refers to it, and a coupling releases each half once it no longer needs it."""
    first, second = pair
    pair.clear()
    return first, second


def chained(outputs, inputs):
    """A coupling's output halves, a half passed through unchanged made to wait for the other.

    Otherwise nothing orders the next block after this one on that half: in a graph the
    executor may run every later block's networks on it at once (consecutive affine
    couplings condition on the same half), holding all their outputs. Eagerly, or with no
    half passed through, ``outputs`` come back as they are.
    """
    first, second = outputs
    if first is inputs[0]:
        first = gate(first, [second])
    if second is inputs[1]:
        second = gate(second, [first])
    return [first, second]


def carried_spec(carried):
    """The `tf.TensorSpec` of ``carried`` joined."""
    if not is_pair(carried):
        return tf.TensorSpec(carried.shape, carried.dtype)
    first, second = carried
    channels = (None if first.shape[-1] is None or second.shape[-1] is None
                else first.shape[-1] + second.shape[-1])
    return tf.TensorSpec(first.shape[:-1].concatenate([channels]), first.dtype)


def cast(carried, dtype):
    """``carried`` (a tensor or a pair) cast to ``dtype``."""
    return tf.nest.map_structure(lambda t: tf.cast(t, dtype), carried)


class _Rounded:
    """A float64 output kept as its float32 rounding and the float32 residual."""

    def __init__(self, rounded, residual):
        self.rounded, self.residual = rounded, residual


def keep_output(output, rounded):
    """What the backward pass keeps of the stack's ``output`` (the carried activation: a tensor
    or a pair of halves), given ``rounded``, the same structure cast to the outer dtype.

    Returns:
      ``(kept, returned)``: ``returned`` is ``rounded`` joined, the stack's output to its
      caller. A float64 output around a float32 stack is kept as ``returned`` (which the
      caller's computation holds anyway) and the float32 residual ``output - rounded``:
      48 of the 53 bits, the output to about 4e-15, in half the bytes of a float64 copy.
      Otherwise ``kept`` is ``output`` itself.
    """
    returned = whole(rounded)
    first = tf.nest.flatten(output)[0]
    if first.dtype != tf.float64 or returned.dtype != tf.float32:
        return output, returned
    residual = tf.nest.map_structure(
        lambda wide, narrow: tf.cast(wide - tf.cast(narrow, tf.float64), tf.float32),
        output, rounded)
    return _Rounded(returned, residual), returned


def restore_output(kept):
    """The output `keep_output` kept, in the carried dtype (a new structure on every call)."""
    if not isinstance(kept, _Rounded):
        return halves(kept) if is_pair(kept) else kept
    if is_pair(kept.residual):
        return [tf.cast(part, tf.float64) + tf.cast(residual, tf.float64)
                for part, residual in zip(split_channels(kept.rounded), kept.residual)]
    return tf.cast(kept.rounded, tf.float64) + tf.cast(kept.residual, tf.float64)


def gradient_dtype(invertible_dtype, outer_dtype):
    """The dtype of the activations' gradients between blocks.

    The stack's outer dtype (that of its input and output), widened to float32, never wider
    than the invertible dtype: float64 activations around float32 networks carry float32
    gradients. Only the activations need the wide dtype, to rebuild each block's input
    exactly; a gradient's rounding is the networks' own, as in plain autodiff, which also
    carries activations' gradients in the compute dtype between layers.
    """
    outer, inner = tf.as_dtype(outer_dtype).name, tf.as_dtype(invertible_dtype).name
    widened = "float32" if _WIDTH.get(outer, 32) < 32 else outer
    return inner if _WIDTH.get(widened, 32) > _WIDTH.get(inner, 32) else widened


def forward(block, carried, training):
    """One block of the stack's forward pass: ``(carried output, logdet, saved)``."""
    if takes_halves(block):  # consecutive couplings: no join, no split
        inputs = halves(carried)
        first, second, logdet = block.forward_halves(*inputs, training=training)
        return chained([first, second], inputs), logdet, None
    return block.forward_and_save(whole(carried), training=training)


def backward(block, state, dlogdet, variables, training, extra):
    """One block of the stack's backward pass: ``(carried input, its gradient, variable
    gradients)``. ``state`` is ``[carried output, its gradient]``, a list this empties, so
    that eagerly each half is released once the block no longer needs it; the gradient keeps
    its dtype."""
    carried, gradient = state
    state.clear()
    if takes_halves(block):
        pair, d_pair = halves(carried), halves(gradient)
        del carried, gradient
        return block.backward_halves(pair, d_pair, dlogdet, variables, training=training, **extra)
    # A block's own backward takes the gradient in its activations' dtype.
    y = whole(carried)
    x, dx, grads = block.backward(y, tf.cast(whole(gradient), y.dtype), dlogdet, variables,
                                  training=training, **extra)
    return x, tf.cast(dx, tf.nest.flatten(gradient)[0].dtype), grads
