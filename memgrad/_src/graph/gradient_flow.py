"""Which forward ops backprop differentiates, and what a custom gradient reads.

TensorFlow calls an op's gradient function only when some gradient reaches one of its
outputs. A `tf.custom_gradient` (an ``IdentityN`` op whose attribute ``_gradient_op_type``
names the user's function) returns None for the results it passes through, so the ops
that computed them (inside the custom function: ``x * sigmoid(x)`` of Keras's swish) are
never differentiated: their gradients read nothing and hold nothing. What the custom
gradient itself reads is whatever its Python function uses from the forward pass (for
swish, the input ``x``: the sigmoid is recomputed), found by calling it once in a
throwaway function graph nested in the forward graph and looking at what it captures.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from memgrad._src import tf_internals


@dataclasses.dataclass(frozen=True)
class CustomReads:
    """What a custom gradient function reads and where it sends gradients.

    Attributes:
      tensors: the forward graph's tensors it reads (captured by its gradient ops).
      differentiated: indices of the op's inputs it returns a gradient for.
    """

    tensors: tuple
    differentiated: frozenset


def is_custom(op):
    """Whether ``op``'s gradient is a user's function (`tf.custom_gradient`)."""
    return "_gradient_op_type" in op.node_def.attr


@tf.autograph.experimental.do_not_convert
def custom_reads(op):
    """`CustomReads` of a custom-gradient op, or None when its function cannot be called on
    the side (then the caller counts every input and output as read).

    The function is called in a function graph nested in ``op.graph`` that nothing runs.
    Each call calls the user's function once: callers keep what it found (`read_once`).
    """
    try:
        function = tf_internals.get_gradient_function(op)
        with op.graph.as_default():
            scratch = tf_internals.FuncGraph("memgrad_custom_gradient_probe")
        with scratch.as_default():
            dys = [tf.compat.v1.placeholder(t.dtype, t.shape) if t.dtype.is_floating else None
                   for t in op.outputs]
            grads = function(op, *dys)
        grads = grads if isinstance(grads, (list, tuple)) else [grads]
        read = tuple(external for external, _ in scratch.captures
                     if getattr(external, "graph", None) is op.graph)
        return CustomReads(read, frozenset(i for i, g in enumerate(grads) if g is not None))
    except Exception:  # noqa: BLE001 - a function that cannot run alone: counted as reading all
        return None


def read_once(op, memo):
    """`custom_reads` of ``op``, kept in the dict ``memo``: the user's function is called
    once per op however many times its readings are asked for."""
    if op not in memo:
        memo[op] = custom_reads(op)
    return memo[op]


def differentiated_ops(ops, y_refs, region=(), customs=None):
    """The ops among ``ops`` (a topological order) whose gradient functions backprop calls:
    those with an output among ``y_refs`` or consumed where a gradient comes back from.

    An output consumed by an op outside ``ops`` counts as receiving a gradient when that op
    is in ``region`` (the ops ``ys`` depend on: the conservative reading); by a
    custom-gradient op, only at an input it returns a gradient for (``customs``: the memo of
    `read_once`, shared with the caller so no function is called twice).
    """
    customs = {} if customs is None else customs
    members = set(ops)
    flowing = set()
    for op in reversed(ops):
        for t in op.outputs:
            if t.ref() in y_refs or any(_passes(c, t, members, flowing, region, customs) for c in t.consumers()):
                flowing.add(op)
                break
    return flowing


def _passes(consumer, tensor, members, flowing, region, customs):
    if consumer not in members:
        return consumer in region
    if consumer not in flowing:
        return False
    if not is_custom(consumer):
        return True
    reads = read_once(consumer, customs)
    if reads is None:
        return True
    return any(consumer.inputs[i].ref() == tensor.ref() for i in reads.differentiated
               if i < len(consumer.inputs))


def feeding(made, in_grads, needed):
    """The ops among `made` (a gradient function's) that compute the gradients of the
    inputs in `needed`."""
    if not isinstance(in_grads, (list, tuple)):
        in_grads = [in_grads]
    made_set = set(made)
    stack = []
    for i, g in enumerate(in_grads):
        if i in needed and g is not None:
            parts = (g.values, g.indices) if isinstance(g, tf.IndexedSlices) else (g,)
            stack.extend(t.op for t in parts if hasattr(t, "op"))
    found = set()
    while stack:
        g_op = stack.pop()
        if g_op in found or g_op not in made_set:
            continue
        found.add(g_op)
        stack.extend(t.op for t in g_op.inputs)
        stack.extend(g_op.control_inputs)
    return [g_op for g_op in made if g_op in found]
