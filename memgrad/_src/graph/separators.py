"""Separators of the activation flow: single tensors, and small sets of tensors (cuts).

A separator is a set of tensors every path from the inputs to the loss crosses. Keeping a
separator is enough to recompute everything after it, which is what makes a checkpoint
cheap. A single-tensor separator (an articulation point of the flow) is found with
dominators: a tensor dominates the sink if every path from the source reaches the sink
through it. Graphs with skip connections that span many layers (DenseNet blocks, U-Net)
have few of those, so we also offer cuts: the set of tensors alive between two consecutive
ops of a topological order. Every such set is a separator; its bytes say what it costs.
"""

import dataclasses

import networkx as nx
import numpy as np
import tensorflow as tf


@tf.autograph.experimental.do_not_convert
def single_tensor_separators(view):
    """Tensors every path from the inputs to `ys` goes through, in forward order.

    Args:
      view: a `memgrad._src.graph.ForwardGraph`.

    Returns:
      A list of graph tensors, ordered from the inputs towards `ys`.
    """
    g = view.networkx()
    if view.SINK not in g or not nx.has_path(g, view.SOURCE, view.SINK):
        return []
    idom = nx.immediate_dominators(g, view.SOURCE)
    names = []
    node = view.SINK
    while node != view.SOURCE:
        node = idom[node]
        if g.nodes[node].get("kind") == "tensor":
            names.append(node)
    names.reverse()
    return [view.graph.get_tensor_by_name(n) for n in names]


@dataclasses.dataclass
class CutProfile:
    """Live activation bytes between consecutive activation ops of a topological order.

    Attributes:
      ops: activation ops in topological (creation) order.
      produced: produced[i] is the activation bytes made by ops[0..i] (cumulative).
      live: live[i] is the bytes of tensors made by ops[0..i] and still needed by a later op
        (the cut after op i).
      births, deaths: per tensor, the positions of its producer and its last consumer.
      tensors: the activation tensors, aligned with births and deaths.
      sizes: per tensor, the bytes of memory it adds: 0 for a view of another tensor's
        buffer (`ALIASING_TYPES`), whose buffer then lives until the view's last consumer.
      tensor_sizes: per tensor, its own bytes (the size of its gradient), views included.
      roots: per tensor, the index of the tensor whose buffer it shares (its own index for
        one that allocates; -1 for a view of memory outside the activations: an input, a
        weight).
    """

    ops: list
    produced: np.ndarray
    live: np.ndarray
    births: np.ndarray
    deaths: np.ndarray
    tensors: list
    sizes: np.ndarray
    tensor_sizes: np.ndarray = None
    roots: np.ndarray = None

    def cut(self, i):
        """The tensors alive across the cut after op `i`: a separator."""
        mask = (self.births <= i) & (self.deaths > i)
        return [self.tensors[j] for j in np.flatnonzero(mask)]


@tf.autograph.experimental.do_not_convert
def cut_profile(view):
    """Live bytes at every position of the activation ops' topological order.

    Args:
      view: a `memgrad._src.graph.ForwardGraph`.

    Returns:
      A `CutProfile`.
    """
    ops = view.activation_ops
    position = {op: i for i, op in enumerate(ops)}
    end = len(ops)
    tensors, births, deaths, tensor_sizes, roots = [], [], [], [], []
    index = {}
    first_of = {}  # computation key -> the first op computing it (Grappler merges the rest)
    for i, op in enumerate(ops):
        key = computation_key(op)
        same = first_of.setdefault(key, op) if key is not None else op
        for t in view.activation_outputs(op):
            last = max((position[c] for c in t.consumers() if c in position), default=i)
            if t.ref() in view.y_refs:
                last = end
            index[t.ref()] = len(tensors)
            source = buffer_source(t) if same is op else same.outputs[t.value_index]
            if source is None:
                roots.append(len(tensors))
            else:  # a view: of an earlier activation's buffer, or of memory outside them
                root = index.get(source.ref(), -1)
                roots.append(roots[root] if root >= 0 else -1)
            tensors.append(t)
            births.append(i)
            deaths.append(last)
            tensor_sizes.append(view.tensor_bytes(t))
    births = np.asarray(births, dtype=np.int64)
    deaths = np.asarray(deaths, dtype=np.int64)
    tensor_sizes = np.asarray(tensor_sizes, dtype=np.float64)
    roots = np.asarray(roots, dtype=np.int64)
    own = roots == np.arange(len(tensors))
    sizes = np.where(own, tensor_sizes, 0.0)
    viewed = roots >= 0
    # A shared buffer lives until the last consumer of any of its views.
    np.maximum.at(deaths, roots[viewed], deaths[viewed])
    produced = np.zeros(end, dtype=np.float64)
    np.add.at(produced, births, sizes)
    delta = np.zeros(end + 1, dtype=np.float64)
    if len(tensors):
        np.add.at(delta, births, sizes)
        np.add.at(delta, np.minimum(deaths, end), -sizes)
    live = np.cumsum(delta)[:end]
    return CutProfile(ops, np.cumsum(produced), live, births, deaths, tensors, sizes,
                      tensor_sizes, roots)


# Ops whose kernels return a view of an input's buffer (output i of input i), allocating
# nothing: TensorFlow's Identity, IdentityN and reshaping kernels forward the buffer.
ALIASING_TYPES = frozenset({
    "Identity", "IdentityN", "StopGradient", "PreventGradient", "Reshape", "Squeeze",
    "ExpandDims", "EnsureShape", "CheckNumerics",
})


def computation_key(op):
    """What identifies ``op``'s computation for Grappler's deduplication of identical ops
    (the arithmetic optimizer's, before a function runs: same type, inputs and attributes,
    stateless), or None for an op it keeps as is. NASNet applies ReLU to one tensor in
    several branches; after the merge one buffer holds the result every branch reads."""
    if op.op_def is None or op.op_def.is_stateful or op.control_inputs or not op.inputs:
        return None
    attrs = op.node_def.attr
    if any(k.startswith("_") or attrs[k].HasField("func") for k in attrs):
        return None
    return (op.type, tuple(t.ref() for t in op.inputs),
            tuple(sorted((k, attrs[k].SerializeToString()) for k in attrs)), op.device)


def buffer_source(tensor):
    """The input whose buffer ``tensor`` is a view of (`ALIASING_TYPES`), else None."""
    op = tensor.op
    if op.type not in ALIASING_TYPES or tensor.value_index >= len(op.inputs):
        return None
    source = op.inputs[tensor.value_index if op.type == "IdentityN" else 0]
    if source.dtype != tensor.dtype:
        return None
    return source


_NO_NEW_BUFFER = frozenset({"ReadVariableOp", "Placeholder", "Const", "VarHandleOp"})


def weight_copy(view, tensor):
    """Whether ``tensor``, not an activation, is a new buffer the forward pass computes from
    the weights alone: a ``mixed_float16`` layer's half-precision cast of its kernel, a
    transposed weight. (A view of a weight's own buffer, or the weight read, is not.)"""
    if not tensor.dtype.is_floating or not view.is_forward(tensor.op):
        return False
    while True:
        source = buffer_source(tensor)
        if source is None:
            return tensor.op.type not in _NO_NEW_BUFFER
        tensor = source
