"""Leaf gradients first: the order the rewrite gives the backward pass inside one segment.

A layer ``y = x @ w`` has two gradients from the same incoming ``dy``: ``dx = dy @ w^T``,
which the rest of the backward pass continues from, and ``dw = x^T @ dy``, the last reader of
the saved ``x``. Nothing orders the two, and TensorFlow's executor often runs the chain on
first: with one inter-op thread it goes deep down the chain and leaves the weights'
gradients (and every activation only they read) for later. On keras-hub's GPT-2 under
'memory', the last MLP's backward then still held its 6-MiB GELU output and the final layer
norm's tensors, both waiting for their weights' gradients.

`leaves_first` makes the ops that read ``dx`` (the sibling from the same gradient function)
wait for ``dw``, so what only ``dw`` reads is freed before the chain goes on. ``dx`` itself
does not wait: where ``dw`` runs first, the only ops its end makes ready are its own
consumers (an optimizer's update), which the executor then runs at once. It orders a leaf
gradient only where what it reads from the forward pass is larger than what it makes: an
update that runs late holds the gradient meanwhile. It adds control dependencies only, never
a value, and none where they would close a cycle. XLA drops control dependencies: under
``jit_compile=True`` its own scheduler decides.
"""

import heapq

import networkx as nx
import tensorflow as tf

from memgrad._src import tf_internals

# Ops that sum or pass on the parts of a leaf's gradient (a weight read twice, a variable
# read's Identity): each part is ordered against its own incoming gradient.
_AGGREGATES = frozenset({"AddN", "Add", "AddV2", "Identity"})
# A leaf gradient's own ops (`_own_ops`) are searched to at most this many.
MAX_OWN_OPS = 64


def leaves_first(graph, mark, gradients, size):
    """Makes the backward ops that continue from each leaf gradient's incoming gradient
    wait for that leaf gradient.

    Args:
      graph: the graph the gradients were built in.
      mark: `tf_internals.op_mark(graph)` before they were built: only ops made after it
        (this gradient call's) are ordered.
      gradients: the leaves' gradients (`tf.Tensor`, `tf.IndexedSlices` or None).
      size: bytes of a tensor (`ForwardGraph.tensor_bytes`). A leaf gradient is ordered
        first only where the tensors it reads from before this call (the activations it may
        free) are larger than what it makes: an optimizer that applies it may run late, and
        meanwhile it is held (a convolution's 2-MiB filter gradient beside its 0.5-MiB input).

    Returns:
      The number of control dependencies added.
    """
    if all(g is None for g in gradients):
        return 0  # nothing to order (a unit's own calls): skip reading the new ops
    new = tf_internals.ops_since(graph, mark)
    if not new:
        return 0
    owns = {anchor: _own_ops(anchor, new) for anchor in _anchors(gradients, new)}
    leaf_ops = set().union(*owns.values()) if owns else set()
    edges = {}
    for anchor, own in owns.items():
        if any(c in new and c not in own and c.type not in _AGGREGATES
               for out in anchor.outputs for c in out.consumers()):
            continue  # one op makes the leaf gradient and what goes on (FusedBatchNormGrad)
        read = {t.ref(): t for op in own for t in op.inputs if t.op not in new}
        if sum(map(size, read.values())) <= sum(map(size, anchor.outputs)):
            continue
        for op in own:
            for t in op.inputs:
                if t.op not in new or t.op in own:
                    continue
                for chain in t.consumers():
                    # The sibling from the same gradient function (dx beside dw), not
                    # another branch that reads the same incoming gradient.
                    if chain in new and chain not in leaf_ops and _scope(chain) == _scope(op):
                        for later in _after(chain, new, leaf_ops):
                            if anchor not in later.control_inputs:
                                edges.setdefault(later, set()).add(anchor)
    if not edges or _cyclic(new, edges):
        return 0
    for consumer, anchors in edges.items():
        tf_internals.add_control_inputs(consumer, sorted(anchors, key=tf_internals.op_id))
    return sum(len(a) for a in edges.values())


def _scope(op):
    """The name scope of ``op`` (its gradient function's, ``.../MatMul_grad``)."""
    return op.name.rpartition("/")[0]


def _after(chain, new, leaf_ops):
    """The ops that wait: those reading ``chain``'s outputs, else ``chain`` itself (the end of
    this gradient call). Not ``chain``: where the leaf gradient runs first, its end then makes
    ready only its own consumers (an optimizer's update), which TensorFlow's executor runs at
    once; with ``chain`` waiting too, one inter-op thread ran ``chain`` first and the update
    after the whole chain (GPT-2 under 'memory', before the scope and size rules: 68.3 MiB
    requested, 57.0 with only the ops after ``chain`` waiting, 64.5 unordered)."""
    after = [u for out in chain.outputs for u in out.consumers() if u in new and u not in leaf_ops]
    return after or [chain]


def _anchors(gradients, new):
    """The ops that make each part of each gradient, within ``new``."""
    found, stack = {}, []
    for grad in gradients:
        if isinstance(grad, tf.IndexedSlices):
            stack.append(grad.values.op)
        elif grad is not None:
            stack.append(grad.op)
    while stack:
        op = stack.pop()
        if op not in new or op in found:
            continue
        parts = [t.op for t in op.inputs if t.op in new]
        if op.type in _AGGREGATES and parts:
            stack.extend(parts)
        else:
            found[op] = None
    return list(found)


def _own_ops(anchor, new):
    """``anchor`` and the ops in ``new`` whose every output only ``anchor``'s own ops read:
    what computing it alone needs. Visited from the last made back, so each op's consumers
    are decided before it."""
    own = {anchor}
    heap, seen = [(-tf_internals.op_id(anchor), anchor)], {anchor}
    while heap and len(own) < MAX_OWN_OPS:
        _, op = heapq.heappop(heap)
        if op is not anchor:
            if any(c not in own for t in op.outputs for c in t.consumers()) or (
                    tf_internals.control_outputs(op)):
                continue
            own.add(op)
        for t in op.inputs:
            if t.op in new and t.op not in seen:
                seen.add(t.op)
                heapq.heappush(heap, (-tf_internals.op_id(t.op), t.op))
    return own


def _cyclic(new, edges):
    """Would the ops in ``new``, with ``edges`` (consumer -> ops it waits for) added, form a
    cycle? Their data and control edges and ``edges``, checked by networkx."""
    dag = nx.DiGraph()
    dag.add_nodes_from(new)
    for op in new:
        dag.add_edges_from((t.op, op) for t in op.inputs if t.op in new)
        dag.add_edges_from((o, op) for o in op.control_inputs if o in new)
        dag.add_edges_from((o, op) for o in edges.get(op, ()))
    return not nx.is_directed_acyclic_graph(dag)
