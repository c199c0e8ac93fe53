"""`memgrad.GradientTape`: a drop-in for `tf.GradientTape` whose gradients are checkpointed."""

import warnings

import numpy as np
import tensorflow as tf

from memgrad._src import tf_internals
from memgrad._src.checkpointing.api import (
    gradients, raised_by_tf_gradients, unconnected_gradients_for,
)
from memgrad._src.checkpointing import recording
from memgrad._src.checkpointing.rewrite_log import record_fallback
from memgrad._src.checkpointing.fallback import crash_reason, outside_graph_of_ys
from memgrad._src.checkpointing.strategies import as_strategy

_warned_eager = []


def _variable_of(source):
    """The `tf.Variable` a source stands for (itself, or a Keras 3 variable's), or None."""
    if isinstance(source, tf.Variable):
        return source
    if isinstance(source, tf.Tensor):  # tensors first: `.value` means something else there
        return None
    value = getattr(source, "value", None)  # a Keras 3 variable wraps a tf.Variable
    return value if isinstance(value, tf.Variable) else None


def _mode_name(checkpoints):
    return getattr(as_strategy(checkpoints), "name", "strategy")


def _nested_reason(targets, sources):
    """Why the rewrite cannot follow the targets (computed in a loop body or a branch) back
    to the sources in an enclosing graph, or None."""
    if not targets or not all(tf.is_symbolic_tensor(t) for t in targets):
        return None
    graph = targets[0].graph
    if any(t.graph is not graph for t in targets):
        return None  # memgrad.gradients raises its own error for that
    sources = [s if _variable_of(s) is None else _variable_of(s) for s in sources]
    return outside_graph_of_ys(targets, sources)


class GradientTape(tf.GradientTape):
    """A `tf.GradientTape` whose `gradient` recomputes activations instead of keeping them.

    Inside a `tf.function` (where training steps run), `tape.gradient(target, sources)`
    calls `memgrad.gradients` on the traced graph with the tape's `checkpoints` strategy.
    In eager mode there is no graph to rewrite, so the tape behaves exactly like
    `tf.GradientTape` (and warns once).

    Inside a graph, tensor sources are differentiated like `tf.gradients` does, whether or
    not the tape watched them; variables behave as with `tf.GradientTape`: one the tape did
    not watch (with `watch_accessed_variables=False`, one not passed to `watch`) gets None.
    A non-persistent tape computes one set of gradients; a second `gradient` call raises.

    Caveats:
      - Those of `memgrad.gradients`, which this calls: XLA and stateful ops.
      - Unwatched sources: a variable the tape did not watch (with
        ``watch_accessed_variables=False``, one not passed to `watch`) gets None, or zeros
        with ``unconnected_gradients='zero'``, like `tf.GradientTape`. A *tensor* source
        is the exception: inside a `tf.function` it is differentiated whether or not it
        was watched (`tf.gradients`' rule), where `tf.GradientTape` would return None.
        In eager mode the tape is `tf.GradientTape` and follows its rules exactly.
      - Recorded ops: as on `tf.GradientTape`, gradients do not flow through ops created
        while the tape was not recording (after its ``with`` block, inside
        `stop_recording()`, before `reset()`): they are constants to it.
      - Inside a loop body or a branch: a gradient there of what the tape recorded in an
        enclosing graph (`jacobian` with ``experimental_use_pfor=False`` takes one per
        row in a `tf.while_loop`) is `tf.GradientTape`'s own, with a warning.
      - Nested tapes (a gradient of a gradient): a memgrad.GradientTape opened inside
        another of the same graph records no ops itself (two recording tapes make
        TensorFlow wrap every loop in a function call, which the rewrite keeps whole, so a
        loop saved nothing); it notes the variables it reads. Its gradients are memgrad's
        as always; where memgrad would fall back to `tf.GradientTape`'s own gradient (the
        case above) such a tape raises a RuntimeError instead. The outer tape differentiates
        the graph too: a gradient through a loop taken inside it is the one `tf.gradients`
        builds, not the tape-aware one a `tf.GradientTape` needs, so the outer tape also
        raises rather than fall back.

    Args:
      persistent: as for `tf.GradientTape`.
      watch_accessed_variables: as for `tf.GradientTape`.
      checkpoints: the strategy: `'memory'`, `'speed'`, `'collection'`, a list of
        tensors, or a `memgrad.strategies.Budget` (see `memgrad.gradients`).

    Raises:
      ValueError: for an unknown ``checkpoints`` string.
      TypeError: for a ``checkpoints`` of no accepted kind, or a ``persistent`` or
        ``watch_accessed_variables`` that is not a bool.

    Example:
      ```python
      @tf.function
      def train_step(x, y):
          with memgrad.GradientTape(checkpoints="memory") as tape:
              loss = loss_fn(y, model(x, training=True))
          grads = tape.gradient(loss, model.trainable_variables)
          optimizer.apply_gradients(zip(grads, model.trainable_variables))
      ```
    """

    def __init__(self, persistent=False, watch_accessed_variables=True, checkpoints="memory"):
        for name, value in (("persistent", persistent),
                            ("watch_accessed_variables", watch_accessed_variables)):
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(
                    f"memgrad.GradientTape {name} must be True or False. Received: "
                    f"{name}={value!r}"
                )
        as_strategy(checkpoints)  # an unknown mode or a wrong type fails here, not at gradient()
        super().__init__(persistent=persistent, watch_accessed_variables=watch_accessed_variables)
        self.checkpoints = checkpoints
        # In a graph, the spans of op ids created while the tape recorded: [graph, first
        # id not recorded before, last recorded id (None while recording)].
        self._windows = []
        # Whether the tape records no ops (see `_push_tape`), and what it watches instead.
        self._quiet = None
        self._watches_reads = watch_accessed_variables
        self._watcher = None
        self._variables = []  # variables passed to `watch` or read while quiet
        # Why the tape's gradient must come from the graph, not from its TensorFlow tape
        # (set by `recording.recorded_by_a_tape`), or None.
        self._graph_only_reason = None

    # tf.GradientTape records only the ops run while it records: a target computed after
    # the `with` block (or inside `stop_recording()`) has no gradient through them. In a
    # graph memgrad differentiates the graph itself, so it notes which ops were created
    # while recording and stops its gradients at the others (`_unrecorded`). Every way
    # tf.GradientTape starts or stops recording goes through `_push_tape` / `_pop_tape`
    # (`with`, `stop_recording`, `reset`, and `jacobian`'s own re-recording of the ops
    # it adds), so the spans are kept there.
    #
    # A tape opened inside another memgrad.GradientTape of the same graph (a gradient of a
    # gradient: a Hessian-vector product, a gradient penalty) is *quiet*: its TensorFlow tape
    # records no op, and the variables it reads are noted by a `VariableWatcher`. memgrad
    # differentiates the graph, not the tape; but TensorFlow, seeing two tapes record a
    # loop, wraps the loop in a function call (for the tapes' second derivative), which the
    # rewrite keeps whole: a 2-layer LSTM's Hessian-vector product saved no memory under
    # nested tapes (1.02x of plain's peak; 0.80x quiet, as with memgrad.gradients twice).
    def _push_tape(self):
        graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        if self._quiet is None and graph is not None:
            self._quiet = any(other is not self and where is graph
                              for other, where in recording.pushed_tapes())
            if self._quiet:
                tf_internals.stop_watching_accessed_variables(self)
        super()._push_tape()  # raises if the tape is recording already
        if self._quiet and self._watches_reads:
            self._watcher = tf_internals.VariableWatcher()
            self._watcher.__enter__()
        recording.note_pushed(self, graph)
        if graph is not None:
            self._windows.append([graph, tf_internals.last_op_id(graph), None])

    def _pop_tape(self):
        super()._pop_tape()  # raises if the tape is not recording
        for window in self._windows:
            if window[2] is None:
                window[2] = tf_internals.last_op_id(window[0])
        if self._watcher is not None:
            self._variables += self._watcher.watched_variables()
            self._watcher.__exit__(None, None, None)
            self._watcher = None
        recording.note_popped(self)

    def watch(self, tensor):
        """As `tf.GradientTape.watch`. A quiet tape (one opened inside another
        memgrad.GradientTape of the same graph) notes the variables and records nothing:
        in a graph memgrad differentiates a tensor source whether watched or not."""
        if not self._quiet:
            return super().watch(tensor)
        for t in tf.nest.flatten(tensor, expand_composites=True):
            variable = _variable_of(t)
            if variable is None and not tf.is_tensor(t) and hasattr(t, "handle"):
                variable = t  # another variable-like object, as tf.GradientTape.watch takes
            if variable is not None:
                self._variables.append(variable)
            elif not tf.is_tensor(t):
                raise ValueError(f"memgrad.GradientTape.watch expects tensors or variables. "
                                 f"Received: {type(t).__name__} {t!r}")
        return None

    def watched_variables(self):
        """As `tf.GradientTape.watched_variables`: the variables the tape watches."""
        found = tuple(super().watched_variables())
        if not self._quiet:
            return found
        reading = list(self._watcher.watched_variables()) if self._watcher is not None else []
        unique = {}
        for variable in (*found, *self._variables, *reading):
            unique.setdefault(variable.ref(), variable)
        return tuple(unique.values())

    def reset(self):
        """As `tf.GradientTape.reset`: what was recorded before is forgotten."""
        super().reset()  # stops recording, then starts a new span
        self._variables = []  # a quiet tape forgets the variables it noted too
        self._graph_only_reason = None  # and the loop gradients taken inside it
        self._windows = [window for window in self._windows[-1:] if window[2] is None]

    def _unrecorded(self, targets):
        """The outputs of ops that feed ``targets`` but were created while the tape did not
        record (where ops it recorded meet them, or a target itself): gradients stop there,
        as on `tf.GradientTape`. Empty where the tape never recorded in the targets' graph."""
        graph = next((t.graph for t in targets if isinstance(t, tf.Tensor)), None)
        spans = [(first, last) for g, first, last in self._windows if g is graph]
        if not spans:
            return []

        def recorded(op):
            number = tf_internals.op_id(op)
            return any(first < number and (last is None or number <= last) for first, last in spans)

        stops, seen = [], set()
        stack = [t.op for t in targets if isinstance(t, tf.Tensor) and t.graph is graph]
        while stack:
            op = stack.pop()
            if op in seen:
                continue
            seen.add(op)
            if recorded(op):
                stack.extend(t.op for t in op.inputs if t.graph is graph)
            elif op.inputs:  # an op without inputs (a constant, an argument) stops nothing
                stops.extend(op.outputs)
        return stops

    def _tape_gradient(self, reason, target, sources, output_gradients, unconnected_gradients):
        """tf.GradientTape's own gradient, where memgrad cannot give it (``reason``), with one
        warning (pointing at the caller of `gradient`) and a `record_rewrites` entry."""
        mode = _mode_name(self.checkpoints)
        if self._quiet or self._graph_only_reason:
            why = ("it was opened inside another memgrad.GradientTape of the same graph and "
                   "records no ops of its own" if self._quiet else
                   f"{self._graph_only_reason}, taken inside this tape, was built for "
                   "memgrad's differentiation of the graph; tf.GradientTape's gradient of it "
                   "is None or wrong")
            raise RuntimeError(
                f"memgrad.GradientTape(checkpoints={mode!r}) cannot give this gradient: "
                f"{reason}. Its fallback is tf.GradientTape's own gradient, but {why} (see "
                "the class docstring). Open this tape with tf.GradientTape, or take the "
                "inner gradient outside it.")
        warnings.warn(
            f"memgrad.GradientTape(checkpoints={mode!r}) cannot rewrite this graph: {reason}. "
            "Using tf.GradientTape's gradient for it (no memory saved).",
            stacklevel=3,
        )
        record_fallback(mode, reason)
        return super().gradient(
            target, sources, output_gradients=output_gradients,
            unconnected_gradients=unconnected_gradients,
        )

    @tf.autograph.experimental.do_not_convert
    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        """Gradients of `target` with respect to `sources` (same contract as tf.GradientTape).

        Args:
          target: a tensor or nested structure of tensors to differentiate.
          sources: a tensor, variable, or nested structure of them.
          output_gradients: optional incoming gradients, one per target.
          unconnected_gradients: `'none'` or `'zero'`.

        Returns:
          Gradients with the structure of `sources`.
        """
        if tf.executing_eagerly():
            if not _warned_eager:
                _warned_eager.append(True)
                warnings.warn(
                    "memgrad.GradientTape is running eagerly, where there is no graph to "
                    "rewrite: gradients are plain tf.GradientTape gradients. Run the step "
                    "in a tf.function to checkpoint.",
                    stacklevel=2,
                )
            return super().gradient(
                target, sources, output_gradients=output_gradients,
                unconnected_gradients=unconnected_gradients,
            )
        if tf_internals.tape_is_spent(self):
            # tf.GradientTape's own rule and message.
            raise RuntimeError(
                "A non-persistent GradientTape can only be used to compute one set of "
                "gradients (or jacobians)"
            )
        flat_targets = tf.nest.flatten(target)
        flat_sources = tf.nest.flatten(sources, expand_composites=False)
        nested = _nested_reason(flat_targets, flat_sources)
        if nested is not None:
            # A gradient inside a loop body or a branch (`jacobian` without pfor takes
            # one per row in a while loop) of what the tape recorded in an enclosing graph:
            # tf.gradients, the rewrite's own fallback, stops at the captured tensors and
            # gives a variable read outside no gradient; the tape follows them.
            return self._tape_gradient(nested, target, sources, output_gradients,
                                       unconnected_gradients)
        tf_internals.stop_tape_if_recording(self)
        grad_ys = None
        if output_gradients is not None:
            grad_ys = tf.nest.flatten(output_gradients)
        # Like tf.GradientTape, a variable the tape did not watch gets no gradient (with
        # watch_accessed_variables=False, only variables passed to `watch` are watched).
        watched = {v.ref() for v in self.watched_variables()}
        variables = [_variable_of(s) for s in flat_sources]
        unwatched = [v is not None and v.ref() not in watched for v in variables]
        wanted = [s for s, skip in zip(flat_sources, unwatched) if not skip]
        unrecorded = self._unrecorded(flat_targets)
        extra = {"stop_gradients": unrecorded} if unrecorded else {}
        try:
            grads = iter(gradients(
                flat_targets, wanted, grad_ys=grad_ys, checkpoints=self.checkpoints,
                unconnected_gradients=unconnected_gradients, **extra,
            ) if wanted else [])
        except Exception as error:  # noqa: BLE001 - only TensorFlow's own failure is caught
            if not raised_by_tf_gradients(error):
                raise
            # memgrad's answer was plain tf.gradients, and it failed where the tape's own
            # backprop may not (tf.gradients inside enclosing tapes, over lists of loops).
            reason = crash_reason("plain tf.gradients", error).replace(
                " (a memgrad bug: please report it)", "")
            return self._tape_gradient(reason, target, sources, output_gradients,
                                       unconnected_gradients)
        if not tf_internals.tape_is_persistent(self):
            tf_internals.release_tape(self)
        # An unwatched variable is unconnected, so it gets what an unconnected x gets.
        unconnected = tf.UnconnectedGradients(unconnected_gradients)
        results = [
            unconnected_gradients_for([s], unconnected)[0] if skip else next(grads)
            for s, skip in zip(flat_sources, unwatched)
        ]
        return tf.nest.pack_sequence_as(sources, results)
