"""Where a recomputed segment's gradient starts: `peel` and `xs_inside`, helpers of the rewrite."""

from memgrad._src.graph.memory_model import gradient_function, tensors_read
from memgrad._src.graph.view import is_differentiable


def peel(view, checkpoints, incoming, stop, segment_ops, gradient_in_place):
    """Takes each checkpoint's own op off its segment where its gradient reads only its output.

    A ReLU that ends a ResNet block, an attention's softmax kept by 'speed': the gradient
    function reads the op's output, which is kept. Differentiated on a copy, it reads the
    copy's output instead, so the copy runs and so does the op before it (the block's last
    convolution, the query-key product), though nothing else needs them. Taken on the
    original op (``gradient_in_place(op)``: its ``[(input, gradient)]``) from the kept
    output, its inputs' gradients are where the copy's gradient starts.

    Args:
      view: the `ForwardGraph`.
      checkpoints: the level's checkpoints whose segments are recomputed.
      incoming: ``{ref: gradient}`` of the checkpoints.
      stop: refs of the kept tensors (checkpoints and xs).
      segment_ops: ``{ref: ops}``, the ops each checkpoint's recomputation copies.
      gradient_in_place: ``op -> [(input, gradient)]`` on the original op.

    Returns:
      ``(ends, grads, kept, peeled)``: the tensors the copy's gradient starts from (the
      checkpoints not peeled, the peeled ops' inputs that are recomputed) and their
      gradients; ``(tensor, gradient)`` of the peeled ops' inputs that are kept; the ops
      taken off the segment.
    """
    ends, grads, kept, peeled = [], [], [], set()
    for t in checkpoints:
        op = t.op
        inputs = [i for i in op.inputs if is_differentiable(i.dtype)]
        read_inputs, read_outputs = tensors_read(view, op)
        if (len(op.outputs) == 1 and inputs and gradient_function(op) is not None
                and not read_inputs and [r.ref() for r in read_outputs] == [t.ref()]
                and all(i.ref() in stop or i.op in segment_ops[t.ref()] for i in inputs)):
            peeled.add(op)
            for i, grad in gradient_in_place(op):
                if i.ref() in stop:
                    kept.append((i, grad))
                else:
                    ends.append(i)
                    grads.append(grad)
        else:
            ends.append(t)
            grads.append(incoming[t.ref()])
    return ends, grads, kept, peeled


def xs_inside(view, checkpoints, unit):
    """The xs computed by ops of a unit of several ops, once each, in forward order.

    The unit is differentiated as a whole, from its outputs to its inputs: such an x gets
    its gradient through the unit's ops downstream of it only when it is one of the sources
    of that call."""
    if len(unit) == 1:
        return []
    members = set(unit)
    found = {}
    for t in view.x_tensors:
        if t.op in members and is_differentiable(t.dtype) and t.ref() in checkpoints:
            found.setdefault(t.ref(), t)
    return list(found.values())
