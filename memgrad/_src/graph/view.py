"""A read-only view of the forward computation between `xs` and `ys` in a TensorFlow graph.

The view answers the questions the checkpoint strategies and the rewrite ask: which ops lie
on a path from `xs` to `ys`, which tensors are activations (as opposed to parameters,
constants and shapes), how many bytes each holds, what each op costs, and which ops may be
run a second time without changing results. It never modifies the graph.
"""

import math

import networkx as nx
import tensorflow as tf
from memgrad._src import tf_internals

# Ops whose outputs are parameters or constants: kept as they are, never recomputed.
PARAMETER_SOURCES = frozenset({"Const", "ReadVariableOp", "VarHandleOp", "HostConst"})
# TF1 reference variables (tf.compat.v1.disable_v2_behavior()); read through an Identity.
REF_VARIABLE_TYPES = frozenset({"VariableV2", "Variable"})
# Types that are never copied even when stateless: reading a resource, or pure plumbing.
NEVER_RECOMPUTED = frozenset({
    "Const", "HostConst", "Placeholder", "PlaceholderWithDefault", "ReadVariableOp",
    "VarHandleOp", "NoOp",
})
# Op types whose outputs `checkpoints='speed'` keeps: the expensive ones.
EXPENSIVE_TYPES = frozenset({
    "MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum", "Conv", "Conv2D",
    "Conv3D", "DepthwiseConv2dNative", "Conv2DBackpropInput", "Conv3DBackpropInputV2",
    "_FusedMatMul", "_FusedConv2D",
})


def is_differentiable(dtype):
    """True for dtypes gradients flow through (floating point and complex)."""
    return dtype.is_floating or dtype.is_complex


def is_function_call(op):
    """True for an op that calls a graph function (a nested `tf.function`)."""
    return op.type in ("PartitionedCall", "StatefulPartitionedCall") or (
        tf_internals.is_graph_function(op.graph, op.type)
    )


def _has_function_attr(op):
    for value in op.node_def.attr.values():
        if value.HasField("func") or (value.HasField("list") and len(value.list.func)):
            return True
    return False


def tensor_bytes(tensor, unknown_dim=1):
    """Bytes a tensor holds, from its static shape (unknown dimensions count as `unknown_dim`)."""
    dtype = tensor.dtype
    if dtype in (tf.resource, tf.variant, tf.string):
        return 0
    shape = tensor.shape
    if shape.rank is None:
        return dtype.size * unknown_dim
    elements = 1
    for dim in shape.as_list():
        elements *= unknown_dim if dim is None else dim
    return elements * dtype.size


def _elements(shape, unknown_dim):
    if shape.rank is None:
        return unknown_dim
    count = 1
    for dim in shape.as_list():
        count *= unknown_dim if dim is None else dim
    return count


def op_flops(op, unknown_dim=1):
    """A floating-point operation estimate for one op, from its static shapes.

    Matrix products and convolutions count multiply-adds (2 per term); einsum is estimated
    as sqrt(|a| |b| |out|) terms, which is exact for matrix-product-shaped contractions;
    every other op counts one operation per output element.
    """
    out = sum(_elements(t.shape, unknown_dim) for t in op.outputs)
    kind = op.type
    try:
        if kind in ("MatMul", "_FusedMatMul"):
            a = op.inputs[0].shape
            k = a[-2] if op.get_attr("transpose_a") else a[-1]
            return 2 * out * (k or unknown_dim)
        if kind.startswith("BatchMatMul"):
            a = op.inputs[0].shape
            k = a[-2] if op.get_attr("adj_x") else a[-1]
            return 2 * out * (k or unknown_dim)
        if kind in ("Conv2D", "Conv3D", "Conv", "_FusedConv2D"):
            kernel = op.inputs[1].shape.as_list()
            return 2 * out * math.prod((d or unknown_dim) for d in kernel[:-1])
        if kind == "DepthwiseConv2dNative":
            kernel = op.inputs[1].shape.as_list()
            return 2 * out * math.prod((d or unknown_dim) for d in kernel[:2])
        if kind in ("Conv2DBackpropInput", "Conv3DBackpropInputV2"):
            kernel = op.inputs[1].shape.as_list()
            return 2 * out * math.prod((d or unknown_dim) for d in kernel[:-2]) * (
                kernel[-1] or unknown_dim)
        if kind == "Einsum" and len(op.inputs) == 2:
            a = _elements(op.inputs[0].shape, unknown_dim)
            b = _elements(op.inputs[1].shape, unknown_dim)
            return 2 * int(math.sqrt(a * b * out))
    except (ValueError, TypeError, IndexError):
        pass
    return out


def is_variable_read(op):
    """A read of a variable: ReadVariableOp, or the Identity a TF1 reference variable reads by."""
    if op.type == "ReadVariableOp":
        return True
    dtype = op.inputs[0].dtype if op.type == "Identity" else None
    return dtype is not None and dtype != dtype.base_dtype  # a reference dtype


def _is_parameter_source(op):
    """Variable reads, variables (resource or TF1 reference ones) and constants."""
    if op.type in PARAMETER_SOURCES or op.type in REF_VARIABLE_TYPES or is_variable_read(op):
        return True
    return op.type == "Placeholder" and op.outputs[0].dtype == tf.resource


class ForwardGraph:
    """The forward ops between `xs` and `ys`, with bytes, costs and a networkx graph.

    Args:
      ys: graph tensors to differentiate (all in one graph).
      xs: tensors or resource variables to differentiate with respect to.
      unknown_dim: the size assumed for dimensions unknown at trace time, in byte and cost
        estimates only.

    Attributes:
      graph: the TensorFlow graph.
      ops: forward ops (on a path from some x to some y), in creation order, which is a
        topological order.
      region: every op `ys` depend on (their ancestors, data edges only).
      activation_ops: forward ops whose outputs carry activations (data flowing from the
        inputs), as opposed to parameters (variable reads and what is computed from them
        alone), in creation order.
      x_tensors: one graph tensor per x: the tensor itself, or the variable's handle.
      y_refs: `ref()` of every y.
    """

    def __init__(self, ys, xs, unknown_dim=1):
        self.ys = list(ys)
        self.y_refs = {y.ref() for y in self.ys}
        self.xs = list(xs)
        self.unknown_dim = unknown_dim
        self.graph = self.ys[0].graph
        self.x_tensors = [self._x_tensor(x) for x in self.xs]
        self._x_index = {}
        for i, t in enumerate(self.x_tensors):
            self._x_index.setdefault(t.ref(), i)

        self.region = self._ancestors(self.ys)
        reached = self._descendants(self.x_tensors, self.region)
        self._order = {op: i for i, op in enumerate(self.graph.get_operations())}
        self.ops = sorted(reached, key=self._order.__getitem__)
        self.op_set = set(self.ops)
        self._parameter_like = self._find_parameter_like()
        self._data_dependent = self._find_data_dependent()
        self.activation_ops = [op for op in self.ops if op not in self._parameter_like]
        self._activation_set = set(self.activation_ops)
        self._recomputable = {}
        self._units = None
        self._nx = None

    # ------------------------------------------------------------------ construction
    def _x_tensor(self, x):
        if tf_internals.is_resource_variable(x) or (
            hasattr(x, "handle") and not isinstance(x, tf.Tensor)
        ):
            with self.graph.as_default():
                return tf.convert_to_tensor(x.handle)
        if isinstance(x, tf.Variable):  # a TF1 reference variable: its reference tensor
            with self.graph.as_default():
                return tf_internals.convert_to_tensor(x, as_ref=True)
        return x

    @staticmethod
    def _ancestors(ys):
        seen = set()
        stack = [y.op for y in ys]
        while stack:
            op = stack.pop()
            if op in seen:
                continue
            seen.add(op)
            stack.extend(t.op for t in op.inputs)
        return seen

    @staticmethod
    def _descendants(tensors, within):
        seen = set()
        stack = [c for t in tensors for c in t.consumers()]
        while stack:
            op = stack.pop()
            if op in seen or op not in within:
                continue
            seen.add(op)
            for out in op.outputs:
                stack.extend(out.consumers())
        return seen

    def _find_parameter_like(self):
        """Ops computed from parameters and constants alone (variable reads, casts of them).

        When that would leave the ys themselves parameter arithmetic (the network's input is
        a variable or a constant, as in TF1-style code and in tests), the activation stream
        is told apart by what an op mixes instead: an op computed from two or more sources
        (variables, or constants of 1 KiB or more) carries activations; one computed from a
        single source (a cast, a transpose, a weight norm) stays parameter arithmetic.
        """
        ordered = sorted(self.region, key=self._order.__getitem__)
        parameter_like = set()
        for op in ordered:
            if _is_parameter_source(op):
                parameter_like.add(op)
            elif op.inputs and not op.op_def.is_stateful and all(
                t.op in parameter_like for t in op.inputs
            ):
                parameter_like.add(op)
        if not all(y.op in parameter_like for y in self.ys):
            return parameter_like
        roots = {}  # op -> the sources it is computed from
        mixing = set()
        for op in ordered:
            if op not in parameter_like:
                continue
            if _is_parameter_source(op):
                large = op.type not in ("Const", "HostConst") or sum(
                    self.tensor_bytes(t) for t in op.outputs) >= 1024
                roots[op] = frozenset([op]) if large else frozenset()
                continue
            roots[op] = frozenset().union(*(roots.get(t.op, frozenset()) for t in op.inputs))
            if len(roots[op]) >= 2 or any(t.op in mixing for t in op.inputs):
                mixing.add(op)
        return parameter_like - mixing

    def _find_data_dependent(self):
        """Ops that depend on data (placeholders, stateful sources) rather than parameters."""
        dependent = set()
        for op in sorted(self.region, key=self._order.__getitem__):
            if op in self._parameter_like:
                continue
            if op.type == "Placeholder" or (op.op_def.is_stateful and not _is_parameter_source(op)):
                dependent.add(op)
            elif any(t.op in dependent for t in op.inputs):
                dependent.add(op)
        return dependent

    # ------------------------------------------------------------------ queries
    def x_index(self, tensor):
        """The index in `xs` of a tensor that stands for an x, or None."""
        return self._x_index.get(tensor.ref())

    def variable_index_of_read(self, tensor):
        """For the output of a read of a differentiated variable: that variable's index."""
        if is_variable_read(tensor.op):
            return self._x_index.get(tensor.op.inputs[0].ref())
        return None

    def is_forward(self, op):
        return op in self.op_set

    def is_activation(self, tensor):
        """True for tensors produced by forward ops that carry data, not parameters."""
        return tensor.op in self._activation_set

    def is_activation_op(self, op):
        """True for forward ops that carry data (not parameter reads or their casts)."""
        return op in self._activation_set

    def recomputable(self, op):
        """True if running `op` a second time gives the same outputs and costs no state.

        Stateful ops (random number generators with state, variable updates, reads that may
        see an update), ops calling functions (If, While, PartitionedCall), ops with a custom
        gradient override, ops handling resources or variants, and ops of a unit (`unit_of`)
        are kept, never re-run.
        """
        cached = self._recomputable.get(op)
        if cached is not None:
            return cached
        ok = (
            bool(op.inputs)
            and op.type not in NEVER_RECOMPUTED
            and not is_variable_read(op)
            and not op.op_def.is_stateful
            and all(t.dtype not in (tf.resource, tf.variant) for t in op.inputs)
            and all(t.dtype not in (tf.resource, tf.variant) for t in op.outputs)
        )
        if ok:
            attrs = op.node_def.attr
            ok = "_gradient_op_type" not in attrs and not _has_function_attr(op)
        # An op on a path between two ops of a unit belongs to it (`_convex`): kept whole.
        ok = ok and len(self.unit_of(op)) == 1
        self._recomputable[op] = ok
        return ok

    def walkable(self, op):
        """May the rewrite copy `op` into a recomputed segment?

        Forward ops that are recomputable, and recomputable ops outside the forward region
        that do not depend on data (e.g. dropout masks drawn from a kept seed). Data
        computed without the differentiated variables (a frozen backbone) is kept instead.
        """
        if op not in self.region or not self.recomputable(op):
            return False
        return op in self.op_set or op not in self._data_dependent

    def walk_back(self, ops, stop, give_up=None):
        """The ops a recomputation of ``ops`` copies: ``ops`` and their producers, back
        through `walkable` ops to the tensors whose refs are in ``stop``. ``give_up(op, seen)``,
        if given, is asked before each op joins the walk (``seen``: the ops walked so far);
        True ends the walk at once (e.g. ``lambda op, seen: len(seen) >= 32``).

        Returns:
          ``(ops, met)``: the set of ops, and ``{ref: tensor}`` of the ``stop`` tensors met;
          None when ``give_up`` ended the walk.
        """
        seen, met, stack = set(), {}, list(ops)
        while stack:
            op = stack.pop()
            if op in seen:
                continue
            if give_up is not None and give_up(op, seen):
                return None
            seen.add(op)
            for t in op.inputs:
                ref = t.ref()
                if ref in stop:
                    met[ref] = t
                elif self.walkable(t.op):
                    stack.append(t.op)
        return seen, met

    def unit_of(self, op):
        """The forward ops the rewrite treats as one with ``op``.

        Ops joined by TensorList (variant) tensors form one unit: a loop with the lists it
        reads and writes (``tf.scan``'s unstacked input, a ``TensorArray``'s writes and the
        stack after the loop), since a gradient through a list needs the whole structure.
        Any other op is a unit by itself. Returns a tuple of ops in forward order.
        """
        if self._units is None:
            self._units = self._find_units()
        return self._units.get(op, (op,))

    def _find_units(self):
        """{op: its unit} for the ops joined by variant tensors (union-find over those edges)."""
        parent = {}

        def root(op):
            while parent.get(op, op) is not op:
                op = parent[op]
            return op

        joined = set()
        for op in self.ops:
            for t in op.outputs:
                if t.dtype != tf.variant:
                    continue
                for consumer in t.consumers():
                    if consumer in self.op_set:
                        joined.update((op, consumer))
                        a, b = root(op), root(consumer)
                        if a is not b:
                            parent[b] = a
        members = {}
        for op in joined:
            members.setdefault(root(op), []).append(op)
        members = self._convex(members)
        units = {}
        for group in members.values():
            unit = tuple(sorted(group, key=self._order.__getitem__))
            for op in unit:
                units[op] = unit
        return units

    def _convex(self, members):
        """The groups of ``members`` ({root: ops}) grown until each holds every forward op on
        a path between two of its ops, merging groups that meet.

        A unit is kept whole and differentiated from its outputs to its inputs, so no path
        may leave it and come back: in a gradient of a loop's gradient, the forward loop and
        the gradient loop share TensorLists (its accumulators) while the gradient loop also
        reads, through ordinary ops, what the forward loop computed. Without the ops between
        them the unit would be both upstream and downstream of those ops (a cycle).
        A call of a nested function taken in is differentiated with the unit only (the last
        segment stops at its outputs: `_Rewrite.last_segment`).
        """
        if len(members) == 0:
            return members
        consumers = {}
        for op in self.ops:
            for t in op.inputs:
                if t.op in self.op_set:
                    consumers.setdefault(t.op, []).append(op)

        def reach(start, step):
            seen, stack = set(start), list(start)
            while stack:
                for other in step(stack.pop()):
                    if other not in seen:
                        seen.add(other)
                        stack.append(other)
            return seen

        groups = [set(group) for group in members.values()]
        changed = True
        while changed:
            changed = False
            for i, group in enumerate(groups):
                if len(group) < 2:
                    continue
                below = reach(group, lambda op: consumers.get(op, ()))
                above = reach(group, lambda op: [t.op for t in op.inputs if t.op in self.op_set])
                closure = group | (below & above)
                if closure == group:
                    continue
                for j, other in enumerate(groups):
                    if j != i and other and other & closure:
                        closure |= other
                        groups[j] = set()
                groups[i] = closure
                changed = True
        return {min(group, key=self._order.__getitem__): list(group)
                for group in groups if group}

    def is_interior(self, tensor):
        """True for a tensor the rewrite can never keep on its own: a TensorList or a
        resource handle, or a tensor that only ops of its own unit consume (`unit_of`)."""
        if tensor.dtype in (tf.variant, tf.resource):
            return True
        unit = self.unit_of(tensor.op)
        if len(unit) == 1 or tensor.ref() in self.y_refs:
            return False
        return all(c in unit for c in tensor.consumers() if c in self.region)

    def tensor_bytes(self, tensor):
        return tensor_bytes(tensor, self.unknown_dim)

    def op_flops(self, op):
        return op_flops(op, self.unknown_dim)

    def feeds_region(self, tensor):
        """True if some op that `ys` depend on consumes `tensor`."""
        return any(c in self.region for c in tensor.consumers())

    def activation_outputs(self, op):
        """Outputs of an activation op that other activation ops (or ys) consume, and that
        a plan may keep (not `is_interior`)."""
        out = []
        for t in op.outputs:
            if self.is_interior(t):
                continue
            if t.ref() in self.y_refs or any(
                c in self._activation_set for c in t.consumers()
            ):
                out.append(t)
        return out

    # ------------------------------------------------------------------ networkx
    SOURCE = "__source__"
    SINK = "__sink__"

    def networkx(self):
        """A directed op/tensor graph of the activation flow, with a source and a sink.

        Nodes are op names and tensor names; edges follow activation tensors only, so
        parameter reads, constants and computations on parameters alone do not appear as
        shortcuts. The source feeds every activation op that has no activation input; every
        y feeds the sink.
        """
        if self._nx is not None:
            return self._nx
        g = nx.DiGraph()
        g.add_node(self.SOURCE)
        g.add_node(self.SINK)
        for op in self.activation_ops:
            g.add_node(op.name, kind="op", flops=self.op_flops(op))
            has_input = False
            for t in op.inputs:
                if t.op in self._activation_set:
                    g.add_edge(t.name, op.name)
                    has_input = True
            if not has_input:
                g.add_edge(self.SOURCE, op.name)
            for t in self.activation_outputs(op):
                g.add_node(t.name, kind="tensor", bytes=self.tensor_bytes(t))
                g.add_edge(op.name, t.name)
        for y in self.ys:
            if y.op in self._activation_set:
                g.add_edge(y.name, self.SINK)
        self._nx = g
        return g
