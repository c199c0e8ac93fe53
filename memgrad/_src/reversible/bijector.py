"""`BijectorBlock`: a tensorflow-probability bijector as a block of a `ReversibleSequence`."""

from __future__ import annotations

import functools
import types

import keras
import tensorflow as tf

from memgrad._src import tf_internals
from memgrad._src.reversible.base import ReversibleBlock


def _keras_objects_in(root, max_depth=8):
    """The Keras layers and variables a bijector holds: as attributes, or in its functions' closures.

    ``tf.Module`` (which tfp bijectors are) finds ``tf.Variable`` s and other modules
    only; Keras 3 layers and variables are neither, so ``bijector.trainable_variables``
    misses them. RealNVP and MAF keep their network as a callable: a Keras model, a
    bound method of one, a ``functools.partial``, or a function that closes over one or
    names it as a global.
    """
    layers, variables, seen = [], [], set()

    def visit(obj, depth):
        if depth > max_depth or id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool)):
            return
        seen.add(id(obj))
        if isinstance(obj, keras.layers.Layer):
            layers.append(obj)  # Keras tracks the layer's own sub-layers and weights
        elif isinstance(obj, keras.Variable):
            variables.append(obj)
        elif isinstance(obj, tf_internals.tfp().bijectors.Bijector):
            for value in vars(obj).values():
                visit(value, depth + 1)
        elif isinstance(obj, (list, tuple, set)):
            for item in obj:
                visit(item, depth + 1)
        elif isinstance(obj, dict):
            for item in obj.values():
                visit(item, depth + 1)
        elif isinstance(obj, types.MethodType):
            visit(obj.__self__, depth + 1)
        elif isinstance(obj, functools.partial):
            visit([obj.func, obj.args, obj.keywords], depth + 1)
        elif isinstance(obj, types.FunctionType):
            for cell in obj.__closure__ or ():
                try:
                    visit(cell.cell_contents, depth + 1)
                except ValueError:  # an empty cell: a variable not yet assigned
                    pass
            # A module-level function reaches its network as a global: only the globals it names.
            for name in obj.__code__.co_names:
                if name in obj.__globals__:
                    visit(obj.__globals__[name], depth + 1)

    visit(root, 0)
    return layers, variables


def _leaves(bijector, inverted=False):
    """``(bijector, inverted)`` pairs in the order the forward pass applies them.

    A Chain applies its last bijector first; an Invert swaps forward and inverse.
    """
    chain, invert = tf_internals.tfp_chain_and_invert()
    if isinstance(bijector, chain):
        parts = bijector.bijectors if inverted else list(reversed(bijector.bijectors))
        return [leaf for part in parts for leaf in _leaves(part, inverted)]
    if isinstance(bijector, invert):
        return _leaves(bijector.bijector, not inverted)
    return [(bijector, inverted)]


def _is_training_batchnorm(bijector):
    """Whether ``bijector`` is a ``tfb.BatchNormalization`` that normalises with batch statistics."""
    if not isinstance(bijector, tf_internals.tfp().bijectors.BatchNormalization):
        return False
    training = tf.get_static_value(tf_internals.tfp_batchnorm_training(bijector))
    if training is None:
        raise ValueError(
            "BijectorBlock needs to know, when the stack is built, whether a "
            "tfp.bijectors.BatchNormalization uses batch statistics: pass training=True or "
            f"training=False. Received: training={tf_internals.tfp_batchnorm_training(bijector)!r} in bijector "
            f"'{bijector.name}'"
        )
    return bool(training)


def _batchnorm_geometry(bijector, x):
    """A tfp BatchNormalization's reduction axes over ``x``, and a reshape broadcasting its parameters."""
    layer = bijector.batchnorm
    if not layer.built:
        layer.build(x.shape)
    rank = x.shape.rank
    axes = [a % rank for a in layer.axis]
    reduction_axes = [i for i in range(rank) if i not in axes]
    shape = [1] * rank
    for a in axes:
        shape[a] = x.shape[a]

    def broadcast(value):
        return None if value is None else tf.reshape(tf.cast(value, x.dtype), shape)

    return reduction_axes, broadcast


def _batchnorm_parameters(bijector, broadcast):
    layer = bijector.batchnorm
    beta = broadcast(layer.beta) if layer.center else None
    gamma = broadcast(layer.gamma) if layer.scale else None
    return beta, gamma, layer.epsilon


class BijectorBlock(ReversibleBlock):
    """Runs a ``tfp.bijectors.Bijector`` inside a constant-memory stack (Algorithm 1 path).

    Every axis but the batch axis is one event: the block's log-det is the
    bijector's ``forward_log_det_jacobian`` with ``event_ndims = rank - 1``.

    Variables: Keras layers and variables the bijector holds (a RealNVP or MAF network
    written as a Keras model, held directly or reached through a bound method, a
    ``functools.partial``, a function's closure or a global the function names) are
    tracked as the block's own, so they appear in ``block.trainable_variables``, the
    stack's and the model's, and train with ``fit``. ``tf.Variable`` s the bijector owns
    (``tfb.Scale(tf.Variable(...))``, a BatchNormalization bijector's ``gamma`` and
    ``beta``) receive gradients through the stack but Keras does not track them (nor
    does ``fit`` train them); `all_trainable_variables` lists both kinds.

    Dtype: the block computes in ``bijector.dtype`` when the bijector has one, else in
    the dtype of the Keras layers it holds; `ReversibleSequence` takes its dtype from
    its blocks when none is given.

    ``tfp.bijectors.BatchNormalization`` with ``training=True`` (alone, or inside
    ``tfb.Chain`` / ``tfb.Invert``): where the block's forward normalises (an inverted
    BatchNormalization), it uses the batch's statistics and updates the moving ones once;
    the backward pass rebuilds the input with those same batch statistics (kept from the
    forward pass, one mean and variance per channel) and differentiates through the
    batch statistics like plain autodiff, without updating the moving statistics again.
    Where the block's forward de-normalises (tfp's ``forward``, moving statistics), the
    backward pass inverts it with the moving statistics too. A training-mode
    BatchNormalization nested in any other bijector is refused.

    Bijectors are not Keras-serialisable, so neither is this block.

    Args:
      bijector: a ``tfp.bijectors.Bijector`` acting on channels-last inputs.
      **kwargs: Keras layer arguments.

    Raises:
      ValueError: if a training-mode ``tfp.bijectors.BatchNormalization`` sits inside a
        bijector other than ``Chain`` or ``Invert``, or its ``training`` is not a Python bool.

    Example:
      >>> import tensorflow_probability as tfp
      >>> from memgrad.layers import ReversibleSequence
      >>> stack = ReversibleSequence([tfp.bijectors.Scale(2.0)], return_logdet=True)
      >>> y, logdet = stack(tf.ones([3, 4]))    # logdet = 4 * log 2 per example
    """

    # tfp's inverses are tfp's; and a tf_keras BatchNormalization inside would update its
    # moving statistics in ReversibleSequence's inverse check (no Keras scope discards that).
    inverse_checked = False

    def __init__(self, bijector, **kwargs):
        layers, variables = _keras_objects_in(bijector)
        if kwargs.get("dtype") is None:
            kwargs["dtype"] = _required_dtype(bijector, layers)
        super().__init__(**kwargs)
        self.bijector = bijector
        # Keras tracks layers and variables assigned as attributes: they become the block's weights.
        self.bijector_layers = layers
        self.bijector_keras_variables = variables
        self._leaves = self._leaves_if_batchnorm(bijector)

    def build(self, input_shape):
        # Nothing to create: the bijector's Keras layers build themselves when it first runs
        # (only the bijector knows their input shapes), and Keras optimizers accept them then.
        super().build(input_shape)

    @property
    def required_dtype(self):
        """The dtype the bijector fixes (a string), or ``None`` if it works in any float dtype."""
        return _required_dtype(self.bijector, self.bijector_layers)

    @property
    def all_trainable_variables(self):
        """Every trainable variable the bijector uses: the Keras ones and its own ``tf.Variable`` s.

        ``trainable_variables`` (and so the model's, which ``fit`` trains) has the Keras
        ones only: Keras tracks no bare ``tf.Variable``. In a custom training loop, take
        gradients for this list and apply them with any optimizer.
        """
        keras_variables = self.trainable_variables
        inner = {id(tf_internals.backend_variable(v)) for v in keras_variables}
        own = [v for v in self.bijector.trainable_variables if id(v) not in inner]
        return keras_variables + own

    @staticmethod
    def _leaves_if_batchnorm(bijector):
        """The bijector's leaves when a training-mode BatchNormalization needs handling, else ``None``."""
        leaves = _leaves(bijector)
        batchnorm = tf_internals.tfp().bijectors.BatchNormalization
        nested = [m for m in bijector.submodules if isinstance(m, batchnorm)]
        reachable = {id(leaf) for leaf, _ in leaves}
        hidden = [m for m in nested if id(m) not in reachable and _is_training_batchnorm(m)]
        if hidden:
            raise ValueError(
                "BijectorBlock cannot rebuild the input of a tfp.bijectors.BatchNormalization "
                "in training mode nested inside another bijector: in training mode it "
                "normalises with the statistics of the batch, which the backward pass must "
                "reuse, and only tfb.Chain and tfb.Invert can be looked through. Put it in the "
                "stack directly (or in a Chain/Invert), use it outside the ReversibleSequence, "
                "pass training=False, or use ReversibleSequence(..., plain_backprop=True). "
                f"Received: BatchNormalization '{hidden[0].name}' inside "
                f"{type(bijector).__name__} '{bijector.name}'"
            )
        return leaves if any(_is_training_batchnorm(leaf) for leaf, _ in leaves) else None

    def forward(self, x, training=None):
        # tfp caches results by input tensor: a second call on the same tensor, now under a
        # GradientTape, would return the first call's log-det, which has no gradient (plain
        # backprop through a stack called twice on one batch got wrong weight gradients).
        x = tf.identity(x)
        if self._leaves is None:
            return self._whole_forward(x)
        y, logdet, _ = self._leaf_forward(x, saved=None)
        return y, logdet

    def forward_and_save(self, x, training=None):
        if self._leaves is None:
            return super().forward_and_save(x, training)
        return self._leaf_forward(tf.identity(x), saved=None)  # tf.identity: see forward

    def inverse(self, y, training=None):
        return self.bijector.inverse(y)

    def backward(self, y, dy, dlogdet, variables, training=None, saved=None):
        if self._leaves is None:
            return super().backward(y, dy, dlogdet, variables, training)
        x = tf.stop_gradient(self._leaf_inverse(y, saved))
        with tf.GradientTape() as tape:
            tape.watch(x)
            y_again, logdet, _ = self._leaf_forward(x, saved=saved)
        grads = tape.gradient([y_again, logdet], [x] + list(variables), output_gradients=[dy, dlogdet])
        return x, grads[0], grads[1:]

    def _whole_forward(self, x):
        y = self.bijector.forward(x)
        logdet = self.bijector.forward_log_det_jacobian(x, event_ndims=x.shape.rank - 1)
        return y, self._per_example(logdet, x)

    @staticmethod
    def _per_example(logdet, x):
        return tf.zeros(tf.shape(x)[:1], x.dtype) + tf.cast(logdet, x.dtype)

    def _leaf_forward(self, x, saved):
        """The forward pass leaf by leaf.

        With ``saved=None`` this is the stack's forward pass, which returns the batch
        statistics each normalising BatchNormalization used; with ``saved`` it is the
        backward pass's recomputation, which must not touch the moving statistics.
        """
        h, logdet, kept = x, self._per_example(0.0, x), []
        for leaf, inverted in self._leaves:
            event_ndims = h.shape.rank - 1
            if _is_training_batchnorm(leaf) and inverted:
                reduction_axes, broadcast = _batchnorm_geometry(leaf, h)
                if saved is None:
                    # Plain forward: the Keras layer normalises and updates the moving statistics.
                    mean, variance = tf.nn.moments(h, reduction_axes, keepdims=True)
                    kept.append((tf.stop_gradient(mean), tf.stop_gradient(variance)))
                    h_next = leaf.inverse(h)
                else:
                    # The same normalisation by hand, gradient through the batch statistics included.
                    mean, variance = tf.nn.moments(h, reduction_axes, keepdims=True)
                    beta, gamma, epsilon = _batchnorm_parameters(leaf, broadcast)
                    h_next = tf.nn.batch_normalization(h, mean, variance, beta, gamma, epsilon)
                leaf_logdet = leaf.inverse_log_det_jacobian(h, event_ndims=event_ndims)
            elif inverted:
                h_next = leaf.inverse(h)
                leaf_logdet = leaf.inverse_log_det_jacobian(h, event_ndims=event_ndims)
            else:
                h_next = leaf.forward(h)
                leaf_logdet = leaf.forward_log_det_jacobian(h, event_ndims=event_ndims)
            logdet = logdet + self._per_example(leaf_logdet, h)
            h = h_next
        return h, logdet, kept

    def _leaf_inverse(self, y, saved):
        """Rebuilds the input from ``y`` with the statistics the forward pass used."""
        saved = list(saved)
        h = y
        for leaf, inverted in reversed(self._leaves):
            if _is_training_batchnorm(leaf):
                reduction_axes, broadcast = _batchnorm_geometry(leaf, h)
                beta, gamma, epsilon = _batchnorm_parameters(leaf, broadcast)
                if inverted:  # undo a normalisation by the batch statistics kept from the forward
                    mean, variance = saved.pop()
                else:  # undo tfp's de-normalisation, which used the moving statistics
                    mean = broadcast(leaf.batchnorm.moving_mean)
                    variance = broadcast(leaf.batchnorm.moving_variance)
                if inverted:
                    scale = tf.sqrt(variance + epsilon) / (1.0 if gamma is None else gamma)
                    h = (h - (0.0 if beta is None else beta)) * scale + mean
                else:
                    h = tf.nn.batch_normalization(h, mean, variance, beta, gamma, epsilon)
            elif inverted:
                h = leaf.forward(h)
            else:
                h = leaf.inverse(h)
        return h

    def get_config(self):
        raise NotImplementedError(
            f"BijectorBlock wraps {type(self.bijector).__name__}, a tensorflow-probability "
            "bijector, which Keras cannot serialise; save the weights instead, or write the "
            "transformation as a ReversibleBlock subclass."
        )


def _required_dtype(bijector, layers):
    """The dtype name a bijector fixes: its own ``dtype``, else its Keras layers' compute dtype."""
    if bijector.dtype is not None:
        return tf.as_dtype(bijector.dtype).name
    dtypes = {layer.compute_dtype for layer in layers}
    return dtypes.pop() if len(dtypes) == 1 else None
