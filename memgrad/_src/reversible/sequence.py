"""`ReversibleSequence`: one custom gradient around a whole stack of reversible blocks."""

from __future__ import annotations

import math
import sys
import warnings

import keras
import tensorflow as tf

from memgrad._src import tf_internals
from memgrad._src.recompute import gate
from memgrad._src.replay import ReplayScope, snapshot
from memgrad._src.reversible import carry
from memgrad._src.reversible.base import ReversibleBlock, add_gradients, forward_output, layer_name
from memgrad._src.reversible.monitor import DriftMonitor
from memgrad._src.reversible.replay_check import check_replayable
from memgrad._src.reversible.stack_checks import (
    as_block, checked_invertible_dtype, positive_number, relative_error, sources_per_block,
    stack_dtype)


# The relative error ``max|inverse(forward(x)) - x| / max|x|`` a correct block may show, by the
# dtype of its invertible arithmetic. Measured on memgrad's blocks (couplings, ActNorm, 1x1
# convolution, Squeeze), 4 blocks of each kind at random weights: at most 1.4e-3 in float16,
# 7.6e-3 in bfloat16, 3.1e-7 in float32, 8.7e-16 in float64; a wrong inverse shows order 1.
_VERIFY_TOLERANCES = {"float16": 5e-2, "bfloat16": 1e-1, "float32": 1e-3, "float64": 1e-8}
# The batch of the synthetic input the check draws when it runs at tracing time.
_VERIFY_BATCH = 2


@keras.saving.register_keras_serializable(package="memgrad")
class ReversibleSequence(keras.layers.Layer):
    """A stack of reversible blocks whose activation memory does not grow with depth.

    The whole stack runs under one ``tf.custom_gradient``: the forward pass keeps
    only the stack's output, and the backward pass walks the blocks in reverse,
    rebuilding each block's input from its output and back-propagating through it
    (the couplings fuse both in one evaluation of their networks). Recomputation
    sees the same random seeds and normalisation statistics as the forward pass
    (dropout masks match) and never updates BatchNormalization statistics again.
    Randomness it cannot replay (stateful TF random ops, ``tf.random.Generator``,
    unseeded ``keras.random`` ops) is refused the first time a gradient could be taken.

    Args:
      blocks: a list of `ReversibleBlock` (e.g. `AdditiveCoupling`,
        `AffineCoupling`, `ActNorm`, `Invertible1x1Conv`, `Squeeze`,
        `ChannelPermutation`) or ``tfp.bijectors.Bijector`` instances.
      return_logdet: also return the summed log-determinant per example.
      check_reconstruction: keep the stack's input (costing its memory) and, in
        the backward pass, measure how far the rebuilt input drifted from it;
        warn when the relative drift exceeds ``reconstruction_tolerance`` or is
        NaN or infinite (eagerly a ``UserWarning``, in a graph a message on stderr).
      reconstruction_tolerance: the relative drift that triggers the warning.
      plain_backprop: run the same blocks with ordinary autodiff instead (every
        block's activations kept), to compare memory and time with the same weights.
      invertible_dtype: the dtype of the activations passed from block to block and of
        the blocks' invertible arithmetic (the couplings' add, subtract, multiply and
        divide, ActNorm, the 1x1 convolution); the networks inside the couplings still
        compute in their own dtype. ``"auto"`` (default): float64 under a float32 compute
        dtype, float32 under float16 or bfloat16 (a mixed-precision policy), when every
        block accepts it (memgrad's blocks do; tfp bijectors and custom blocks without
        ``accepts_invertible_dtype = True`` keep the compute dtype). Rounding in the
        inverse then stays far below the networks' own precision: 64 additive blocks of
        convolutions match plain autodiff to 4.1e-7 instead of 7.7e-5. Only the activations
        are wide: their gradients travel in the compute dtype widened to float32 (never wider
        than the activations), and
        consecutive couplings pass their channel halves on without joining them; the
        output is kept as the returned float32 output and a float32 residual. The cost is
        the width of the rebuilt block's halves, not growing with depth (measured: 27.1 MiB
        requested at the peak against 24.0 MiB with a float32 carry, for a 4 MiB float64
        stack activation). Pass the compute dtype to turn it off.
      drift_monitor: a `DriftMonitor` (or ``True`` for ``DriftMonitor()``, one step in 100)
        that measures every block's reconstruction drift on some training steps, reports
        it per block and warns on NaN/inf or drift above its tolerance; ``None``: off.
      verify_inverse: check once that every block's `inverse` undoes its `forward` (the
        backward pass trusts it: a wrong inverse gives wrong gradients, silently). On the
        first call that could be differentiated (under a ``GradientTape``, eager or traced,
        e.g. the first step of ``fit``), and again on the first such call after weights are
        loaded (``load_weights``, ``keras.saving.load_model``), each block runs
        ``forward`` then ``inverse`` in inference mode (``training=False``: no dropout, no
        statistics updated; every assignment, ActNorm's data initialisation included, is
        discarded), and a relative error ``max|inverse(forward(x)) - x| / max|x|`` above
        the tolerance raises a ``ValueError`` naming the block. ``True`` (default): the
        tolerance by the dtype of the invertible arithmetic (float16 5e-2, bfloat16 1e-1,
        float32 1e-3, float64 1e-8; memgrad's blocks, 4 of each kind at random weights,
        show at most 1.4e-3, 7.6e-3, 3.1e-7 and 8.7e-16); a positive number: that tolerance; ``False``: no check. Eagerly the
        check runs on the call's own input; when the first such call is traced into a
        ``tf.function`` (``fit``), it runs at tracing time, outside the graph, on a
        standard-normal input of the traced shape with batch 2, and is put off to the next
        call (eager or traced) when a non-batch dimension is unknown or when the stack was
        built in that same trace (its variables hold no value until the function runs). Blocks whose
        activations are not finite end the check without a verdict. Blocks with
        ``inverse_checked = False`` (`BijectorBlock`: tfp's inverses, and a training-mode
        tfp BatchNormalization updates its statistics on every forward) are skipped.
        Not run with
        ``plain_backprop=True``, which never inverts. Cost: one forward and one inverse of
        the stack, once. Measured on a shared 2-core CPU, 8 additive blocks of 3x3
        convolutions on a [32, 16, 16, 32] batch: the check takes 0.24 s of the first eager
        step (0.7-1.2 s with it, 0.4-0.9 s without), 0.12-0.16 s of the first
        ``tf.function`` step (traced: 1.1-1.3 s either way), and nothing afterwards (later
        steps 0.22-0.32 s eager, 0.06 s traced, with or without it).
      **kwargs: Keras layer arguments. Without ``dtype``, a stack whose tfp
        bijectors fix a dtype (built from float64 tensors, say) takes theirs, and a stack
        whose blocks' networks all compute in float64 (their innermost layers', even inside
        a dtype-less ``keras.Sequential``) is a float64 stack. Each coupling's networks
        compute in their own layers' dtype, not their container's.

    Raises:
      ValueError: if the tfp bijectors fix different dtypes, or one other than ``dtype``;
        if ``reconstruction_tolerance`` (or a numeric ``verify_inverse``) is not a positive,
        finite number.

    Returns (when called):
      ``y``, or ``(y, logdet)`` with ``return_logdet=True``.

    Raises (when called):
      TypeError: for inputs that are neither floating, integer nor bool (strings, complex
        numbers); integer and bool inputs are cast to the compute dtype, as Keras layers do.
      ValueError: with ``verify_inverse`` on, on the first call under a ``GradientTape``
        (and the first after weights are loaded), if a block's ``inverse(forward(x))``
        differs from ``x`` by more than the tolerance; the message names the block and
        the measured error.
      ValueError: on the first call per training mode under a ``GradientTape``
        (eager or traced), if a block's forward pass draws random numbers the
        backward recomputation would draw differently: a stateful random op
        (``tf.random.uniform``, ``tf.nn.dropout``, ``tf.random.Generator``, ...,
        even with an op-level seed) or a Keras seed generator the block does not
        own (``keras.random.*`` without a seed). Use stateless seeded ops, or a
        ``keras.random.SeedGenerator`` kept as an attribute of the block's layers
        (``keras.layers.Dropout`` has one), whose state is replayed. The check
        traces each block once, about 20-40 ms per block on a CPU.

    Example:
      >>> from memgrad.layers import AdditiveCoupling
      >>> half = 32
      >>> stack = ReversibleSequence([
      ...     AdditiveCoupling(keras.layers.Dense(half, activation="relu"),
      ...                      keras.layers.Dense(half, activation="relu"))
      ...     for _ in range(16)])
      >>> model = keras.Sequential([keras.Input((2 * half,)), stack, keras.layers.Dense(10)])
      >>> model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    """

    def __init__(self, blocks, return_logdet=False, check_reconstruction=False,
                 reconstruction_tolerance=1e-3, plain_backprop=False, invertible_dtype="auto",
                 drift_monitor=None, verify_inverse=True, **kwargs):
        if isinstance(blocks, (ReversibleBlock, keras.layers.Layer)) or not hasattr(blocks, "__iter__"):
            raise ValueError(
                f"ReversibleSequence expects a list of blocks. Received: {blocks!r}"
            )
        blocks = list(blocks)
        if not blocks:
            raise ValueError("ReversibleSequence needs at least one block. Received: []")
        blocks = [as_block(block, index) for index, block in enumerate(blocks)]
        kwargs["dtype"] = stack_dtype(blocks, kwargs.get("dtype"))
        super().__init__(**kwargs)
        self.blocks = blocks
        self.return_logdet = bool(return_logdet)
        self.check_reconstruction = bool(check_reconstruction)
        self.reconstruction_tolerance = positive_number("reconstruction_tolerance",
                                                         reconstruction_tolerance)
        if not isinstance(verify_inverse, bool):
            verify_inverse = positive_number("verify_inverse", verify_inverse)
        self.verify_inverse = verify_inverse
        self._inverse_verified = False
        self.plain_backprop = bool(plain_backprop)
        self.invertible_dtype = checked_invertible_dtype(blocks, invertible_dtype, self.compute_dtype)
        # What get_config saves: "auto" follows the compute dtype of the stack it is loaded into.
        self._invertible_dtype_config = "auto" if invertible_dtype in (None, "auto") else self.invertible_dtype
        if drift_monitor is True:
            drift_monitor = DriftMonitor()
        elif isinstance(drift_monitor, dict):  # from get_config
            drift_monitor = DriftMonitor(**drift_monitor)
        elif drift_monitor is not None and not isinstance(drift_monitor, DriftMonitor):
            raise ValueError(
                "ReversibleSequence drift_monitor must be a memgrad.layers.DriftMonitor, True or "
                f"None. Received: {drift_monitor!r}"
            )
        if drift_monitor is not None:
            drift_monitor.attach(self.name, len(blocks))
        self.drift_monitor = drift_monitor
        self.last_reconstruction_error = None
        self._replay_checked = set()  # training modes whose blocks check_replayable has passed

    def build(self, input_shape):
        shape = tuple(input_shape)
        for block in self.blocks:
            if not block.built:
                block.build(shape)
            shape = tuple(block.compute_output_shape(shape))
        # The monitor's state, created now rather than while a step is traced: a first call
        # that creates variables is traced twice. Under a strategy's scope they are left to
        # the first traced step, as before: made here they worked under MirroredStrategy, but
        # were not tried with several workers.
        if self.drift_monitor is not None and not tf.distribute.has_strategy():
            self.drift_monitor.build()
        super().build(input_shape)

    def compute_output_shape(self, input_shape):
        shape = tuple(input_shape)
        for block in self.blocks:
            shape = tuple(block.compute_output_shape(shape))
        return (shape, (input_shape[0],)) if self.return_logdet else shape

    def compute_output_spec(self, inputs, training=None):
        dtype = keras.backend.standardize_dtype(inputs.dtype)
        if dtype == "string" or dtype.startswith("complex"):
            raise self._dtype_error("inputs", dtype)
        shape = self.compute_output_shape(inputs.shape)
        if self.return_logdet:
            return (keras.KerasTensor(shape[0], dtype=self.compute_dtype),
                    keras.KerasTensor(shape[1], dtype=self.compute_dtype))
        return keras.KerasTensor(shape, dtype=self.compute_dtype)

    def _floating_input(self, inputs, argument="inputs"):
        """``inputs`` as a floating tensor: integers and booleans cast to the compute dtype.

        Keras layers cast integer and boolean inputs to their compute dtype; the invertible
        arithmetic has no meaning for strings or complex numbers, refused by name.
        """
        if not tf.is_tensor(inputs):
            inputs = tf.convert_to_tensor(inputs)
        dtype = tf.as_dtype(inputs.dtype)
        if dtype.is_floating:
            return inputs
        if dtype.is_integer or dtype == tf.bool:
            return tf.cast(inputs, self.compute_dtype)
        raise self._dtype_error(argument, dtype.name)

    def _dtype_error(self, argument, dtype):
        """The TypeError for ``argument`` of a dtype the stack cannot compute with."""
        return TypeError(
            f"{layer_name(self)} expects {argument} of a floating dtype (it computes in "
            f"{self.compute_dtype}; integer and bool inputs are cast to it). Received: "
            f"{argument} of dtype {dtype}"
        )

    def call(self, inputs, training=None):
        inputs = self._floating_input(inputs)
        if self.plain_backprop:
            y, logdet = self._run_plain(inputs, training)
        else:
            y, logdet = self._run(inputs, training)
        return (y, logdet) if self.return_logdet else y

    def inverse(self, outputs, training=None):
        """Maps the stack's output back to its input (no gradient bookkeeping).

        Args:
          outputs: a tensor shaped like the stack's output.
          training: Keras training flag for the inner layers.

        Returns:
          The input that produces ``outputs``.
        """
        outputs = self._floating_input(outputs, "outputs")
        h = tf.cast(tf.cast(outputs, self.compute_dtype), self.invertible_dtype)
        for block in reversed(self.blocks):
            h = block.inverse(h, training=training)
        return tf.cast(h, self.compute_dtype)

    def _run_plain(self, x, training):
        h = tf.cast(x, self.invertible_dtype)
        logdet = tf.zeros(tf.shape(x)[:1], dtype=h.dtype)
        for block in self.blocks:
            h, block_logdet = forward_output(block, block.forward(h, training=training))
            logdet = logdet + tf.cast(block_logdet, logdet.dtype)
        return tf.cast(h, x.dtype), tf.cast(logdet, x.dtype)

    def load_own_variables(self, store):
        super().load_own_variables(store)
        self._inverse_verified = False  # loaded weights: check the inverses again

    def _variables_initialized(self):
        """Eagerly: whether every variable has a value (not so while the trace that built it runs)."""
        for variable in self.variables:
            inner = tf_internals.backend_variable(variable)
            check = getattr(inner, "is_initialized", None)
            if check is not None and not bool(check()):
                return False
        return True

    def _verify_inverses(self, x):
        """`verify_inverse`'s check: raises if a block's inverse does not undo its forward."""
        if tf.executing_eagerly():
            h = tf.cast(x, self.invertible_dtype)
        else:  # traced: eager values are unavailable; check outside the graph on a drawn input
            shape = x.shape
            if shape.rank is None or any(d is None for d in shape[1:]):
                return  # tried again on the next trace
            batch = _VERIFY_BATCH if shape[0] is None else shape[0]
            with tf.init_scope():
                if not self._variables_initialized():
                    return  # built in this trace: its variables hold values once it runs
                h = tf.random.stateless_normal([batch] + list(shape[1:]), seed=[4, 2],
                                               dtype=self.invertible_dtype)
        with tf.init_scope(), tf_internals.stop_recording():
            for index, block in enumerate(self.blocks):
                if not getattr(block, "inverse_checked", True):
                    # Not checked, nor run (its forward may change state no scope discards):
                    # the next block is checked on a drawn input of the right shape.
                    shape = [d if d is not None else _VERIFY_BATCH
                             for d in block.compute_output_shape(tuple(h.shape))]
                    h = tf.random.stateless_normal(shape, seed=[4, index], dtype=h.dtype)
                    continue
                tolerance = (self.verify_inverse if self.verify_inverse is not True
                             else _VERIFY_TOLERANCES.get(tf.as_dtype(h.dtype).name, 1e-3))
                # As in the backward pass: the inverse sees the forward-time values of the
                # block's replayed state (seeds, statistics) and its other variables as the
                # forward left them (ActNorm's data initialisation). Every assignment is
                # discarded with the scopes.
                state = snapshot(block.replayed_state())
                with ReplayScope(state) as forward_scope:
                    y, _ = forward_output(block, block.forward(h, training=False))
                replayed = {id(v) for v, _ in state}
                assigned = forward_scope.state_mapping
                state += [(v, assigned[id(v)]) for v in block.variables
                          if id(v) in assigned and id(v) not in replayed]
                with ReplayScope(state):
                    rebuilt = block.inverse(y, training=False)
                error = relative_error(rebuilt, h)
                if not math.isfinite(error):
                    break  # activations overflowed or the input holds NaN/inf: no verdict
                if error > tolerance:
                    raise ValueError(
                        f"{layer_name(block)} (block {index} of {layer_name(self)}) does not "
                        f"invert its forward pass: inverse(forward(x)) differs from x by a "
                        f"relative error of {error:.3g}, above the tolerance {tolerance:g} for "
                        f"{tf.as_dtype(h.dtype).name}. The backward pass rebuilds every block's "
                        "input with its inverse, so the gradients would be wrong. Fix the "
                        "block's inverse; if its error is expected, pass a larger tolerance "
                        "(ReversibleSequence(..., verify_inverse=1e-2)) or turn the check off "
                        f"with verify_inverse=False. Received: relative error {error:.3g}"
                    )
                h = y
        self._inverse_verified = True

    def _run(self, x, training):
        blocks = self.blocks
        sequence = self
        # check_replayable traces every block, so it runs once per training mode (Dropout draws
        # only in training), and only when a tape could ask for the gradient: randomness the
        # recomputation cannot replay breaks the gradient, not the forward pass.
        mode = "tensor" if tf.is_tensor(training) else (None if training is None else bool(training))
        block_inputs = [] if mode not in self._replay_checked and tf_internals.could_possibly_record() else None

        monitor = self.drift_monitor
        checked = False
        if monitor is not None and tf_internals.could_possibly_record():
            checked = monitor.step_is_checked()

        @tf.custom_gradient
        def reversible_stack(stack_input):
            with tf_internals.stop_recording():  # an outer tape must record nothing inside
                # Activations travel in the invertible dtype; only the stack's ends are cast.
                replay_states, saved_for_backward, fingerprints = [], [], []
                h = tf.cast(stack_input, sequence.invertible_dtype)
                logdet = tf.zeros(tf.shape(stack_input)[:1], dtype=h.dtype)
                for index, block in enumerate(blocks):
                    if checked is not False:
                        fingerprints.append(monitor.fingerprint(h, index, checked))
                    if block_inputs is not None:
                        block_inputs.append(carry.carried_spec(h))
                    replay_states.append(snapshot(block.replayed_state()))
                    h, block_logdet, saved = carry.forward(block, h, training)
                    saved_for_backward.append(saved)
                    logdet = logdet + tf.cast(block_logdet, logdet.dtype)
            outer_dtype = stack_input.dtype
            # The backward pass starts from the output in the invertible dtype (as halves after
            # a coupling); in float64, kept as the returned float32 output and a residual.
            kept_output, returned = carry.keep_output(h, carry.cast(h, outer_dtype))
            del h
            kept_input = stack_input if sequence.check_reconstruction else None
            # Activations' gradients travel in a dtype of their own (float32 around float64
            # activations): only rebuilding the inputs needs the wide one.
            grad_dtype = carry.gradient_dtype(sequence.invertible_dtype, outer_dtype)

            def grad_fn(d_output, d_logdet=None, variables=None):
                variables = list(variables or [])
                output = carry.restore_output(kept_output)
                if d_output is None:
                    d_h = tf.nest.map_structure(lambda t: tf.zeros(tf.shape(t), grad_dtype), output)
                else:  # an IndexedSlices (a loss that gathers rows of the output) made dense
                    d_h = tf.cast(tf.convert_to_tensor(d_output), grad_dtype)
                    d_h = carry.halves(d_h) if carry.is_pair(output) else d_h
                d_logdet = tf.zeros_like(logdet) if d_logdet is None else tf.cast(d_logdet, logdet.dtype)
                variable_grads = [None] * len(variables)
                sources = sources_per_block(blocks, variables)
                h, done = output, tf.nest.flatten(d_h)
                del output
                drifts, nonfinite = [], []
                for index in reversed(range(len(blocks))):
                    block, state, saved, indices = (blocks[index], replay_states[index],
                                                    saved_for_backward[index], sources[index])
                    # The block's reconstruction and backprop wait for the previous block's
                    # input and weight gradients (data dependency on the first): without it,
                    # reconstructions would run right after the forward pass and weight
                    # gradients be put off to the end, and memory would grow with depth. The
                    # incoming gradient waits too: a half of it that is ready early (an affine
                    # coupling's dx2) would otherwise start this block's backprop (dy2 times a
                    # network's weights, a hidden-sized product) and hold it.
                    h, d_h = gate((h, d_h), done)
                    done = None  # eagerly, it would keep the incoming gradient's halves alive
                    # Only blocks that saved something take `saved`: custom blocks may override
                    # backward with the original signature.
                    extra = {} if saved is None else {"saved": saved}
                    # Replays the forward's seeds and statistics; discards any assignment.
                    block_variables = [variables[i] for i in indices]
                    carried, h, d_h = [h, d_h], None, None  # eagerly, the block releases what it has used
                    with ReplayScope(state):
                        h, d_h, grads = carry.backward(block, carried, d_logdet, block_variables,
                                                       training, extra)
                    done = list(tf.nest.flatten(d_h)) + [g for g in grads if g is not None]
                    for i, grad in zip(indices, grads):
                        variable_grads[i] = add_gradients([variable_grads[i]], [grad])[0]
                    if checked is not False:
                        drift, bad = monitor.compare(h, d_h, fingerprints[index], index, checked)
                        drifts.insert(0, drift)
                        nonfinite.insert(0, bad)
                h, d_h = carry.whole(h), carry.whole(d_h)
                if checked is not False:
                    d_h = monitor.report(drifts, nonfinite, h.dtype, d_h, checked)
                if kept_input is not None:
                    d_h = sequence._report_drift(h, tf.cast(kept_input, h.dtype), d_h)
                return tf.cast(d_h, outer_dtype), variable_grads

            return (returned, tf.cast(logdet, outer_dtype)), grad_fn

        outputs = reversible_stack(x)
        if block_inputs is not None:
            for index, spec in enumerate(block_inputs):
                check_replayable(self, index, spec, training)
            self._replay_checked.add(mode)
        # After the replay check: randomness the recomputation cannot replay is named as such,
        # not as a wrong inverse.
        if (self.verify_inverse is not False and not self._inverse_verified
                and tf_internals.could_possibly_record()):
            self._verify_inverses(x)
        return outputs

    def _report_drift(self, rebuilt, original, gradient):
        error = tf.abs(tf.cast(rebuilt - original, tf.float32))
        drift = tf.reduce_max(error) / (tf.reduce_max(tf.abs(tf.cast(original, tf.float32))) + 1e-12)
        # Not every reduce_max kernel propagates NaN (tensorflow/tensorflow#13046): make sure a
        # NaN element shows in the measured drift.
        drift = tf.where(tf.reduce_any(tf.math.is_nan(error)), float("nan"), drift)
        too_far = (
            f"memgrad: {layer_name(self)} rebuilt its input with a relative error above "
            f"{self.reconstruction_tolerance:g}; gradients may be inaccurate (use fewer blocks, "
            "float64, additive coupling, or a bounded scale)."
        )
        not_finite = (
            f"memgrad: {layer_name(self)} rebuilt its input with a NaN or infinite error (an "
            "inverse overflowed, or the input itself holds NaN or inf); gradients are unusable "
            "(use float64, a bounded scale such as AffineCoupling(scale='sigmoid'), or a smaller "
            "learning rate)."
        )
        if tf.executing_eagerly():
            self.last_reconstruction_error = float(drift)
            # NaN compares False with any tolerance, so it is tested for on its own.
            if not math.isfinite(self.last_reconstruction_error):
                warnings.warn(f"{not_finite} Measured: {self.last_reconstruction_error}", stacklevel=2)
            elif self.last_reconstruction_error > self.reconstruction_tolerance:
                warnings.warn(f"{too_far} Measured: {self.last_reconstruction_error:.3g}", stacklevel=2)
            return gradient
        finite = tf.math.is_finite(drift)

        def warn():
            message = tf.where(finite, too_far, not_finite)
            with tf.control_dependencies([tf.print(message, "Measured:", drift, output_stream=sys.stderr)]):
                return tf.constant(True)

        exceeded = tf.logical_or(tf.logical_not(finite), drift > self.reconstruction_tolerance)
        printed = tf.cond(exceeded, warn, lambda: tf.constant(False))
        with tf.control_dependencies([printed]):
            return tf.identity(gradient)

    def get_config(self):
        config = super().get_config()
        config.update(
            blocks=[keras.saving.serialize_keras_object(block) for block in self.blocks],
            return_logdet=self.return_logdet,
            check_reconstruction=self.check_reconstruction,
            reconstruction_tolerance=self.reconstruction_tolerance,
            plain_backprop=self.plain_backprop,
            invertible_dtype=self._invertible_dtype_config,
            drift_monitor=None if self.drift_monitor is None else self.drift_monitor.get_config(),
            verify_inverse=self.verify_inverse,
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["blocks"] = [keras.saving.deserialize_keras_object(b) for b in config["blocks"]]
        return cls(**config)
