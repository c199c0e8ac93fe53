"""Loops in the rewrite: the gradient of a forward `While` op, in segments of steps.

TensorFlow differentiates a loop (``tf.while_loop``, ``tf.scan``, ``tf.map_fn``, ``tf.foldl``,
Keras's RNN layers) by rewriting the forward `While` op so that every step pushes what its
gradient will read onto accumulators, then running a reverse loop that pops them: memory
grows with the number of steps T. Inside `memgrad.gradients` a loop's gradient is built by
`LoopGradients` instead, in one of three ways, recorded per loop as a `LoopRecord`:

- ``'segments'``: the forward loop keeps only its carried state (the loop variables that
  change) at the start of every k-th step, k about sqrt(T) (shorter where the state is
  small beside one step's intermediates, see `segment_length`). The backward pass is a loop over
  the segments, last first: each replays its k steps from the kept state (a copy of the loop,
  cut to those steps) and differentiates the replay with TensorFlow's own loop gradient. It
  holds about T/k states plus one segment's intermediates, O(sqrt T), for one more forward
  pass of the loop. A segment starts from a kept state, so its loop variables must be state
  (tensors) or output lists the body only writes (a ``TensorArray`` it writes once per step).
- ``'replay'``: the whole loop runs again from its inputs once its gradient is needed and that
  replay is differentiated. The forward pass keeps nothing of the loop; the backward holds
  every step's intermediates while the loop's gradient runs. Used where segments do not
  apply: a loop variable that is neither state nor a written output list, a loop counter
  that does not start at zero, few steps, or XLA (whose lists need compile-time sizes).
- ``'kept'``: TensorFlow's own gradient of the forward op, which keeps every step's
  intermediates from the forward pass on (what ``checkpoints='speed'`` asks for, and what a
  loop gets whose body runs a stateful op: a second run would draw other random numbers or
  update a variable twice).

Whatever the way, the gradient is TensorFlow's gradient of the same steps: equal to
`tf.gradients` up to float rounding.
"""

import contextlib
import dataclasses
import warnings

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from memgrad._src import tf_internals
from memgrad._src.checkpointing import recording
from memgrad._src.checkpointing.loop_ops import (
    attr_function, attr_shapes, attr_types, densified, empty_like_list, loop_copy,
    relaxed_shape, shape_tensor, waiting_for)
from memgrad._src.checkpointing.loop_segments import (  # noqa: F401 - the tests read two here
    dividing_segment_length, segment_length, loop_sizes, static_int, steps_estimate)
from memgrad._src.checkpointing.loop_second_order import differentiable_again
from memgrad._src.graph.kernels import called_functions

LOOP_TYPES = frozenset({"While", "StatelessWhile"})
CONTROL_FLOW_TYPES = LOOP_TYPES | {"If", "StatelessIf", "Case", "StatelessCase"}
# Stateful op types that read state without changing it: a second run returns the same.
_READ_ONLY_STATEFUL = frozenset({
    "ReadVariableOp", "ResourceGather", "ResourceGatherNd", "VariableShape",
    "VarIsInitializedOp", "Assert",
})
# Ops calling functions: stateful as a type, judged by what their functions run.
_CALL_TYPES = CONTROL_FLOW_TYPES | {"PartitionedCall", "StatefulPartitionedCall"}
# Fewer steps than this are replayed whole: segments would save too little to pay for
# their bookkeeping.
MIN_SEGMENTED_STEPS = 8


@dataclasses.dataclass(frozen=True)
class LoopRecord:
    """How `memgrad.gradients` differentiated one forward loop.

    Attributes:
      name: the `While` op's name.
      mode: ``'segments'``, ``'replay'`` or ``'kept'`` (see `memgrad.gradients`).
      steps_per_segment: k, the steps each segment replays (``'segments'`` only, else 0).
      reason: why the loop was not differentiated in segments (empty when it was).
    """

    name: str
    mode: str
    steps_per_segment: int = 0
    reason: str = ""


# ---------------------------------------------------------------------- what a loop runs
def stateful_op_in(op):
    """The first op in `op`'s functions (recursively) that a second run would not repeat.

    Args:
      op: an op calling functions (`While`, `If`, a call).

    Returns:
      ``(op type, node name)`` of a stateful op other than a read, or None. An op type
      TensorFlow does not know counts as stateful.
    """
    seen = set()
    stack = list(called_functions(op.node_def.attr))
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        definition = tf_internals.graph_function_definition(op.graph, name)
        if definition is None:
            return (name, name)
        for node in definition.node_def:
            stack.extend(called_functions(node.attr))
            if tf_internals.graph_function_definition(op.graph, node.op) is not None:
                stack.append(node.op)  # a call by the function's name
                continue
            op_def = tf_internals.op_def_of(node.op)
            if op_def is None:
                return (node.op, node.name)
            if (op_def.is_stateful and node.op not in _READ_ONLY_STATEFUL
                    and node.op not in _CALL_TYPES):
                return (node.op, node.name)
    return None


def _unwrapped(tensor):
    while tensor.op.type == "Identity":
        tensor = tensor.op.inputs[0]
    return tensor


def _is_zeros(grad):
    """A gradient tf.gradients filled in for an unused output (ZerosLike): no information."""
    return isinstance(grad, tf.Tensor) and grad.op.type == "ZerosLike"


# ---------------------------------------------------------------------- loop variables
# Kinds of a loop variable (an input of the While op, the same-index input and output of
# its body):
#   'counter'    the loop counter and the maximum iterations (inputs 0 and 1, while_v2's own)
#   'invariant'  passed through unchanged (captured tensors, variables' handles, lists read)
#   'state'      any other tensor the body changes (RNN states, scan's carry, an index)
#   'list'       a TensorList the body only writes, one item per step (a TensorArray's writes)
#   'junk'       a list the body only writes or pushes to whose value no gradient reaches
#                (TensorFlow's own accumulators, when tf.gradients differentiated it before)
def _variable_kinds(op, body, grads):
    """The kind of each loop variable, or ``(None, reason)`` when segments cannot hold it."""
    kinds = ["counter", "counter"]
    for i in range(2, len(body.inputs)):
        inner, out = body.inputs[i], _unwrapped(body.outputs[i])
        if out is inner:
            kinds.append("invariant")
            continue
        if inner.dtype != tf.variant:
            kinds.append("state")
            continue
        consumers = inner.consumers()
        writer = consumers[0] if len(consumers) == 1 else None
        if writer is None or out.op is not writer:
            return None, (f"loop variable {i} is a list the body reads or changes in "
                          "another way than writing it")
        if grads[i] is None and writer.type in ("TensorListSetItem", "TensorListPushBack"):
            kinds.append("junk")
        elif writer.type == "TensorListSetItem" and not writer.get_attr(
                "resize_if_index_out_of_bounds"):
            kinds.append("list")
        else:
            return None, (f"loop variable {i} is a list the body grows ({writer.type}), "
                          "so a segment cannot start from its initial value")
    return kinds, ""


# ---------------------------------------------------------------------- gradients
class LoopGradients:
    """Builds the gradients of the forward loops of one `memgrad.gradients` call.

    Args:
      policy: ``'segments'`` (differentiate loops in segments of steps where that applies)
        or ``'kept'`` (TensorFlow's own loop gradient).
      xla: whether the graph is traced for XLA (segments then give way to replays).
      wanted: ``wanted(tensor)``, whether the gradient of a loop's input is asked for (some
        x flows into it); the segments then carry no gradient for the other invariant
        inputs (a sequence the loop reads from a constant, a variable not differentiated).
        States and written lists are chained whatever it says. Default: all.

    Attributes:
      records: one `LoopRecord` per loop differentiated, in the order they were.
    """

    def __init__(self, policy="segments", xla=False, wanted=None):
        if policy not in ("segments", "kept"):
            raise ValueError(f"policy must be 'segments' or 'kept'. Received: {policy!r}")
        self.policy = policy
        self.xla = xla
        self.wanted = wanted
        self.records = []

    def install(self, ops):
        """Makes tf.gradients use this object for the loops among ``ops``; returns them."""
        loops = [op for op in ops if op.type in LOOP_TYPES]
        for op in loops:
            op._gradient_function = self.gradient
        return loops

    @staticmethod
    def uninstall(loops):
        for op in loops:
            op._gradient_function = None

    def gradient(self, op, *grads):
        """The gradient function of the forward loop ``op`` (TensorFlow's signature)."""
        op._gradient_function = None  # a second differentiation gets TensorFlow's own
        informative = [None if _is_zeros(g) else g for g in grads]
        mode, length, reason = self._decide(op, informative)
        self.records.append(LoopRecord(op.name, mode, length if mode == "segments" else 0,
                                       reason))
        if mode == "kept":
            if reason.startswith("its body"):
                warnings.warn(
                    f"memgrad.gradients: loop '{op.name}' is not recomputed: {reason}. Its "
                    "gradient keeps every step's intermediates, as tf.gradients does.",
                    stacklevel=2)
            if recording.recorded_by_a_tape(op.outputs, f"the gradient of loop '{op.name}'"):
                # A tape around the call (a gradient of this gradient) differentiates
                # TensorFlow's loop gradient wrongly (it misses the accumulators' dependence
                # on the loop's inputs); the replay's own gradient is what tapes get.
                return differentiable_again(
                    op, grads, lambda: tf_internals.while_gradient(op, *grads))
            return tf_internals.while_gradient(op, *grads)
        if mode == "replay":
            return differentiable_again(op, grads, lambda: self._replayed(op, grads))
        return differentiable_again(
            op, grads, lambda: self._segmented(op, informative, length))

    def _decide(self, op, grads):
        """``(mode, steps per segment, reason)`` for the loop ``op``."""
        if self.policy == "kept":
            return "kept", 0, "the strategy keeps loop intermediates"
        stateful = stateful_op_in(op)
        if stateful is None and recording.recorded_by_a_tape(
                op.outputs, f"the gradient of loop '{op.name}'"):
            # Segments add the kept states to the forward loop as new inputs; a tape that
            # recorded the loop before (a gradient of this gradient) then gets more input
            # gradients from it than it recorded inputs, and fails.
            return "replay", 0, "a tape enclosing the call recorded the loop"
        if stateful is not None:
            return "kept", 0, (f"its body runs the stateful op {stateful[0]} "
                               f"('{stateful[1]}'), which a second run would not repeat")
        if static_int(op.inputs[0]) != 0:
            return "replay", 0, "its step counter does not start at zero"
        body = tf_internals.while_function_graph(op, "body", "_body_graph")
        kinds, reason = _variable_kinds(op, body, grads)
        if kinds is None:
            return "replay", 0, reason
        bound = static_int(op.inputs[1])
        if bound is not None and bound < 0:
            bound = None
        if bound is not None and bound < MIN_SEGMENTED_STEPS:
            return "replay", 0, f"it runs at most {bound} steps"
        sizes = loop_sizes(body, kinds)
        if not self.xla:
            return "segments", segment_length(bound or steps_estimate(op), *sizes), ""
        # XLA sizes every list at compile time: each segment replays a fixed k steps (its
        # own condition stops it where the forward stopped), so k must divide the bound.
        if bound is None:
            return "replay", 0, "under XLA, segments need a static bound on its steps"
        length = dividing_segment_length(bound, *sizes)
        if length is None:
            return "replay", 0, (f"under XLA, segments need a segment length dividing its "
                                 f"{bound} steps near the best length")
        return "segments", length, ""

    # ------------------------------------------------------------------ replay
    def _replayed(self, op, grads):
        """Differentiates a copy of the whole loop that runs once the gradients arrive."""
        inputs = waiting_for(op.inputs, grads)
        attrs = dict(op.node_def.attr)
        copy = loop_copy(op, inputs, attrs, "memgrad_replay")
        return list(tf_internals.while_gradient(copy, *grads))

    # ------------------------------------------------------------------ segments
    def _segmented(self, op, grads, length):
        count = len(op.inputs)
        body = tf_internals.while_function_graph(op, "body", "_body_graph")
        kinds, _ = _variable_kinds(op, body, grads)
        body_name = op.get_attr("body").name
        condition = self._segment_condition(op, fixed_length=self.xla)
        shapes = [tf.TensorShape(s) for s in op.get_attr("output_shapes")][:count]
        original_inputs = list(op.inputs)
        states = [i for i, kind in enumerate(kinds) if kind == "state"]
        snapshots = self._keep_states(op, body, states, length, shapes)
        attrs = {
            "T": attr_types([t.dtype for t in original_inputs]),
            "output_shapes": attr_shapes(shapes),
            "parallel_iterations": op.node_def.attr["parallel_iterations"],
            "body": attr_function(body_name),
            "cond": attr_function(condition),
            "_num_original_outputs": attr_value_pb2.AttrValue(i=count),
        }
        # Lowered to the executor's own frames where the forward loop is (much faster per
        # step than the functional While kernel), and its resource inputs read-only alike.
        for key in ("_lower_using_switch_merge", "_read_only_resource_inputs"):
            if key in op.node_def.attr:
                attrs[key] = op.node_def.attr[key]
        chained, initial, fixed = self._chained_gradients(op, body, kinds, grads, self.wanted)
        if not chained and not fixed:
            return [None] * len(op.inputs)
        steps = op.outputs[0]

        def segment(s, *incoming):
            # One segment: its kept state, its steps replayed, their gradient.
            s, = waiting_for([s], incoming)
            inputs = list(original_inputs)
            inputs[0] = tf.zeros([], inputs[0].dtype)
            if self.xla:  # a compile-time constant: the condition stops a last, short segment
                inputs[1] = tf.constant(length, inputs[1].dtype)
            else:
                inputs[1] = tf.cast(tf.minimum(length, steps - s * length), inputs[1].dtype)
            for i, kept in zip(states, snapshots):
                inputs[i] = tf.raw_ops.TensorListGetItem(
                    input_handle=kept, index=s, element_shape=shape_tensor(shapes[i]),
                    element_dtype=inputs[i].dtype)
                inputs[i].set_shape(shapes[i])
            replay = loop_copy(op, inputs, attrs, "memgrad_segment")
            out_grads = [None] * count
            for i, grad in zip(chained, incoming):
                out_grads[i] = grad
            for i, grad in fixed.items():
                out_grads[i] = grad
            in_grads = tf_internals.while_gradient(replay, *out_grads)
            following = []
            for i, before in zip(chained, incoming):
                grad = in_grads[i]
                if grad is None:
                    grad = before if kinds[i] == "invariant" else tf.zeros_like(before)
                following.append(densified(grad))
            return [s - 1] + following

        segments = (steps + (length - 1)) // length
        variables = [segments - 1] + initial
        invariants = [tf.TensorShape([])] + [relaxed_shape(t) for t in initial]
        results = tf.while_loop(
            lambda s, *_: s >= 0, segment, variables, shape_invariants=invariants,
            parallel_iterations=1, name="memgrad_segments")
        in_grads = [None] * len(op.inputs)
        for i, start, grad in zip(chained, initial, results[1:]):
            grad.set_shape(start.shape)
            in_grads[i] = grad
        return in_grads

    @staticmethod
    def _keep_states(op, body, states, length, shapes):
        """Rewrites the forward loop to also output its state at every segment's start.

        Step t writes its incoming state to slot ceil(t / k): the last write to slot s is
        step s*k's, the start of segment s. The slots are TensorLists, passed as new loop
        variables the way TensorFlow's own gradient adds its accumulators.
        """
        if not states:
            return []
        bound = static_int(op.inputs[1])
        slots = (bound - 1 + length - 1) // length + 1 if bound and bound > 0 else None
        graph = op.graph
        empty = []
        with graph.as_default(), tf_internals.clear_control_inputs():
            with graph.device(op.device) if op.device else contextlib.nullcontext():
                for i in states:
                    empty.append(tf.raw_ops.TensorListReserve(
                        element_shape=shape_tensor(shapes[i]),
                        num_elements=slots if slots is not None else 0,
                        element_dtype=op.inputs[i].dtype, name="memgrad_kept_states"))
        condition = tf_internals.while_function_graph(op, "cond", "_cond_graph")
        with body.as_default():
            step = body.inputs[0]
            slot = (step + (length - 1)) // length
            for i, initial in zip(states, empty):
                kept = body.capture(initial)
                body.outputs.append(tf.raw_ops.TensorListSetItem(
                    input_handle=kept, index=slot, item=body.inputs[i],
                    resize_if_index_out_of_bounds=slots is None))
        with condition.as_default():
            for initial in empty:
                condition.capture(initial)
        suffix = f"_memgrad_kept_states_{tf_internals.unique_id()}"
        body.name += suffix
        condition.name += suffix
        op._set_func_attr("cond", tf_internals.add_function_to_graph(condition))
        op._set_func_attr("body", tf_internals.add_function_to_graph(body))
        op._set_type_list_attr("T", body.output_types)
        op._set_shape_list_attr("output_shapes", body.output_shapes)
        op._add_while_inputs(empty)
        op._add_outputs([t.dtype for t in empty], [t.shape for t in empty])
        op._body_graph, op._cond_graph = body, condition
        return op.outputs[len(op.outputs) - len(empty):]

    @staticmethod
    def _segment_condition(op, fixed_length=False):
        """A segment's loop condition: the step counter below the second loop variable.

        With ``fixed_length`` (every segment given the same k, as XLA needs) the loop's own
        condition must hold too, so that the last segment stops where the forward loop did:
        it sees the same state at the same step, so it decides the same.
        """
        name = f"memgrad_segment_cond_{tf_internals.unique_id()}"
        signature = [tf.TensorSpec(t.shape, t.dtype) for t in op.inputs]
        original = op.get_attr("cond").name

        def condition(step, limit, *rest):
            going = step < limit
            if not fixed_length:
                return going
            args = [step, limit] + list(rest)
            own = tf.compat.v1.get_default_graph().create_op(
                "PartitionedCall", args, [tf.bool], name="loop_cond", attrs={
                    "f": attr_function(original),
                    "Tin": attr_types([t.dtype for t in args]),
                    "Tout": attr_types([tf.bool]),
                })
            return tf.logical_and(going, tf.reshape(own.outputs[0], []))

        graph = tf_internals.func_graph_from_py_func(
            name, condition, [], {}, signature=signature,
            func_graph=tf_internals.WhileCondFuncGraph(name))
        return tf_internals.add_function_to_graph(graph)

    @staticmethod
    def _chained_gradients(op, body, kinds, grads, wanted=None):
        """The loop variables whose gradient runs through the segments, and its start.

        States and written lists pass their gradient from a segment to the one before it;
        invariants (captured tensors, variables, lists read) collect theirs, each segment
        adding its part to what the later ones gave: with no gradient yet, that starts at
        zero (a list of the same length and no items, for a list read). A list that starts
        empty (a TensorArray's) and is written at a new index every step needs no gradient
        for its start: every segment reads its own items from the list's incoming gradient,
        passed as it is (chaining it would fill the list with zeros, item by item).

        Returns:
          ``(chained indices, their starting gradients, {index: fixed gradient})``.
        """
        chained, initial, fixed = [], [], {}
        for i, kind in enumerate(kinds):
            t, grad = op.inputs[i], grads[i]
            if kind in ("counter", "junk") or not (
                    t.dtype.is_floating or t.dtype.is_complex
                    or t.dtype in (tf.resource, tf.variant)):
                continue
            if kind == "list" and grad is None:
                continue
            if kind == "invariant" and wanted is not None and not wanted(t):
                # No x flows into it (a sequence read from a constant, a variable not
                # differentiated): its gradient, summed over the segments, would be computed
                # for nothing. A state's or a written list's gradient is chained on, whatever
                # its start: the segment before reads it.
                continue
            if kind == "list" and t.op.type in ("TensorListReserve", "EmptyTensorList") and (
                    _writes_at_step_index(body, i)):
                fixed[i] = grad
                continue
            if grad is None:
                if t.dtype == tf.resource:
                    grad = tf_internals.while_zeros_like(t, op.outputs[i])
                elif t.dtype == tf.variant:
                    grad = empty_like_list(t, body.inputs[i])
                else:
                    grad = tf.zeros_like(t)
            if grad is None:
                continue
            chained.append(i)
            initial.append(densified(grad))
        return chained, initial, fixed


def _writes_at_step_index(body, i):
    """Whether the body writes list variable ``i`` at an index that grows by one each step
    (a loop variable ``j`` the body returns as ``j + 1``): no item is written twice."""
    writer = body.inputs[i].consumers()[0]
    index = writer.inputs[1]
    positions = [j for j, t in enumerate(body.inputs) if t is index]
    if not positions:
        return False
    update = _unwrapped(body.outputs[positions[0]])
    if update.op.type not in ("AddV2", "Add") or not any(t is index for t in update.op.inputs):
        return False
    other = [t for t in update.op.inputs if t is not index]
    return len(other) == 1 and tf.get_static_value(other[0]) == 1


