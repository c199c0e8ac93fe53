"""A cost model of the backward pass: which tensors gradients read, and what a plan costs.

Plain backprop keeps a forward tensor only if some gradient function reads it (ReLU's
gradient reads its output, a matrix product's reads its inputs, an addition's reads
neither). `gradient_reads` finds out by calling TensorFlow's registered gradient function
on a copy of the op in a scratch graph and looking at what the gradient ops consume, so it
follows TensorFlow's own gradients rather than a table of ours.

`MemoryModel` turns that into prefix sums over the activation ops' topological order (the
order of `memgrad._src.graph.cut_profile`), from which the predicted activation peak of any
set of cut positions follows in O(1) per segment, and its recomputed FLOPs from the few ops
at each cut whose copies never run (`memgrad._src.graph.idle_copies`):

- segment (a, b] in backward, at each of its positions q from b down: the kept tensors of
  the cuts before it, the tensors born in (a, q] that gradients read (those born later are
  freed by then), the gradient partials waiting and op q's gradient working set, and the
  parameter gradients made so far, by ops at q and after (held to the end of the backward,
  as in a step that applies them all after it);
- the last segment runs on the original ops, with every kept tensor alive.

The peak of a plan is the largest of these. `predict` evaluates one plan;
`memgrad._src.checkpointing.budget_planner` searches over plans.
"""

import numpy as np
import tensorflow as tf

from memgrad._src import tf_internals
from memgrad._src.graph import idle_copies
from memgrad._src.graph.gradient_flow import differentiated_ops, feeding, is_custom, read_once
from memgrad._src.graph.kernels import (CALL_TYPES, compiled_gradient_scratch, is_compiled_call,
                                        kernel_scratch, shapes_folded)
from memgrad._src.graph.separators import ALIASING_TYPES, cut_profile, weight_copy

# Consumers that read only a tensor's shape, never its values.
_SHAPE_ONLY = frozenset({"Shape", "ShapeN", "Size", "Rank", "ZerosLike", "OnesLike"})
# Elementwise ops: TensorFlow's executor lets their gradient write into the incoming
# gradient's buffer when nothing else holds it, so their working set is the wider side.
ELEMENTWISE_TYPES = frozenset({
    "Relu", "Relu6", "Elu", "Selu", "LeakyRelu", "Tanh", "Sigmoid", "Softplus", "Softsign",
    "Exp", "Log", "Square", "Sqrt", "Rsqrt", "Neg", "Abs", "Identity", "BiasAdd", "Add",
    "AddV2", "Sub", "Mul", "RealDiv", "Maximum", "Minimum", "Cast", "Erf", "Gelu",
})


def gradient_function(op):
    """TensorFlow's registered gradient function for `op`, or None if it has none."""
    try:
        return tf_internals.get_gradient_function(op)
    except LookupError:
        return None


def _signature(op):
    attrs = tuple(sorted((k, v.SerializeToString()) for k, v in op.node_def.attr.items()
                         if not k.startswith("_")))
    inputs = tuple((t.dtype.name, t.shape.rank) for t in op.inputs)
    return op.type, attrs, inputs


_probe_cache = {}


def gradient_reads(op, needed=None):
    """Which inputs and outputs of `op` its registered gradient function reads.

    Args:
      op: a graph operation.
      needed: indices of the inputs whose gradients are used (those on a path from the
        variables differentiated: `differentiated_inputs`), or None for every input. What
        only an unused input's gradient reads is not read: TensorFlow prunes that
        computation from the function before it runs (``x * 0.5``'s gradient for the
        constant reads ``x``; the gradient for ``x`` does not).

    Returns:
      A pair of frozensets: indices of inputs read, indices of outputs read. Reading only
      a shape (Shape, ZerosLike, ...) does not count. Ops without a gradient function read
      nothing; when the probe fails, every floating input and output counts as read.

    Example:
      ```python
      gradient_reads(relu_op)     # (frozenset(), frozenset({0})): ReLU reads its output
      gradient_reads(matmul_op)   # (frozenset({0, 1}), frozenset()): both inputs
      gradient_reads(mul_op, needed={0})  # x * c: only c is read
      ```
    """
    needed = None if needed is None else frozenset(needed)
    key = (_signature(op), needed)
    if key in _probe_cache:
        return _probe_cache[key]
    result = _probe(op, needed)
    _probe_cache[key] = result
    return result


def differentiated_inputs(view, op):
    """Indices of `op`'s floating inputs that are an x of `view` or made by its forward ops
    (activations and parameters): the inputs whose gradients backprop uses."""
    return frozenset(i for i, t in enumerate(op.inputs) if t.dtype.is_floating and (
        view.is_forward(t.op) or view.x_index(t) is not None))


def tensors_read(view, op):
    """The inputs and the outputs of ``op`` its gradient reads in backprop of ``view``
    (`gradient_reads` of the inputs backprop differentiates): two lists of tensors."""
    ins, outs = gradient_reads(op, differentiated_inputs(view, op))
    # (Indices past the op's own inputs or outputs can come from the probe's cache, which
    # ops of one signature share.)
    return ([op.inputs[i] for i in sorted(ins) if i < len(op.inputs)],
            [op.outputs[j] for j in sorted(outs) if j < len(op.outputs)])


def reads_only(view, ops, kept):
    """Whether every tensor the gradients of ``ops`` read is in ``kept`` (refs) or made by an
    op a recomputation never copies (`ForwardGraph.walkable`): then differentiating ``ops``
    themselves, after the forward pass, keeps nothing alive beyond those tensors.

    Example:
      ```python
      reads_only(view, {tanh_op}, {tanh_op.outputs[0].ref()})  # True: TanhGrad reads the output
      ```
    """
    for op in ops:
        ins, outs = tensors_read(view, op)
        if any(t.ref() not in kept and view.walkable(t.op) for t in ins + outs):
            return False
    return True


def inputs_from_outside(ops):
    """The tensors ``ops`` read that none of them makes, in a fixed order (by op name)."""
    made = {t.ref() for op in ops for t in op.outputs}
    inputs = {}
    for op in sorted(ops, key=lambda o: o.name):
        for t in op.inputs:
            if t.ref() not in made:
                inputs.setdefault(t.ref(), t)
    return list(inputs.values())




def _gradient_alone(op):
    """A copy of ``op`` in a scratch graph, on placeholders of its inputs' dtypes and static
    shapes, and its registered gradient function called on placeholders for the gradients
    of its floating outputs.

    Returns:
      ``(input placeholders, the copy, the ops the gradient function made, its returned
      input gradients)``; the scratch graph is ``copy.graph``.
    """
    scratch = tf.Graph()
    with scratch.as_default():
        inputs = [tf.compat.v1.placeholder(t.dtype, t.shape) for t in op.inputs]
        copy = scratch.create_op(
            op.type, inputs, [t.dtype for t in op.outputs],
            attrs={k: v for k, v in op.node_def.attr.items() if not k.startswith("_")},
            op_def=op.op_def,
        )
        for old, new in zip(op.outputs, copy.outputs):
            new.set_shape(old.shape)
        grads = [
            tf.compat.v1.placeholder(t.dtype, t.shape) if t.dtype.is_floating else None
            for t in copy.outputs
        ]
        first = len(scratch.get_operations())
        in_grads = gradient_function(op)(copy, *grads)
    return inputs, copy, scratch.get_operations()[first:], in_grads


@tf.autograph.experimental.do_not_convert
def _probe(op, needed=None):
    if gradient_function(op) is None or not any(
        t.dtype.is_floating for t in op.outputs
    ):
        return frozenset(), frozenset()
    everything = (
        frozenset(i for i, t in enumerate(op.inputs) if t.dtype.is_floating),
        frozenset(i for i, t in enumerate(op.outputs) if t.dtype.is_floating),
    )
    if op.type in CALL_TYPES:
        # A function call's gradient is a call of its backward function, built from the
        # forward function's graph: run on a copy in a scratch graph it can crash
        # TensorFlow outright (a segfault in gradients_util._Consumers, seen on the gradient
        # call of a loop that nested tapes wrapped in a function). The rewrite keeps a call's
        # inputs and outputs anyway (it never recomputes one).
        return everything
    try:
        inputs, copy, made, in_grads = _gradient_alone(op)
        if needed is not None:
            made = feeding(made, in_grads, needed)
        read = set()
        for g_op in made:
            if g_op.type not in _SHAPE_ONLY:
                read.update(t.ref() for t in g_op.inputs)
    except Exception:  # noqa: BLE001 - an unknown gradient: assume it reads everything
        # Reading the created ops' inputs can fail too: a cond's gradient (StatelessIf)
        # makes ops that refer to functions the scratch graph does not hold (KeyError).
        return everything
    return (
        frozenset(i for i, t in enumerate(inputs) if t.ref() in read),
        frozenset(i for i, t in enumerate(copy.outputs) if t.ref() in read),
    )


_scratch_cache = {}


@tf.autograph.experimental.do_not_convert
def gradient_scratch(op, device):
    """Scratch bytes of a convolution's forward kernel and its gradient's kernels (the most
    of any one), measured on ``device`` by `kernel_scratch`: each runs once alone on zeros
    of the op's static shapes, cached per process. 0 for other ops, for shapes not known at
    trace time, and where the kernels cannot run alone.

    Eigen's convolution gradients (a CPU without oneDNN) allocate working sets larger than
    their outputs (MobileNetV3Small's, at 96x96: the step's peak 3.3x what its activations
    and gradients explain); a GPU's cuDNN workspaces come from TensorFlow's allocator too.
    """
    if "Conv" not in op.type or not all(t.shape.is_fully_defined() for t in op.inputs):
        return 0
    key = (device, _signature(op), tuple(tuple(t.shape.as_list()) for t in op.inputs))
    if key in _scratch_cache:
        return _scratch_cache[key]
    found = 0
    try:
        scratch = _gradient_alone(op)[1].graph
        shapes = {(g_op.name, i): (t.dtype, t.shape)
                  for g_op in scratch.get_operations() for i, t in enumerate(g_op.outputs)}
        found = max(kernel_scratch(shapes_folded(scratch), shapes, device).values(), default=0)
    except Exception:  # noqa: BLE001 - a kernel that cannot be built alone: left out
        found = 0
    _scratch_cache[key] = found
    return found


class MemoryModel:
    """Predicted activation peak and recomputation cost of checkpoint plans on one graph.

    Positions are indices into `profile.ops` (activation ops in topological order); a cut
    at position p separates ops[..p] from ops[p+1..] and keeps `profile.cut(p)`.

    Args:
      view: a `memgrad._src.graph.ForwardGraph`.
      hold_gradients: True (default): each parameter gradient is alive from the backward
        position that makes it to the end of the backward pass (a step that applies them
        together, clips them by their global norm or returns them). False: each is
        consumed as it is made (one optimizer update per variable inside the same
        `tf.function`, as Keras's `optimizer.apply` and `fit` run), alive only while its
        op's gradient runs.
      kernels: a device (``'CPU:0'``, ``'GPU:0'``) on which to measure convolutions'
        scratch buffers (`gradient_scratch`), counted in their ops' gradient working set;
        None (default) counts none.

    Attributes:
      profile: the `CutProfile` of the view.
      saved: saved[p] is the bytes of tensors born at position p that a gradient reads.
      work: work[p] is the gradient working set of op p: its outputs' and activation
        inputs' gradients, alive together while its gradient runs (the larger of the two
        for elementwise ops, whose gradient reuses the incoming buffer).
      param_grads: param_grads[p] is the bytes of parameter gradients op p's gradient makes.
      flops: flops[p] is op p's forward cost.
      forced_bytes: bytes of tensors every plan keeps (inputs and outputs of ops that
        cannot be re-run: stateful, function-calling, custom-gradient ops);
        ``forced_prefix[a + 1]`` those born at or before position a, alive while a later
        segment's backward runs (plain backprop, one segment, adds none: those it reads
        count among the saved tensors).

    Example:
      ```python
      model = MemoryModel(ForwardGraph([loss], variables))   # inside a tf.function
      plain_peak, _ = model.predict([])
      peak, recomputed_flops = model.predict([10, 20, 30])   # cuts after ops 10, 20, 30
      ```
    """

    def __init__(self, view, hold_gradients=True, kernels=None):
        self.view = view
        self.hold_gradients = bool(hold_gradients)
        profile = self.profile = cut_profile(view)
        ops = profile.ops
        n = len(ops)
        position = {op: i for i, op in enumerate(ops)}
        index = self.index = {t.ref(): j for j, t in enumerate(profile.tensors)}
        read = np.zeros(len(profile.tensors), dtype=bool)
        self._forced = np.zeros(len(profile.tensors), dtype=bool)
        work = np.zeros(n)
        param_grads = np.zeros(n)

        roots, grad_sizes = profile.roots, profile.tensor_sizes
        customs = {}  # custom gradients' readings (`read_once`): each function called once
        flowing = differentiated_ops(ops, view.y_refs, view.region, customs)
        copies = {}  # weights' copies a gradient reads (`weight_copy`): ref -> bytes

        def activations(tensors, reads):
            """Bytes of the gradients of the activations among `tensors`; marks the buffers
            of those a gradient reads (a view's: the buffer it shares)."""
            total = 0.0
            for i, t in enumerate(tensors):
                j = index.get(t.ref())
                if j is not None:
                    total += grad_sizes[j]
                    if i in reads and roots[j] >= 0:
                        read[roots[j]] = True
            return total

        self.reads, self._idle = [], {}  # per position, what its gradient reads; `idle_copies`
        for p, op in enumerate(ops):
            custom = read_once(op, customs) if is_custom(op) and op in flowing else None
            if op not in flowing:  # never differentiated: its gradient reads and holds nothing
                self.reads.append((frozenset(), frozenset()))
            elif custom is not None:  # what the user's function captures, any forward tensor
                activations(custom.tensors, range(len(custom.tensors)))
                self.reads.append((frozenset(), frozenset()))
            else:
                self.reads.append(gradient_reads(op, differentiated_inputs(view, op)))
            in_reads, out_reads = self.reads[-1]
            grad_inputs = ([t for i, t in enumerate(op.inputs) if i in custom.differentiated]
                           if custom is not None else op.inputs)
            in_bytes = activations(grad_inputs, in_reads if custom is None else ())
            out_bytes = activations(op.outputs, out_reads)
            elementwise = op.type in ELEMENTWISE_TYPES or op.type in ALIASING_TYPES
            work[p] = 0.0 if op not in flowing else (
                max(in_bytes, out_bytes) if elementwise else in_bytes + out_bytes)
            if kernels is not None and op in flowing:
                work[p] += gradient_scratch(op, kernels)
            if op in flowing and custom is None:
                for i in in_reads:
                    t = op.inputs[i] if i < len(op.inputs) else None
                    if t is not None and t.ref() not in index and weight_copy(view, t):
                        copies[t.ref()] = view.tensor_bytes(t)
            param_grads[p] = 0.0 if op not in flowing else sum(
                view.tensor_bytes(t) for t in grad_inputs
                if t.ref() not in index and t.dtype.is_floating and view.is_forward(t.op))
            if not view.recomputable(op):
                for t in (*op.inputs, *op.outputs):
                    if t.ref() in index:
                        self._forced[index[t.ref()]] = True
        if kernels is not None:
            compiled = [op for op in ops if op in flowing and is_compiled_call(op)]
            for op, extra in compiled_gradient_scratch(view.graph, compiled, kernels).items():
                work[position[op]] += extra
        forced_views = self._forced & (roots >= 0)
        self._forced[roots[forced_views]] = True
        saved = np.zeros(n)
        np.add.at(saved, profile.births[read], profile.sizes[read])
        self.saved = saved
        self.work = work
        self.param_grads = param_grads
        self.flops = np.array([view.op_flops(op) for op in ops], dtype=np.float64)
        self.forced_bytes = float(profile.sizes[self._forced].sum())
        # forced_prefix[a + 1]: the forced bytes born at or before a, kept while the
        # backward of a segment after a runs (those born inside it count as saved if read).
        self.forced_prefix = np.concatenate([[0.0], np.cumsum(np.bincount(
            profile.births[self._forced], weights=profile.sizes[self._forced], minlength=n))])
        # Prefix sums: S[p + 1] = sum over positions <= p.
        self.saved_prefix = np.concatenate([[0.0], np.cumsum(saved)])
        self.flops_prefix = np.concatenate([[0.0], np.cumsum(self.flops)])
        # The parameter gradients alive at backward position q: those of ops at q and after
        # (made by then) when held, else op q's own only.
        # The weights' copies gradients read are made when the step starts (nothing but a
        # weight feeds them, so the executor runs them first) and live to their reader's
        # gradient: counted at every position.
        self.weight_copy_bytes = float(sum(copies.values()))
        self.param_suffix = np.concatenate([
            np.cumsum(param_grads[::-1])[::-1] if self.hold_gradients else param_grads,
            [0.0]]) + self.weight_copy_bytes
        self.n = n
        self.position = position
        # Gradient partials: a tensor consumed by several ops receives one gradient per
        # consumer, and TensorFlow sums them only when the last arrives, at the producer.
        # The partial from consumer c of a tensor born at p is alive while backward is
        # between them: positions q with p < q < c. One edge per (tensor, consumer).
        e_birth, e_consumer, e_size = [], [], []
        for j, t in enumerate(profile.tensors):
            for c in t.consumers():
                q = position.get(c)
                if q is not None and q > profile.births[j] and c in flowing:
                    e_birth.append(profile.births[j])
                    e_consumer.append(q)
                    e_size.append(grad_sizes[j])
        self._e_birth = np.asarray(e_birth, dtype=np.int64)
        self._e_consumer = np.asarray(e_consumer, dtype=np.int64)
        self._e_size = np.asarray(e_size, dtype=np.float64)
        delta = np.zeros(n + 1)
        np.add.at(delta, self._e_birth + 1, self._e_size)
        np.add.at(delta, self._e_consumer, -self._e_size)
        self._pending_all = np.cumsum(delta)[:n]
        self._tops = {}

    # ------------------------------------------------------------------ plans
    def cut_bytes(self, p):
        """Bytes of the tensors alive across the cut after position p (not forced)."""
        pr = self.profile
        mask = (pr.births <= p) & (pr.deaths > p) & ~self._forced
        return float(pr.sizes[mask].sum())

    def new_bytes(self, a, b):
        """Bytes the cut at b adds to the kept set when the previous cut is at a."""
        pr = self.profile
        mask = (pr.births > a) & (pr.births <= b) & (pr.deaths > b) & ~self._forced
        return float(pr.sizes[mask].sum())

    def backward_tops(self, b):
        """tops[q] = the most bytes at any position q <= r <= b of the backward of a segment
        ending at b, with the saved tensors of every position up to r counted.

        At position r the backward holds the gradient partials still waiting for their
        producer (pending edges, with those from beyond b replaced by the one incoming
        gradient of each tensor crossing b), op r's own gradient working set, the saved
        tensors born at r or before (`segment_bytes` subtracts those born before the
        segment) and the parameter gradients of ops at r and after (held to the end; op
        r's own only when not held).
        """
        tops = self._tops.get(b)
        if tops is not None:
            return tops
        n = self.n
        pr = self.profile
        beyond = (self._e_birth <= b) & (self._e_consumer > b)
        crossing = (pr.births <= b) & (pr.deaths > b)
        # Both are alive for positions q > birth: cumulative sums over the birth.
        correction = np.bincount(pr.births[crossing] + 1, weights=pr.tensor_sizes[crossing],
                                 minlength=n + 1)
        correction -= np.bincount(self._e_birth[beyond] + 1, weights=self._e_size[beyond],
                                  minlength=n + 1)
        pending = self._pending_all[: b + 1] + np.cumsum(correction)[: b + 1]
        level = (pending + self.work[: b + 1] + self.saved_prefix[1: b + 2]
                 + self.param_suffix[: b + 1])
        tops = np.maximum.accumulate(level[::-1])[::-1]
        if len(self._tops) > 4096:
            self._tops.clear()
        self._tops[b] = tops
        return tops

    def segment_bytes(self, a, b):
        """Predicted peak of segment (a, b]'s backward, above the tensors kept before it.

        At the worst position q of the segment: its saved tensors born up to q, the gradient
        partials waiting, op q's gradient step and the parameter gradients made by then (by
        ops at q and after, later segments' included), held to the end of the backward.
        """
        if b <= a:
            return 0.0
        return float(self.backward_tops(b)[a + 1] - self.saved_prefix[a + 1])

    def segment_flops(self, a, b):
        """FLOPs recomputed for segment (a, b]: of the copies that run (`idle_copies`)."""
        return float(idle_copies.segment_flops(self, a, b))

    def predict(self, cuts):
        """Predicted activation peak and recomputed FLOPs of cuts at the given positions.

        Args:
          cuts: positions (indices into `profile.ops`), any order.

        Returns:
          `(peak_bytes, recomputed_flops)`.
        """
        cuts = sorted(set(int(c) for c in cuts if 0 <= c < self.n - 1))
        kept, forced = 0.0, self.forced_prefix
        peak, flops, a = 0.0, 0.0, -1
        for b in cuts:
            peak = max(peak, forced[a + 1] + kept + self.segment_bytes(a, b))
            flops += self.segment_flops(a, b)
            kept += self.new_bytes(a, b)
            a = b
        peak = max(peak, forced[a + 1] + kept + self.segment_bytes(a, self.n - 1))
        return peak, flops

    def tensors_for(self, cuts):
        """The tensors kept by cuts at the given positions, in forward order."""
        chosen = {}
        for c in sorted(set(cuts)):
            for t in self.profile.cut(c):
                chosen.setdefault(t.ref(), t)
        return list(chosen.values())

    def positions_of(self, tensors):
        """Cut positions at the producers of `tensors`.

        `predict` of these positions assumes every tensor alive at each position is kept,
        which is what keeping `tensors` means when each is a separator (chains, residual
        sums). For tensors that are not (one feature map inside a dense block) the rewrite
        recomputes more than that, and the prediction is too low.
        """
        return sorted({self.position[t.op] for t in tensors if t.op in self.position})

