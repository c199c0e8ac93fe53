"""The rewrite: gradients that recompute each segment between checkpoints from a copy.

Given checkpoints (tensors to keep), the backward pass runs segment by segment, from the
loss back to the inputs:

1. The last segment (from the last checkpoints to `ys`) is differentiated on the original
   ops, whose activations are still alive at that point; gradients stop at the
   checkpoints (`stop_gradients`) and are collected for them.
2. Each earlier group of checkpoints (a level of their topological order) has its segment
   copied: the ops from the previous checkpoints up to the group are created again, reading
   the kept checkpoints through fresh identity "ports". Its gradient is taken from the copy
   with respect to the ports: nothing of the forward pass beyond the checkpoints is read.
   A segment whose gradients read only kept tensors needs no copy: its gradient is taken
   on the original ops, with the gradients stopped at the kept tensors.
3. Every port and copied root op carries a control dependency on the group's incoming
   gradient and on the gradients of the copy before it (its ports') or, first, on the last
   segment's weight gradients, so the executor cannot recompute a segment early.
   XLA drops control dependencies, so under ``jit_compile=True`` each port also carries a
   data dependency on the incoming gradient (`memgrad._src.recompute.Gate`): the
   recomputation still waits, and, reading new values, is not merged with the forward.
4. Within each segment, the ops past a layer wait for its weights' gradients
   (`memgrad._src.checkpointing.order`), so what only those read is freed first.

Ops that cannot be re-run without changing results (stateful ops, ops calling functions,
custom-gradient ops, resource ops) are never copied: their inputs and outputs become
checkpoints and their gradient is taken on the original op. Ops joined by TensorList
(variant) tensors, such as a loop with the lists it reads and writes, form one unit
(`ForwardGraph.unit_of`) that is differentiated as a whole, never cut. A loop's own gradient
is built by `memgrad._src.checkpointing.loops`: in segments of steps, so that the forward
pass keeps only every k-th step's state.
"""

import contextlib
import time

import networkx as nx
import tensorflow as tf

from memgrad._src import tf_internals
from memgrad._src.checkpointing import gradient_walk
from memgrad._src.checkpointing.aggregate import GradientParts, aggregate, dense, dense_parts
from memgrad._src.checkpointing.loops import LOOP_TYPES, LoopGradients
from memgrad._src.checkpointing.order import leaves_first
from memgrad._src.checkpointing.segment_ends import peel, xs_inside
from memgrad._src.graph.memory_model import gradient_function, inputs_from_outside, reads_only
from memgrad._src.graph.view import is_differentiable, is_function_call, is_variable_read
from memgrad._src.recompute import Gate


class _Rewrite:
    def __init__(self, view, checkpoints, gradients_fn, kwargs, stop_gradients=(),
                 loops="segments"):
        self.view = view
        self.graph = view.graph
        self._gradients_fn = gradients_fn
        self.kwargs = kwargs
        self.gradient_seconds = 0.0  # spent in TensorFlow's own gradient construction
        self.copies = []  # every op `copy` made, in the order made
        self.segments = 0
        self.in_place_segments = 0  # segments differentiated on the original ops
        self.loops = LoopGradients(
            loops, xla=tf_internals.graph_or_parents_in_xla_context(self.graph),
            wanted=lambda t: view.is_forward(t.op) or view.x_index(t) is not None)
        self.checkpoints = {}
        self.dead = set()
        for t in checkpoints:
            if not view.is_interior(t):  # inside a unit: its boundaries are kept instead
                self._add(t)
        for t in stop_gradients:
            if view.is_forward(t.op) and not view.is_interior(t):
                self._add(t)
                self.dead.add(t.ref())
        self._add_atomic_boundaries()
        # An x computed inside the forward pass (an intermediate tensor, with other xs
        # upstream of it) is kept like a checkpoint: its gradient is collected there and
        # also passed further back, to the xs upstream. An x nothing upstream depends on
        # (a graph input, a variable's handle) is a leaf: its gradient goes nowhere else.
        for t in view.x_tensors:
            if view.is_forward(t.op) and is_differentiable(t.dtype):
                self._add(t)
                self._keep_inputs_of_x(t)
            else:
                self.checkpoints.pop(t.ref(), None)
        self._add_siblings()
        self.stop = set(self.checkpoints) | {t.ref() for t in view.x_tensors}
        self.order = {op: i for i, op in enumerate(self.graph.get_operations())}
        self._segment_ops = {}  # checkpoint ref -> ops its recomputation copies
        self._mark = None  # tf_internals.op_mark before the last gradient call

    def gradients_fn(self, ys, xs, leaves=(), **kwargs):
        """TensorFlow's gradients of ``ys`` for ``xs``, timed; those of the ``xs`` at positions
        ``leaves`` (weights, inputs) run before the ops past them (`leaves_first`)."""
        start = time.perf_counter()
        mark = self._mark = tf_internals.op_mark(self.graph, self._mark)
        try:
            grads = self._gradients_fn(ys, xs, **kwargs)
        finally:
            self.gradient_seconds += time.perf_counter() - start
        leaves_first(self.graph, mark, [grads[i] for i in leaves], self.view.tensor_bytes)
        return grads

    # ------------------------------------------------------------------ checkpoint set
    def _add(self, t):
        self.checkpoints.setdefault(t.ref(), t)

    def _keep_inputs_of_x(self, x):
        """Keeps the inputs of the op that computes an intermediate x, so that op's gradient
        is taken on the original op (`_differentiable_in_place`), never on a copy.

        The values are the same either way, but a gradient of this gradient differs: the
        gradient functions of Tanh, Sigmoid, Relu, Exp and others read the op's own output,
        so tf.gradients' gradient reads x itself, and differentiating it again with respect
        to x counts that use. Taken on a copy, the gradient would read the recomputed x and
        the second derivative with respect to x would miss that term (silently). The inputs
        are only held alive if the gradient function reads them.
        """
        view = self.view
        if not view.recomputable(x.op) or gradient_function(x.op) is None:
            return  # kept as a unit boundary, or differentiated by tf.gradients as a whole
        for t in x.op.inputs:
            if (is_differentiable(t.dtype) and view.is_forward(t.op)
                    and not view.is_interior(t) and view.variable_index_of_read(t) is None):
                self._add(t)

    def _add_atomic_boundaries(self):
        """Keeps the floating inputs and outputs of every unit that is not recomputed."""
        view = self.view
        for op in view.ops:
            if view.recomputable(op) or is_variable_read(op):
                continue
            for t in op.inputs:
                if t.dtype.is_floating and view.is_forward(t.op) and not view.is_interior(t) and (
                    view.variable_index_of_read(t) is None
                ):
                    self._add(t)
            for t in op.outputs:
                if t.dtype.is_floating and view.feeds_region(t) and not view.is_interior(t):
                    self._add(t)

    def _add_siblings(self):
        # Gradients are stopped per op, so a kept tensor's sibling outputs are kept too.
        for t in list(self.checkpoints.values()):
            if len(t.op.outputs) > 1:
                for s in t.op.outputs:
                    if s.dtype.is_floating and self.view.feeds_region(s) and (
                            not self.view.is_interior(s)):
                        self._add(s)

    # ------------------------------------------------------------------ segments
    def _walk(self, seeds):
        """Ops to recompute for `seeds`, back to the checkpoints; and the checkpoints met."""
        return self.view.walk_back([t.op for t in seeds], self.stop)

    def levels(self):
        """Checkpoint groups, each a level of their topological order, inputs first.

        The walk made here for each checkpoint is kept: a group's segment is the union of
        its members' walks.
        """
        preds = {}
        for ref, t in self.checkpoints.items():
            if self.view.recomputable(t.op):
                self._segment_ops[ref], boundary = self._walk([t])
                preds[ref] = {r for r in boundary if r in self.checkpoints}
            else:
                preds[ref] = {i.ref() for i in self._unit_inputs(t.op) if i.ref() in self.checkpoints}
            preds[ref].discard(ref)
        order = nx.DiGraph()
        order.add_nodes_from(preds)
        order.add_edges_from((p, ref) for ref, before in preds.items() for p in before)
        return [list(level) for level in nx.topological_generations(order)]

    def _port_target(self, t):
        """Does this kept tensor need a gradient (a checkpoint, an x, a read of an x)?"""
        if not is_differentiable(t.dtype):
            return False
        ref = t.ref()
        return (ref in self.checkpoints or self.view.x_index(t) is not None
                or self.view.variable_index_of_read(t) is not None)

    def copy(self, ops, gate):
        graph = self.graph
        mapping, op_mapping, ports = {}, {}, {}
        # Under XLA, which drops control dependencies, every port (weights too: else XLA
        # computes their transposes for the backward pass early, all at once) also waits
        # through a data dependency, which costs a copy of each port; elsewhere the control
        # dependencies suffice and a port is a free identity.
        xla = tf_internals.graph_or_parents_in_xla_context(graph)
        wait = Gate(gate)
        with graph.as_default(), tf.name_scope("recompute"), graph.control_dependencies(wait.waits()):
            for op in sorted(ops, key=self.order.__getitem__):
                inputs = []
                for t in op.inputs:
                    ref = t.ref()
                    if ref in mapping:
                        inputs.append(mapping[ref])
                    elif self._port_target(t):
                        if ref not in ports:
                            port = wait(t) if xla else t
                            if port is t:
                                port = tf.identity(t, name="port")
                            ports[ref] = (t, port)
                        inputs.append(ports[ref][1])
                    else:
                        inputs.append(t)
                # The copy runs where the original ran and after what it waited for: the
                # original's device and control inputs (copies of them, when copied) as
                # scopes around Graph.create_op.
                extra = [op_mapping.get(o, o) for o in op.control_inputs]
                device = graph.device(op.device) if op.device else contextlib.nullcontext()
                waits = graph.control_dependencies(extra) if extra else contextlib.nullcontext()
                with device, waits:
                    new = graph.create_op(
                        op.type, inputs, [o.dtype for o in op.outputs], name=op.name.split("/")[-1],
                        attrs=dict(op.node_def.attr), op_def=op.op_def)
                # An enclosing tape (a gradient of this gradient) must see the copy, or
                # it takes recomputed activations for constants.
                tf_internals.record_on_tapes(new)
                op_mapping[op] = new
                for old, copy in zip(op.outputs, new.outputs):
                    copy.set_shape(old.shape)
                    mapping[old.ref()] = copy
                self.copies.append(new)
        return mapping, list(ports.values())

    @property
    def copied_ops(self):
        return len(self.copies)

    # ------------------------------------------------------------------ gradients
    def x_ref(self, t):
        """The ref of the x that `t` stands for (an x itself or a read of one), or None."""
        index = self.view.x_index(t)
        if index is None:
            index = self.view.variable_index_of_read(t)
        return None if index is None else self.view.x_tensors[index].ref()

    def _leaf_positions(self, ports):
        return [i for i, (t, _) in enumerate(ports) if self.x_ref(t) is not None]

    def run(self, grad_ys):
        """The rewrite, step by step: the checkpoint set is selected (``__init__``); the
        last segment is differentiated on the original ops (`last_segment`); then, for each
        level of checkpoints from the loss back (`levels`), each segment is copied (`copy`)
        behind its gate (`gate_for`) and differentiated (`differentiate_level`); the parts
        are summed per x (`GradientParts.results`)."""
        # A cycle must raise before any gradient is built: TensorFlow's gradient functions
        # make the loops and calls they differentiate output their intermediates, which a
        # fallback keeps alive (an LSTM's Hessian-vector product at 2.7x plain's peak).
        levels, parts = self.levels(), GradientParts(self)
        previous = self.last_segment(grad_ys, parts)
        for level in reversed(levels):
            previous = self.differentiate_level(level, parts, previous)
        return parts.results()

    def last_segment(self, grad_ys, parts):
        """Differentiates the last segment (from the last checkpoints to ``view.ys``) on the
        original ops, whose activations are alive then; the gradient stops at the
        checkpoints, its parts go to ``parts``. Returns the dense parts of its leaf xs'
        (weights') gradients: the first copy waits for them (else they may run last)."""
        view = self.view
        final_ys, final_grads = [], []
        for y, dy in zip(view.ys, grad_ys):
            if y.ref() in self.checkpoints:
                parts.kept[y.ref()].append(dy if dy is not None else tf.ones_like(y))
            else:
                final_ys.append(y)
                final_grads.append(dy)
        floating = [t for t in self.checkpoints.values() if is_differentiable(t.dtype)]
        # tf.gradients gives a call it stops at a SymbolicGradient node (which fails for
        # XLA-compiled functions), so the last segment flows through a call's own gradient
        # to its inputs, which are kept; parts reaching the call's outputs from earlier
        # segments are carried back through it later (gradients are linear). A call in a
        # unit of several ops is the unit's to differentiate: the segment stops there.
        through = {t.ref() for t in floating if is_function_call(t.op) and t.ref() not in self.dead
                   and len(view.unit_of(t.op)) == 1}
        stops = [t for t in floating if t.ref() not in through]
        # Leaf xs, once each (a repeated x gets the same gradient at every position).
        leaves = {}
        for x, t in zip(view.xs, view.x_tensors):
            if t.ref() not in self.checkpoints or t.ref() in through:
                leaves.setdefault(t.ref(), x)
        if not final_ys:
            return []
        with gradient_walk.stops_at_calls(stops):
            grads = self.gradients_fn(
                final_ys, stops + list(leaves.values()), grad_ys=final_grads, stop_gradients=stops,
                leaves=range(len(stops), len(stops) + len(leaves)), **self.kwargs)
        self.segments += 1
        for t, grad in zip(stops, grads[: len(stops)]):
            parts.route(t, grad)
        for ref, grad in zip(leaves, grads[len(stops):]):
            if grad is not None:
                parts.x_parts[ref].append(grad)
        return [dense_parts(grad) for grad in grads[len(stops):] if grad is not None]

    def differentiate_level(self, level, parts, previous):
        """Carries the gradient back through one level of checkpoints (refs), whose parts are
        all in ``parts``: on the original op where nothing needs recomputing, through a
        gated copy of their segment, or through a unit's own gradient. ``previous``: the
        dense gradient parts the level after it made in its copy (the copy waits for them).
        Returns those of this level."""
        view = self.view
        group = [self.checkpoints[r] for r in level if r not in self.dead and parts.kept.get(r)]
        if not group:
            return previous
        incoming = {t.ref(): dense(aggregate(parts.kept[t.ref()])) for t in group}
        direct = [t for t in group if self._differentiable_in_place(t.op)]
        direct_refs = {t.ref() for t in direct}
        regular = [t for t in group if view.recomputable(t.op) and t.ref() not in direct_refs]
        atomic = [t for t in group if not view.recomputable(t.op)]
        for op in {t.op: None for t in direct}:
            for t, grad in self._gradient_in_place(op, incoming):
                parts.route(t, grad)
        if regular:
            # A checkpoint's op whose gradient reads only its kept output is differentiated on
            # the original op (`peel`): its copy, and the ops before it, need not run.
            ends, grad_ys, kept, peeled = peel(view, regular, incoming, self.stop, self._segment_ops, (
                lambda op: self._gradient_in_place(op, incoming, lambda t: is_differentiable(t.dtype))))
            for t, grad in kept:
                parts.route(t, grad)
            ops = set().union(*(self._segment_ops[t.ref()] for t in regular)) - peeled
        if regular and ends:
            outside = self._in_place_inputs(ops)
            if outside is not None:
                ports = [(t, t) for t in outside if self._port_target(t)]
                grads = self.gradients_fn(
                    ends, [t for t, _ in ports], grad_ys=grad_ys, stop_gradients=outside,
                    leaves=self._leaf_positions(ports), **self.kwargs)
                self.in_place_segments += 1
            else:
                mapping, ports = self.copy(ops, self.gate_for(regular, incoming, previous))
                grads = self.gradients_fn(
                    [mapping[t.ref()] for t in ends], [port for _, port in ports], grad_ys=grad_ys,
                    leaves=self._leaf_positions(ports), **self.kwargs)
            self.segments += 1
            previous = []
            for (t, _), grad in zip(ports, grads):
                parts.route(t, grad)
                if grad is not None:
                    previous.append(dense_parts(grad))
        for unit in {view.unit_of(t.op): None for t in atomic}:
            outs = [t for t in atomic if view.unit_of(t.op) is unit]
            inside = xs_inside(self.view, self.checkpoints, unit)
            pairs = self._unit_gradient(unit, outs, incoming, inside)
            split = len(pairs) - len(inside)  # the inside xs' pairs come last
            for t, grad in pairs[:split]:
                parts.route(t, grad)
            for x, grad in pairs[split:]:
                # x's whole gradient: the part from outside the unit (x's grad_ys, when
                # x is among outs) and the part through the unit's own ops downstream of x.
                parts.kept[x.ref()] = [grad] if grad is not None else []
        return previous

    def _in_place_inputs(self, ops):
        """The inputs of a segment (``ops``) whose gradients read only kept tensors, to
        differentiate it on the original ops (no copy, no gate); None where it is copied: it
        reads a tensor to recompute, or a function call's output (tf.gradients stopped there
        gives the call a SymbolicGradient node, which fails when it runs: `last_segment`)."""
        if not reads_only(self.view, ops, self.stop):
            return None
        outside = inputs_from_outside(ops)
        if any(is_function_call(t.op) for t in outside):
            return None
        return outside

    @staticmethod
    def gate_for(regular, incoming, previous):
        """The tensors a segment's copy waits for: the incoming gradients of the checkpoints
        it recomputes, and the previous copy's gradients (so copies run one at a time)."""
        gate = [dense_parts(incoming[t.ref()]) for t in regular] + previous
        return [x for parts in gate for x in parts]

    def _unit_inputs(self, op):
        """The inputs of ``op``'s unit that come from outside it, once each."""
        unit = self.view.unit_of(op)
        found = {}
        for member in unit:
            for t in member.inputs:
                if t.op not in unit:
                    found.setdefault(t.ref(), t)
        return list(found.values())

    def _unit_gradient(self, unit, outs, incoming, inside=()):
        """(input, gradient) pairs of a unit that is not recomputed, from its outputs' gradients.

        A single op's own gradient function is called directly (tf.gradients with the inputs
        as sources would stop at, and mishandle, a function call that produced one of them);
        a unit of several ops (a loop with its lists) goes through tf.gradients from its
        outputs to its inputs. A loop's gradient is `LoopGradients.gradient` either way.
        """
        ins = [t for t in self._unit_inputs(unit[0]) if self._atomic_source(t)]
        if not ins and not inside:
            return []
        if len(unit) == 1 and self._gradient_function(unit[0]) is not None:
            return self._gradient_in_place(unit[0], incoming, self._atomic_source)
        loops = self.loops.install(unit)
        try:
            # The stop must hold at an input a function call computes too.
            with gradient_walk.stops_at_calls(ins):
                grads = self.gradients_fn(
                    outs, ins + list(inside), grad_ys=[incoming[t.ref()] for t in outs],
                    stop_gradients=ins, **self.kwargs,
                )
        finally:
            self.loops.uninstall(loops)
        self.segments += 1
        return list(zip(ins + list(inside), grads))

    def _gradient_function(self, op):
        """The gradient function the rewrite uses for ``op``: `LoopGradients` for a loop."""
        if op.type in LOOP_TYPES:
            return self.loops.gradient
        return gradient_function(op)

    def _differentiable_in_place(self, op):
        """Can `op`'s gradient be taken on the original op, with nothing recomputed?

        True when every input it reads is kept anyway (a checkpoint, an x, a read, or a
        tensor outside the recomputed region) and TensorFlow has a gradient function for it:
        copying the op would only run it twice.
        """
        if not self.view.recomputable(op) or gradient_function(op) is None:
            return False
        for t in op.inputs:
            if t.ref() in self.stop or not self.view.walkable(t.op):
                continue
            return False
        return True

    def _gradient_in_place(self, op, incoming, wanted=None):
        """(input tensor, gradient) pairs of `op`, from its registered gradient function.

        Only inputs for which `wanted(t)` holds are returned (default: `_port_target`).
        """
        out_grads = []
        for i, out in enumerate(op.outputs):
            grad = incoming.get(out.ref())
            if grad is None and tf_internals.is_trainable_dtype(out) and (
                tf_internals.supports_default_grad(out)
            ):
                # tf.gradients' own default: zeros for every trainable output, variants
                # included. An If op that tf.gradients already differentiated outputs its
                # intermediates as variants, and cond's gradient needs zeros for them.
                grad = tf_internals.zeros_like_for_gradient(op, i)
            out_grads.append(grad)
        with tf.name_scope(op.name.split("/")[-1] + "_grad"):
            in_grads = self._gradient_function(op)(op, *out_grads)
        if not isinstance(in_grads, (list, tuple)):
            in_grads = [in_grads]
        self.segments += 1
        wanted = wanted or self._port_target
        return [(t, g) for t, g in zip(op.inputs, in_grads) if g is not None and wanted(t)]

    def _atomic_source(self, t):
        if t.dtype == tf.resource:
            return self.view.x_index(t) is not None
        return self._port_target(t)


def rewrite_gradients(view, checkpoints, grad_ys, gradients_fn, kwargs, stop_gradients=(),
                      loops="segments"):
    """Gradients of `view.ys` with respect to `view.xs`, recomputing between checkpoints.

    Args:
      view: the `memgrad._src.graph.ForwardGraph` of the computation.
      checkpoints: tensors to keep.
      grad_ys: one incoming gradient (or None) per y.
      gradients_fn: TensorFlow's own `tf.gradients`, used on each segment.
      kwargs: further arguments for `gradients_fn` (`gate_gradients`, ...).
      stop_gradients: tensors gradients must not flow through.
      loops: how forward loops are differentiated: ``'segments'`` or ``'kept'``
        (`memgrad._src.checkpointing.loops.LoopGradients`).

    Returns:
      A pair: one gradient (or None) per x, and the `_Rewrite` with its counters
      (`copied_ops`, `copies`, `segments`) and its loops' records (``rewrite.loops.records``).
    """
    rewrite = _Rewrite(view, checkpoints, gradients_fn, kwargs, stop_gradients, loops)
    with gradient_walk.indexed_captures():  # one gradient call per segment: keep each linear
        return rewrite.run(grad_ys), rewrite
