"""`ReversibleBlock`: a layer whose input can be rebuilt from its output, and the shared helpers."""

from __future__ import annotations

import weakref

import keras
import tensorflow as tf


def split_channels(x):
    """Splits a channels-last tensor into its two channel halves."""
    half = x.shape[-1] // 2
    return x[..., :half], x[..., half:]


def per_example_sum(t):
    """Sums over every axis but the first: a ``[batch]`` tensor."""
    return tf.reduce_sum(t, axis=list(range(1, t.shape.rank)))


def broadcast_per_example(per_example, like):
    """Reshapes a ``[batch]`` tensor to broadcast against ``like``."""
    return tf.reshape(per_example, [-1] + [1] * (like.shape.rank - 1))


def add_gradients(a, b):
    """Element-wise sum of two gradient lists in which ``None`` means zero."""
    return [y if x is None else x if y is None else x + y for x, y in zip(a, b)]


_NETWORK_DTYPES = weakref.WeakKeyDictionary()  # network -> network_dtype(network), once built
_FLOAT_WIDTH = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64}


def _leaf_layers(network):
    """The layers inside ``network`` (itself included) that hold no layers of their own."""
    flatten = getattr(network, "_flatten_layers", None)
    if flatten is None:
        return [network]
    return [layer for layer in flatten(include_self=True, recursive=True)
            if not any(True for _ in layer._flatten_layers(include_self=False, recursive=False))]


def network_dtype(network):
    """The dtype ``network``'s own layers compute in, which its container may not tell.

    A dtype-less container (``keras.Sequential([Dense(..., dtype="float64")])``) reports the
    global policy's compute dtype (float32), while the layers that do the work compute in
    float64. This is the widest compute dtype of the innermost layers that hold weights or
    were given a dtype policy other than the global one (casting an input to it loses nothing: a narrower first layer casts it down itself, as
    it would outside a reversible block); a network without weighted layers (an activation,
    a Lambda) falls back to its own compute dtype. Two 16-bit dtypes (float16 and bfloat16)
    give float32.

    Args:
      network: a Keras layer or model.

    Returns:
      A dtype name such as ``"float32"``.

    Example:
      >>> network_dtype(keras.Sequential([keras.layers.Dense(2, dtype="float64")]))
      'float64'
    """
    cached = _NETWORK_DTYPES.get(network)
    if cached is not None:
        return cached
    default = keras.config.dtype_policy().name
    dtypes = {layer.compute_dtype for layer in _leaf_layers(network)
              if layer.compute_dtype in _FLOAT_WIDTH
              and (layer.weights or layer.dtype_policy.name != default)}
    if not dtypes:
        return network.compute_dtype
    widest = max(_FLOAT_WIDTH[d] for d in dtypes)
    candidates = sorted(d for d in dtypes if _FLOAT_WIDTH[d] == widest)
    result = candidates[0] if len(candidates) == 1 else "float32"
    if network.built:  # its weights are all known once built: cache then only
        _NETWORK_DTYPES[network] = result
    return result


def run_network(network, h, training=None):
    """Runs ``network`` in its own layers' dtype on ``h`` and returns the result in ``h``'s dtype.

    A `ReversibleSequence` may carry its activations in a wider dtype than its networks
    compute in (float64 around float32 networks, float32 around float16 ones): the networks
    see their own dtype (`network_dtype`: that of the layers inside, not the container's),
    the coupling's add, subtract, multiply and divide stay in the wide one.
    """
    return tf.cast(network(tf.cast(h, network_dtype(network)), training=training), h.dtype)


def network_vjp(network, h, output_gradient, variables, training=None):
    """Runs ``network`` on ``h`` (in the network's own dtype, as `run_network`) and
    back-propagates ``output_gradient`` through it.

    Returns:
      ``(output, gradients)``: the network's output in ``h``'s dtype, and the gradients with
      respect to ``h`` (in ``output_gradient``'s dtype; zeros where the output does not
      depend on ``h``) and to each of ``variables`` (``None`` where unused).
    """
    inputs = tf.cast(h, network_dtype(network))
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        outputs = network(inputs, training=training)
    grads = tape.gradient(outputs, [inputs] + list(variables),
                          output_gradients=tf.cast(output_gradient, outputs.dtype))
    d_h = (tf.zeros_like(output_gradient) if grads[0] is None
           else tf.cast(grads[0], output_gradient.dtype))
    return tf.cast(outputs, h.dtype), [d_h] + grads[1:]


def layer_name(layer) -> str:
    return f"{type(layer).__name__} '{getattr(layer, 'name', '?')}'"


def forward_output(block, result):
    """``(y, logdet)`` of a block's `forward`, or a TypeError naming the block.

    A `forward` returning only ``y`` would otherwise be unpacked along the batch and fail
    deep inside TensorFlow.
    """
    if isinstance(result, (tuple, list)) and len(result) == 2:
        return result
    received = (f"{type(result).__name__} of {len(result)} items"
                if isinstance(result, (tuple, list)) else
                f"{type(result).__name__} of shape {getattr(result, 'shape', '?')}")
    raise TypeError(
        f"{layer_name(block)}.forward must return (y, logdet): the block's output and the log "
        f"of its Jacobian determinant per example, shape [batch] (zeros for a volume-preserving "
        f"block). Received: {received}")


@keras.saving.register_keras_serializable(package="memgrad")
class ReversibleBlock(keras.layers.Layer):
    """Base class of the blocks a `ReversibleSequence` runs.

    A block maps ``x`` to ``y`` invertibly and reports the log-determinant of
    its Jacobian per example. Subclasses implement `forward` and `inverse`; the
    default `backward` is Algorithm 1 of Li & Grathwohl (2019): rebuild the input
    with `inverse`, run `forward` again under a tape, and differentiate it. A
    block with a cheaper fused backward (the couplings) overrides `backward`.
    Recomputation must reproduce `forward`: given its input, weights and
    `replayed_state`, a block's forward pass must be deterministic.

    A block that sets ``accepts_invertible_dtype = True`` promises that its `forward`,
    `inverse` and `backward` work on inputs of any floating dtype (casting what its
    networks need itself, e.g. with ``run_network``), so that a `ReversibleSequence` may
    carry activations wider than the compute dtype. A block without it is run in the
    stack's compute dtype.

    A `ReversibleSequence` checks once, by default, that ``inverse(forward(x))`` gives back
    ``x`` (its ``verify_inverse`` argument): a wrong inverse would make every gradient
    wrong. A block can opt out with the class attribute ``inverse_checked = False``.

    Example:
      >>> class Scale(ReversibleBlock):
      ...     def forward(self, x, training=None):
      ...         return 2.0 * x, tf.fill([tf.shape(x)[0]], x.shape[-1] * tf.math.log(2.0))
      ...     def inverse(self, y, training=None):
      ...         return y / 2.0
    """

    accepts_invertible_dtype = False
    # Whether ReversibleSequence(verify_inverse=True) checks inverse(forward(x)) == x for this
    # block on its first differentiable call. A block whose forward changes state that no
    # Keras stateless scope can discard (a tf_keras layer inside) sets it to False.
    inverse_checked = True

    def forward(self, x, training=None):
        """Maps ``x`` to ``(y, logdet)``, with ``logdet`` of shape ``[batch]``.

        Args:
          x: the block's input.
          training: Keras training flag, passed to inner layers.

        Returns:
          ``(y, logdet)``.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement forward(x, training)")

    def inverse(self, y, training=None):
        """Rebuilds the input ``x`` from the output ``y``.

        Args:
          y: the block's output.
          training: Keras training flag, passed to inner layers.

        Returns:
          ``x`` such that ``forward(x)[0] == y``.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement inverse(y, training)")

    def forward_and_save(self, x, training=None):
        """`forward` as the stack's forward pass runs it, plus what `backward` needs besides ``y``.

        A block whose inverse depends on something only the forward pass sees (a
        BatchNormalization's batch statistics) returns it here; the stack keeps it
        and passes it back as ``backward(..., saved=saved)``. Keep it small: it is
        held from the forward pass to the backward pass. The default saves nothing.

        Returns:
          ``(y, logdet, saved)``; ``saved`` is ``None`` when there is nothing to keep.
        """
        y, logdet = forward_output(self, self.forward(x, training=training))
        return y, logdet, None

    def backward(self, y, dy, dlogdet, variables, training=None):
        """Rebuilds the input and back-propagates through the block (Algorithm 1).

        A block whose `forward_and_save` saves something takes it as an extra
        ``saved`` keyword argument.

        Args:
          y: the block's output.
          dy: the loss gradient with respect to ``y``.
          dlogdet: the loss gradient with respect to this block's log-det, ``[batch]``.
          variables: the variables to return gradients for.
          training: Keras training flag.

        Returns:
          ``(x, dx, variable_gradients)``: the rebuilt input, the gradient with
          respect to it, and one gradient (or ``None``) per entry of ``variables``.
        """
        x = tf.stop_gradient(self.inverse(y, training=training))
        with tf.GradientTape() as tape:
            tape.watch(x)
            y_again, logdet = forward_output(self, self.forward(x, training=training))
        grads = tape.gradient([y_again, logdet], [x] + list(variables), output_gradients=[dy, dlogdet])
        return x, grads[0], grads[1:]

    def replayed_state(self):
        """Variables whose forward-time values the backward pass must see again.

        By default every non-trainable variable: random seed states (so dropout
        draws the same mask) and normalisation statistics. Assignments made while
        recomputing are always discarded.

        Returns:
          A list of Keras variables.
        """
        return list(self.non_trainable_variables)

    def call(self, inputs, training=None):
        return self.forward(inputs, training=training)[0]

    def compute_output_shape(self, input_shape):
        return input_shape
