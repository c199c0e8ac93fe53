"""`DriftMonitor`: how far a reversible stack's rebuilt activations drift, block by block.

The backward pass of a `ReversibleSequence` rebuilds each block's input from its output;
rounding makes the rebuilt input differ from the one the forward pass saw, and the
gradients inherit the difference. Keeping every input to compare against would cost the
memory the stack saves. The monitor keeps a fingerprint instead: on a checked step the
forward pass projects each block's input on a few fixed random directions (``projections``
numbers per example, plus its norm), and the backward pass projects the rebuilt input on the
same directions. For a random Gaussian direction ``r``, ``r . (rebuilt - original)`` has the
spread of ``||rebuilt - original||``, so the root mean square over the directions, divided by
the input's norm, estimates the relative drift of each block's input. The cost is a few
multiply-adds per activation element, on one step in ``every``.
"""

from __future__ import annotations

import math
import sys
import warnings

import numpy as np
import tensorflow as tf

from memgrad._src.reversible import carry

# Relative drift past which the monitor warns, by the stack's invertible dtype. Carried in
# float64 the rebuilt activations drift by ~1e-15; past 1e-5 something else is wrong (a block
# whose inverse is not exact, weights changed between forward and backward). Carried in
# float32 (under float16/bfloat16 policies, or by choice) 64 convolutional additive blocks
# drift by ~1e-4 with gradients ~1e-4 off (scripts/drift_table.py): warn at 1e-3.
DEFAULT_TOLERANCES = {"float64": 1e-5, "float32": 1e-3, "float16": 1e-2, "bfloat16": 1e-1}


class DriftWarning(UserWarning):
    """A reversible stack rebuilt an activation too far from the original, or as NaN or inf."""


class DriftMonitor:
    """Measures, every ``every`` training steps, how far each block's rebuilt input drifts.

    Give one to a `ReversibleSequence` (``ReversibleSequence(blocks, drift_monitor=...)``).
    On a checked step it reports, per block, the estimated relative error
    ``||rebuilt input - forward input|| / ||forward input||`` (largest over the batch) in
    `errors`, and whether the rebuilt input or the gradient reaching that block holds NaN or
    inf in `nonfinite`. It warns (a `DriftWarning` eagerly; a line on stderr inside a
    ``tf.function``) when an error exceeds the tolerance or anything is not finite. Steps it
    does not check cost nothing; a checked one costs ``projections + 1`` multiply-adds per
    activation element per block in each direction, and ``(projections + 1) x batch`` numbers
    per block held from the forward to the backward pass.

    Args:
      every: check one step in ``every`` (the first step is checked). 1 checks every step.
      tolerance: the relative drift that triggers a warning; ``None`` picks it from the
        stack's invertible dtype (1e-5 for float64, 1e-3 for float32).
      projections: random directions per block (more: a tighter estimate).
      seed: seed of the random directions.

    Returns (its attributes, after a checked step):
      ``errors``: a numpy array, one relative drift per block (forward order), or ``None``
      before the first check; ``nonfinite``: a numpy bool array, one per block;
      ``checks``: how many steps were checked. A step run inside a ``tf.function`` updates
      them when read.

    Raises:
      ValueError: on a non-positive ``every``, ``projections`` or ``tolerance``.

    Example:
      >>> import keras
      >>> from memgrad.layers import AdditiveCoupling, DriftMonitor, ReversibleSequence
      >>> monitor = DriftMonitor(every=1)
      >>> stack = ReversibleSequence([AdditiveCoupling(keras.layers.Dense(4), keras.layers.Dense(4))
      ...                             for _ in range(3)], drift_monitor=monitor)
      >>> x = tf.random.normal([2, 8])
      >>> with tf.GradientTape() as tape:
      ...     tape.watch(x)
      ...     loss = tf.reduce_sum(stack(x))
      >>> _ = tape.gradient(loss, x)
      >>> monitor.errors.shape
      (3,)
    """

    def __init__(self, every=100, tolerance=None, projections=4, seed=0):
        for name, value in (("every", every), ("projections", projections)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"DriftMonitor {name} must be a positive int. Received: {value!r}")
        if tolerance is not None and not (isinstance(tolerance, (int, float)) and tolerance > 0):
            raise ValueError(f"DriftMonitor tolerance must be a positive number or None. Received: {tolerance!r}")
        self.every = int(every)
        self.tolerance = None if tolerance is None else float(tolerance)
        self.projections = int(projections)
        self.seed = int(seed)
        self.stack_name = None
        self.depth = None
        self._eager_checks = 0
        self._graph_checks_seen = 0
        self._calls = 0  # eager steps seen
        self._errors = None  # eager results
        self._nonfinite = None
        self._state = None  # graph: step counter and results as tf.Variables

    def get_config(self):
        """The constructor arguments, for `ReversibleSequence.get_config`."""
        return {"every": self.every, "tolerance": self.tolerance, "projections": self.projections,
                "seed": self.seed}

    def __repr__(self):
        return f"DriftMonitor({', '.join(f'{k}={v!r}' for k, v in self.get_config().items())})"

    # -- wiring, called by ReversibleSequence -------------------------------------------------

    def attach(self, stack_name, depth):
        """Binds the monitor to one stack of ``depth`` blocks (a monitor watches one stack)."""
        if self.stack_name is not None and (self.stack_name, self.depth) != (stack_name, depth):
            raise ValueError(
                "A DriftMonitor watches one ReversibleSequence; give each stack its own. "
                f"Received: a monitor of '{self.stack_name}' for '{stack_name}'"
            )
        self.stack_name, self.depth = stack_name, depth

    def tolerance_for(self, dtype):
        """The tolerance in force for a stack whose activations are carried in ``dtype``."""
        if self.tolerance is not None:
            return self.tolerance
        return DEFAULT_TOLERANCES.get(tf.as_dtype(dtype).name, 1e-3)

    def build(self):
        """Creates the variables a step checked inside a ``tf.function`` writes to.

        `ReversibleSequence.build` calls it outside any distribution strategy, so that a
        ``tf.function`` over the stack (a custom loop, Keras's ``fit``) creates no variable
        on its first call and is traced once, not twice. Under a strategy's scope it is left
        to the first traced step, as before (a mirrored variable there too).
        """
        if self.depth is not None:
            self._graph_state()

    def _graph_state(self):
        if self._state is None:
            with tf.init_scope():  # created once, outside any function being traced
                self._state = {
                    "step": tf.Variable(0, dtype=tf.int64, trainable=False, name="drift_step"),
                    "checks": tf.Variable(0, dtype=tf.int64, trainable=False, name="drift_checks"),
                    "errors": tf.Variable(tf.fill([self.depth], tf.constant(float("nan"), tf.float64)),
                                          trainable=False, name="drift_errors"),
                    "nonfinite": tf.Variable(tf.zeros([self.depth], tf.bool), trainable=False,
                                             name="drift_nonfinite"),
                }
        return self._state

    def step_is_checked(self):
        """Counts a step; returns whether it is checked (a bool eagerly, a bool tensor in a graph)."""
        if tf.executing_eagerly():
            checked = self._calls % self.every == 0
            self._calls += 1
            return checked
        state = self._graph_state()
        step = state["step"].assign_add(1, read_value=True) - 1
        return tf.equal(step % self.every, 0)

    def _directions(self, shape, index):
        size = int(np.prod(shape))
        return tf.random.stateless_normal([size, self.projections], seed=[self.seed, index], dtype=tf.float64)

    def _project(self, h, index):
        h = carry.whole(h)
        flat = tf.reshape(tf.cast(h, tf.float64), [tf.shape(h)[0], -1])
        return tf.matmul(flat, self._directions(h.shape[1:], index))

    def fingerprint(self, h, index, checked):
        """``[batch, projections + 1]``: block ``index``'s input projected, and its norm."""
        def compute():  # joins a pair of halves here, on checked steps only
            whole = carry.whole(h)
            flat = tf.reshape(tf.cast(whole, tf.float64), [tf.shape(whole)[0], -1])
            return tf.concat([self._project(whole, index), tf.norm(flat, axis=1, keepdims=True)], axis=1)

        if isinstance(checked, bool):
            return compute() if checked else None
        return tf.cond(checked, compute, lambda: tf.zeros([tf.shape(tf.nest.flatten(h)[0])[0], self.projections + 1], tf.float64))

    def compare(self, rebuilt, gradient, fingerprint, index, checked):
        """``(relative drift, not finite)`` of block ``index``'s rebuilt input, as scalar tensors."""
        def compute():
            projected = self._project(rebuilt, index)
            original, norm = fingerprint[:, :-1], fingerprint[:, -1]
            spread = tf.sqrt(tf.reduce_mean(tf.square(projected - original), axis=1))
            drift = tf.reduce_max(spread / (norm + 1e-300))
            finite = tf.logical_and(tf.reduce_all(tf.math.is_finite(projected)),
                                    tf.reduce_all(tf.math.is_finite(self._project(gradient, index))))
            return drift, tf.logical_not(finite)

        if isinstance(checked, bool):
            return compute() if checked else None
        return tf.cond(checked, compute, lambda: (tf.constant(0.0, tf.float64), tf.constant(False)))

    def report(self, drifts, nonfinite, dtype, gradient, checked):
        """Records one checked step's per-block results and warns; returns ``gradient``, gated on it.

        Args:
          drifts: per-block drift scalars, in forward order.
          nonfinite: per-block bool scalars.
          dtype: the stack's invertible dtype (picks the default tolerance).
          gradient: the stack's input gradient, returned after the report ran.
          checked: whether this step was checked (bool, or a bool tensor in a graph).
        """
        tolerance = self.tolerance_for(dtype)
        if isinstance(checked, bool) and checked and not tf.executing_eagerly():
            # The forward pass ran eagerly and its gradient is being traced: a Jacobian's pfor,
            # which cannot vectorise the variable updates of a report. Nothing is recorded.
            return gradient
        if isinstance(checked, bool):
            if not checked:
                return gradient
            self._errors = np.array([float(d) for d in drifts])
            self._nonfinite = np.array([bool(n) for n in nonfinite])
            self._eager_checks += 1
            self._warn_eagerly(tolerance)
            return gradient
        state = self._graph_state()

        def record():
            errors, flags = tf.stack(drifts), tf.stack(nonfinite)
            # NaN compares False with any tolerance: a NaN drift counts as not finite.
            flags = tf.logical_or(flags, tf.logical_not(tf.math.is_finite(errors)))
            assigned = [state["errors"].assign(errors), state["nonfinite"].assign(flags),
                        state["checks"].assign_add(1)]
            worst = tf.argmax(tf.where(tf.math.is_finite(errors), errors, tf.zeros_like(errors)))
            too_far = tf.reduce_any(errors > tolerance)
            with tf.control_dependencies(assigned):
                printed = tf.cond(
                    tf.reduce_any(flags),
                    lambda: self._print(f"memgrad: DriftWarning: {self._where()} rebuilt NaN or inf "
                                        "activations or gradients; first such block (forward order):",
                                        tf.argmax(tf.cast(flags, tf.int32))),
                    lambda: tf.cond(too_far, lambda: self._print(
                        f"memgrad: DriftWarning: {self._where()} rebuilt an activation with a relative "
                        f"drift above {tolerance:g}; worst block and drift:", worst, tf.reduce_max(errors)),
                        lambda: tf.constant(False)))
            return printed

        done = tf.cond(checked, record, lambda: tf.constant(False))
        with tf.control_dependencies([done]):
            return tf.identity(gradient)

    @staticmethod
    def _print(*parts):
        with tf.control_dependencies([tf.print(*parts, output_stream=sys.stderr)]):
            return tf.constant(True)

    def _where(self):
        return f"ReversibleSequence '{self.stack_name}'"

    def _warn_eagerly(self, tolerance):
        if self._nonfinite.any():
            blocks = np.flatnonzero(self._nonfinite).tolist()
            warnings.warn(
                f"memgrad: {self._where()} rebuilt NaN or inf activations or gradients at blocks "
                f"{blocks} (forward order); the gradients are unusable (lower the learning rate, "
                "check the input for NaN, or use a bounded scale such as AffineCoupling(scale='sigmoid')). "
                f"Per-block drift: {self._errors.tolist()}", DriftWarning, stacklevel=4)
            return
        worst = int(np.argmax(self._errors))
        if self._errors[worst] > tolerance:
            warnings.warn(
                f"memgrad: {self._where()} rebuilt block {worst}'s input with a relative drift of "
                f"{self._errors[worst]:.3g}, above the tolerance {tolerance:g}; gradients may be "
                "inaccurate (use invertible_dtype='float64', fewer blocks, or a bounded affine scale). "
                f"Per-block drift (forward order): {[float(f'{e:.3g}') for e in self._errors]}",
                DriftWarning, stacklevel=4)

    # -- results ------------------------------------------------------------------------------

    def _refresh(self):
        # Steps checked inside a tf.function leave their results in variables.
        if self._state is not None:
            graph_checks = int(self._state["checks"].numpy())
            if graph_checks > self._graph_checks_seen:
                self._graph_checks_seen = graph_checks
                self._errors = self._state["errors"].numpy()
                self._nonfinite = self._state["nonfinite"].numpy()

    @property
    def checks(self):
        """How many steps were checked (eagerly and in graphs)."""
        self._refresh()
        return self._eager_checks + self._graph_checks_seen

    @property
    def errors(self):
        """Per-block relative drift of the last checked step (numpy), or ``None`` before one."""
        self._refresh()
        return self._errors

    @property
    def nonfinite(self):
        """Per-block flags of NaN/inf in the last checked step (numpy), or ``None`` before one."""
        self._refresh()
        return self._nonfinite

    def summary(self):
        """One line: blocks checked, the worst drift and where, and any NaN/inf."""
        errors, flags = self.errors, self.nonfinite
        if errors is None:
            return f"{self.stack_name}: not checked yet"
        worst = int(np.nanargmax(errors)) if np.isfinite(errors).any() else 0
        bad = np.flatnonzero(flags).tolist()
        value = errors[worst]
        return (f"{self.stack_name}: {len(errors)} blocks, largest drift "
                f"{value:.2g} at block {worst}" + (f", NaN/inf at blocks {bad}" if bad else "")
                + ("" if math.isfinite(value) else " (not finite)"))
