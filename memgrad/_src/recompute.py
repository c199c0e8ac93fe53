"""`recompute`: run a function without keeping its intermediates; recompute them in backprop.

The primitive behind `memgrad.recompute`, `memgrad.layers.Recompute`, the DenseNet-BC
bottleneck of the zoo and (its gate and forward-without-recording parts) `ReversibleSequence`.

Forward: ``fn`` runs under one ``tf.custom_gradient`` with the tape's recording switched
off, so an outer tape keeps only ``fn``'s inputs (and, eagerly, its outputs, which the
custom gradient holds). Keras variables ``fn`` assigns (seed generators, moving statistics)
are assigned once, and their earlier values kept (`replay.CaptureScope`).

Backward: the inputs are gated on the incoming gradient (a data dependency, plus control
dependencies), ``fn`` runs again under a tape inside a `replay.ReplayScope` (the same seeds
and statistics; no assignment kept), and the tape differentiates it for the inputs and the
variables ``fn`` read.
"""

from __future__ import annotations

import functools
import inspect

import keras
import tensorflow as tf

from memgrad._src import tf_internals
from memgrad._src.replay import ADVICE, CaptureScope, ReplayScope, find_stateful_random_op, snapshot


class Gate:
    """Makes tensors wait, in a graph, for prerequisites (usually an incoming gradient).

    The executor runs an op as soon as its inputs exist. A recomputation needs only
    forward tensors, so without a gate it would run right after the forward pass and hold
    its memory until backprop reached it. A gated tensor gets a control dependency on
    every prerequisite and, because XLA drops control edges, also a data dependency: a
    zero made from one element of the first prerequisite, NaN if that element is NaN, so
    no compiler can fold it away (XLA cannot prove ``x == x`` for a float). The gated
    tensor is also a new value, so a compiler cannot merge the recomputed ops reading it
    with the forward ops (common subexpressions). The zero is built once per gate, on first
    use. Eagerly code runs in program order: tensors come back unchanged.

    Args:
      prerequisites: a list of tensors (others are ignored); the first carries the data
        dependency.
    """

    def __init__(self, prerequisites):
        self.prerequisites = [p for p in prerequisites if isinstance(p, tf.Tensor)]
        self._zero = None
        self._waits = None

    def waits(self):
        """The control inputs a gated op takes: the prerequisites themselves, or, for more
        than one, a single op that runs after all of them. Every gated op then takes one
        control edge, not one per prerequisite: a segment with p ports behind q gradients
        adds p + q edges to the graph, not p x q (a 1,024-layer chain's 'memory' rewrite
        had 80,000 such edges, which Grappler and the executor's first run walked)."""
        if self._waits is None:
            if len(self.prerequisites) <= 1:
                self._waits = list(self.prerequisites)
            else:
                with tf.control_dependencies(self.prerequisites):
                    self._waits = [tf.no_op(name="gate")]
        return self._waits

    def __call__(self, t):
        """``t`` gated (a floating or complex tensor), or ``t`` itself (anything else)."""
        if tf.executing_eagerly() or not self.prerequisites:
            return t
        if not isinstance(t, tf.Tensor) or not (t.dtype.is_floating or t.dtype.is_complex):
            return t  # IndexedSlices, integer tensors, non-tensors: passed through
        if self._zero is None:
            first = self.prerequisites[0]
            token = tf.reduce_sum(tf.cast(tf.reshape(first, [-1])[:1], tf.float32))
            self._zero = tf.where(tf.equal(token, token), 0.0, float("nan"))
        with tf.control_dependencies(self.waits()):
            return t + tf.cast(self._zero, t.dtype)


def gate(tensors, prerequisites):
    """``tensors`` (a structure), made to wait for ``prerequisites`` in a graph (see `Gate`).

    Args:
      tensors: a structure of tensors (non-floating ones, IndexedSlices and ``None`` are
        passed through ungated).
      prerequisites: a list of tensors (others are ignored); the first carries the data
        dependency. With none, ``tensors`` come back unchanged.

    Returns:
      ``tensors``, same structure.
    """
    if tf.executing_eagerly():
        return tensors
    return tf.nest.map_structure(Gate(prerequisites), tensors)


def _differentiable(leaf):
    return (tf.is_tensor(leaf) and not isinstance(leaf, tf.Variable)
            and not isinstance(leaf, keras.KerasTensor)
            and (leaf.dtype.is_floating or leaf.dtype.is_complex))


def _name(fn):
    return getattr(fn, "name", None) or getattr(fn, "__qualname__", None) or type(fn).__name__


def _built(fn):
    """``False`` if ``fn`` is (a method of) a Keras layer not built yet."""
    layer = fn if isinstance(fn, keras.layers.Layer) else getattr(fn, "__self__", None)
    return not isinstance(layer, keras.layers.Layer) or layer.built


class _Recomputed:
    """The callable `recompute` returns (keeps per-signature check results)."""

    def __init__(self, fn, check_randomness):
        self.fn = fn
        self.check_randomness = check_randomness
        self._checked = set()
        functools.update_wrapper(self, fn, updated=())

    def __repr__(self):
        return f"memgrad.recompute({self.fn!r})"

    def __get__(self, instance, owner):  # decorating a method
        return self if instance is None else functools.partial(self.__call__, instance)

    def __call__(self, *args, **kwargs):
        fn = self.fn
        structure = (args, kwargs)
        flat = tf.nest.flatten(structure)
        positions = [i for i, leaf in enumerate(flat) if _differentiable(leaf)]

        def rebuild(xs):
            leaves = list(flat)
            for i, x in zip(positions, xs):
                leaves[i] = x
            return tf.nest.pack_sequence_as(structure, leaves)

        if not positions and not tf_internals.could_possibly_record():
            return fn(*args, **kwargs)
        if not _built(fn):
            # Keras defers initialising variables created in a stateless scope: the first
            # call builds the layer outside one and replays its non-trainable state.
            layer = fn if isinstance(fn, keras.layers.Layer) else fn.__self__
            state_of = _PreSnapshot(layer.non_trainable_variables)
        else:
            state_of = CaptureScope()
            with tf.init_scope():  # created outside the scope, where Keras initialises it
                tf_internals.keras_global_seed_generator()
        graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        ops_before = None if graph is None or not self.check_randomness else len(graph.get_operations())
        out_structure = []

        @tf.custom_gradient
        def recomputed(*xs):
            call_args, call_kwargs = rebuild(xs)
            with tf_internals.stop_recording():  # an outer tape must record nothing inside
                with state_of:
                    outputs = fn(*call_args, **call_kwargs)
            out_structure.append(outputs)
            state = state_of.state
            out_flat = tf.nest.flatten(outputs)
            tensor_out = [o for o in out_flat if tf.is_tensor(o)]

            def grad_fn(*d_outputs, variables=None):
                variables = list(variables or [])
                d_outputs = [tf.zeros_like(o) if d is None else d for o, d in zip(tensor_out, d_outputs)]
                gated = gate(list(xs), d_outputs)
                with tf.control_dependencies(None if tf.executing_eagerly() else d_outputs):
                    with ReplayScope(state), tf.GradientTape() as tape:
                        tape.watch(gated)
                        again_args, again_kwargs = rebuild(gated)
                        again = fn(*again_args, **again_kwargs)
                again_flat = [o for o in tf.nest.flatten(again) if tf.is_tensor(o)]
                if len(again_flat) != len(tensor_out):
                    raise ValueError(
                        f"memgrad.recompute: {_name(fn)} returned {len(tensor_out)} tensors in "
                        f"the forward pass but {len(again_flat)} when recomputed; it must be a "
                        "deterministic function of its inputs and variables.")
                grads = tape.gradient(again_flat, list(gated) + variables, output_gradients=d_outputs)
                input_grads, variable_grads = grads[: len(gated)], grads[len(gated):]
                # The input gradients (which start the previous block's recomputation) wait for
                # the weight gradients: otherwise the executor may put those off to the end of
                # backprop, keeping every block's recomputed activations alive.
                return gate(input_grads, variable_grads), variable_grads

            return tensor_out, grad_fn

        xs = [flat[i] for i in positions]
        tensor_out = recomputed(*xs)
        if self.check_randomness and tf_internals.could_possibly_record():
            self._check(args, kwargs, graph, ops_before, positions, flat)
        tensor_out = iter(tf.nest.flatten(tensor_out))
        out_flat = [next(tensor_out) if tf.is_tensor(o) else o
                    for o in tf.nest.flatten(out_structure[-1])]
        return tf.nest.pack_sequence_as(out_structure[-1], out_flat)

    def _check(self, args, kwargs, graph, ops_before, positions, flat):
        """Refuses stateful random ops: the recomputation would draw new numbers."""
        if graph is not None:  # traced: scan the ops the forward pass just added
            node = find_stateful_random_op(graph, graph.get_operations()[ops_before:])
        else:  # eager: trace once per signature into a scratch graph (never run)
            key = tuple((tuple(flat[i].shape.as_list()), flat[i].dtype.name) if i in positions else
                        _static_key(flat[i]) for i in range(len(flat)))
            if key in self._checked:
                return
            specs = [tf.TensorSpec(flat[i].shape, flat[i].dtype) for i in positions]
            structure = (args, kwargs)

            def forward(*xs):
                leaves = list(flat)
                for i, x in zip(positions, xs):
                    leaves[i] = x
                call_args, call_kwargs = tf.nest.pack_sequence_as(structure, leaves)
                with ReplayScope():  # assignments in a trace never run: keep none
                    return self.fn(*call_args, **call_kwargs)

            with tf_internals.stop_recording():
                scratch = tf.function(forward).get_concrete_function(*specs).graph
            node = find_stateful_random_op(scratch)
            if node is None:
                self._checked.add(key)
        if node is not None:
            raise ValueError(
                f"memgrad.recompute: {_name(self.fn)} draws random numbers with a stateful "
                "random op. The backward pass runs it again and expects the same result, but "
                f"such an op draws new numbers, so the gradients would be wrong. {ADVICE} or "
                "pass check_randomness=False if the result does not depend on the draw. "
                f"Received: {node.op} op '{node.name}'")


def _static_key(leaf):
    try:
        hash(leaf)
        return leaf
    except TypeError:
        return id(leaf)


class _PreSnapshot:
    """`CaptureScope`'s interface for a layer built during the call: its non-trainable
    variables that exist before the call, at their values before the call."""

    def __init__(self, variables):
        self._variables = list(variables)
        self.state = []

    def __enter__(self):
        self.state = snapshot(self._variables)
        return self

    def __exit__(self, *exc):
        return False


def recompute(fn, check_randomness=True):
    """Wraps ``fn`` so that backprop recomputes its intermediates instead of keeping them.

    The forward pass runs ``fn`` without the tape keeping anything inside it: an outer
    ``tf.GradientTape`` (eager or in a ``tf.function``) keeps only ``fn``'s inputs. The
    backward pass runs ``fn`` again under a tape, once the gradient of its output exists
    (in a graph the recomputation is gated on it by a data dependency, so it runs late in
    backprop, not right after the forward pass), and differentiates it. Gradients come out
    for the tensor inputs and for the trainable variables ``fn`` reads. The saving is
    ``fn``'s intermediates; the cost one more forward pass of ``fn``.

    The recomputation sees what the forward pass saw: Keras seed generators
    (``keras.layers.Dropout``, seeded or unseeded ``keras.random.*``) draw the same numbers,
    and BatchNormalization moving statistics are updated once, by the forward pass (the
    recomputation uses the same batch statistics and its assignments are discarded).
    ``tf.recompute_grad`` and ``keras.remat`` update them twice.

    Args:
      fn: a callable: a function, a Keras layer or model, a method. Its floating-point
        tensor arguments (anywhere in nested lists, tuples and dicts, positional or keyword)
        get gradients; other arguments (``training=True``, integer tensors, Python values)
        are passed as they are, to both runs.
      check_randomness: refuse ``fn`` if it draws with a stateful random op (checked when a
        tape could record: in a graph from the ops just traced; eagerly by tracing ``fn``
        once per input signature into a scratch graph).

    Returns:
      A callable with ``fn``'s signature returning ``fn``'s outputs (tensors, or nested
      structures with tensors and other values).

    Raises:
      TypeError: if ``fn`` is not callable.
      ValueError (when called): if ``fn`` draws with a stateful random op (``tf.random.uniform``,
        ``tf.nn.dropout``, ``tf.random.Generator``, ...), whose numbers the recomputation
        could not reproduce.

    Caveats:
      - ``fn`` must be deterministic given its inputs, its variables and Keras seed
        states. Raw ``tf.Variable`` assignments inside ``fn`` happen twice.
      - Pass ``training=`` explicitly when calling a Keras layer through ``recompute``
        inside another layer's ``call``: Keras's implicit training flag is not there when
        backprop recomputes (`memgrad.layers.Recompute` passes it for you).
      - Keras variables must not be created inside a call under a tape except by a layer's
        own build on its first call (``fn`` being that layer).
      - Under XLA (``jit_compile=True``) the recomputation's gate is a data dependency, which
        XLA keeps; the recomputed ops read the gated (new) values, so XLA cannot merge them
        with the forward ones, and the saving holds.
      - Eagerly, the custom gradient holds ``fn``'s outputs until backprop.

    Example:
      >>> import keras, tensorflow as tf, memgrad
      >>> block = keras.Sequential([keras.layers.Dense(256, activation="relu"),
      ...                           keras.layers.Dropout(0.1), keras.layers.Dense(64)])
      >>> block.build((None, 64))
      >>> block_fn = memgrad.recompute(block)
      >>> x = tf.random.normal([32, 64])
      >>> with tf.GradientTape() as tape:
      ...     loss = tf.reduce_sum(block_fn(x, training=True) ** 2)
      >>> grads = tape.gradient(loss, block.trainable_variables)
      >>> len(grads), all(g is not None for g in grads)
      (4, True)
    """
    if not callable(fn):
        raise TypeError(
            "memgrad.recompute expects a callable (a function, a Keras layer or a method). "
            f"Received: {fn!r} of type {type(fn).__name__}")
    if isinstance(fn, _Recomputed):
        return fn
    return _Recomputed(fn, bool(check_randomness))


def _accepts(call, name):
    try:
        parameters = inspect.signature(call).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


@keras.saving.register_keras_serializable(package="memgrad")
class Recompute(keras.layers.Wrapper):
    """A Keras layer that runs ``layer`` under `memgrad.recompute`.

    Backprop keeps only the wrapped layer's inputs and recomputes everything inside it
    when its output gradient arrives. Use it around blocks (a ``keras.Sequential`` of
    several layers, a residual block): recomputing a single cheap layer saves little.
    Dropout masks are replayed and BatchNormalization statistics are updated once.

    Args:
      layer: the Keras layer (or model) to recompute.
      check_randomness: see `memgrad.recompute`.
      **kwargs: Keras layer arguments.

    Returns (when called):
      What ``layer`` returns. The resolved ``training`` flag is passed on to ``layer``
      explicitly (if its ``call`` takes one), so the recomputation runs in the same mode.

    Raises:
      ValueError: if ``layer`` is not a Keras layer.

    Example:
      >>> import keras, memgrad
      >>> blocks = [memgrad.layers.Recompute(keras.Sequential([
      ...     keras.layers.Dense(256), keras.layers.BatchNormalization(),
      ...     keras.layers.ReLU(), keras.layers.Dropout(0.1)])) for _ in range(16)]
      >>> model = keras.Sequential([keras.Input((256,)), *blocks, keras.layers.Dense(10)])
      >>> model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
      >>> model.count_params() > 16 * 256 * 256
      True

    Caveats: those of `memgrad.recompute` (stateful TF random ops are refused).
    """

    def __init__(self, layer, check_randomness=True, **kwargs):
        if not isinstance(layer, keras.layers.Layer):
            raise ValueError(
                "memgrad.layers.Recompute wraps a Keras layer. "
                f"Received: {layer!r} of type {type(layer).__name__}")
        super().__init__(layer, **kwargs)
        self.check_randomness = bool(check_randomness)
        self._passes_training = _accepts(layer.call, "training")
        self._recomputed = recompute(layer, check_randomness=self.check_randomness)

    def build(self, input_shape=None):
        if not self.layer.built:
            self.layer.build(input_shape)
        self.built = True

    def call(self, inputs, *args, training=None, **kwargs):
        if self._passes_training:
            kwargs["training"] = training
        return self._recomputed(inputs, *args, **kwargs)

    def compute_output_shape(self, *args, **kwargs):
        return self.layer.compute_output_shape(*args, **kwargs)

    def compute_output_spec(self, *args, **kwargs):
        if not self._passes_training:
            kwargs.pop("training", None)
        return self.layer.compute_output_spec(*args, **kwargs)

    def get_config(self):
        return {**super().get_config(), "check_randomness": self.check_randomness}
