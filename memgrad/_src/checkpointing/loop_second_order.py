"""A loop gradient that can be differentiated again: the second derivative of a segmented
or replayed loop gradient, taken on TensorFlow's own gradient of a replay of the loop."""

import tensorflow as tf

from memgrad._src import tf_internals
from memgrad._src.checkpointing import gradient_walk
from memgrad._src.checkpointing.loop_ops import loop_copy


def differentiable_again(op, grads, build):
    """The loop input gradients ``build()`` makes, with TensorFlow's own second derivative.

    A segmented gradient reads each segment's start from the states the forward loop keeps,
    which TensorFlow's loop gradient treats as accumulators and never differentiates: a
    gradient of it (a tf.GradientTape around memgrad's, tf.gradients of its result) would
    miss how those states depend on the loop's inputs, and be silently wrong. A replay's
    copy of the loop is made with Graph.create_op, which no tape records. So the gradient is
    wrapped in a custom gradient whose own gradient is taken on TensorFlow's loop gradient
    of a replay of the whole loop, built only when something differentiates it (then it
    holds every step's intermediates, as tf.gradients would).
    """
    inputs = list(op.inputs)  # before the segments add the kept states to the forward loop
    attrs = dict(op.node_def.attr)
    grads = list(grads)
    wanted = [i for i, t in enumerate(inputs) if carries_gradient(t)]
    given = [j for j, g in enumerate(grads) if isinstance(g, tf.Tensor) and carries_gradient(g)]
    sources = {}  # each tensor once: tf.gradients gives a repeated source its whole gradient
    for t in [inputs[i] for i in wanted] + [grads[j] for j in given]:
        if t.dtype == tf.variant and t.op.type in _EMPTY_LISTS:
            # A list the loop fills holds no value of its inputs: nothing to differentiate,
            # and XLA cannot build the zeros of an uninitialized list a gradient would need.
            continue
        sources.setdefault(t.ref(), t)
    sources = list(sources.values())
    results = {}

    @tf.custom_gradient
    def segmented(*args):
        in_grads = list(build())
        results["positions"] = [i for i, g in enumerate(in_grads)
                                if isinstance(g, tf.Tensor) and carries_gradient(g)]
        flat = [in_grads[i] for i in results["positions"]]
        results["others"] = in_grads

        def second_order(*upstream, variables=None):
            if tf.compat.v1.get_default_graph() is not op.graph:
                found = _across_graphs(flat, sources, upstream, op.graph)
                return (found, [None] * len(variables)) if variables is not None else found
            replay = loop_copy(op, inputs, attrs, "memgrad_second_order")
            plain = list(tf_internals.while_gradient(replay, *grads))
            pairs = [(plain[i], dy) for i, dy in zip(results["positions"], upstream)
                     if dy is not None and plain[i] is not None]
            # The replay reads the loop's own inputs: its gradient is theirs. Each source
            # gets only its own part (an incoming gradient may be computed from an input;
            # an input may be computed from another by a function call, where TensorFlow
            # does not stop a gradient by itself: gradient_walk.stops_at_calls).
            with gradient_walk.stops_at_calls(sources):
                found = tf_internals.tf_gradients_v1(
                    [p for p, _ in pairs], sources, grad_ys=[dy for _, dy in pairs],
                    stop_gradients=sources,
                ) if pairs else [None] * len(sources)
            if variables is not None:
                return found, [None] * len(variables)
            return found

        return flat, second_order

    flat = segmented(*sources) if sources else None
    if flat is None:
        return build()
    in_grads = list(results["others"])
    for i, g in zip(results["positions"], flat):
        in_grads[i] = g
    return in_grads


_EMPTY_LISTS = ("TensorListReserve", "EmptyTensorList")


def carries_gradient(t):
    return t.dtype.is_floating or t.dtype.is_complex or t.dtype in (tf.resource, tf.variant)


def _across_graphs(flat, sources, upstream, graph):
    """The second derivative asked from another graph than the loop's: a function's backward
    graph (a tape outside the `tf.function` that holds the loop, eager or in an enclosing
    function). A replay built there would read the loop's inputs through that graph's
    captures, which the gradient cannot follow back to ``sources`` (silently wrong), and
    its functions may not exist there. So TensorFlow differentiates the gradient's own ops,
    as it would without this wrapper: walked in ``graph``, built in the current one."""
    pairs = [(f, dy) for f, dy in zip(flat, upstream) if dy is not None]
    if not pairs:
        return [None] * len(sources)
    with gradient_walk.stops_at_calls(sources):
        return gradient_walk.gradients_across_graphs(
            [f for f, _ in pairs], sources, [dy for _, dy in pairs], graph,
            stop_gradients=sources)

