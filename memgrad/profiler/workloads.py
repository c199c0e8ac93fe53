"""Reference workloads (public): small, dependency-free training steps to profile, to try the
emulated device on (``"memgrad.profiler.workloads:mlp_training_step"``) and to test the profiler."""

from __future__ import annotations

import tensorflow as tf


def build_mlp_step(depth: int, width: int, seed: int = 0):
    """Builds a plain deep tanh MLP and its ``tf.function`` training step.

    Args:
      depth: number of hidden ``width x width`` layers.
      width: units per layer.
      seed: weight initialisation seed.

    Returns:
      ``(step, variables)``: ``step(x, y)`` runs one SGD step on a batch
      ``x: [B, width]``, ``y: [B, width]`` and returns the loss.
    """
    if depth < 1 or width < 1:
        raise ValueError(f"Expected depth >= 1 and width >= 1. Received: depth={depth}, width={width}")
    init = tf.random.stateless_normal
    variables = [
        tf.Variable(init([width, width], seed=[seed, i]) / width**0.5, name=f"kernel_{i}")
        for i in range(depth)
    ]

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            h = x
            for kernel in variables:
                h = tf.tanh(h @ kernel)
            loss = tf.reduce_mean(tf.square(h - y))
        for variable, grad in zip(variables, tape.gradient(loss, variables)):
            variable.assign_sub(0.01 * grad)
        return loss

    return step, variables


def mlp_batch(batch_size: int, width: int, seed: int = 1):
    """A synthetic regression batch ``(x, y)`` of shape ``[batch_size, width]``."""
    x = tf.random.stateless_normal([batch_size, width], seed=[seed, 0])
    y = tf.random.stateless_normal([batch_size, width], seed=[seed, 1])
    return x, y


def conv_classifier(frozen_backbone=False, depth=16, channels=32, input_shape=(32, 32, 8), classes=10):
    """A Keras Sequential of ``depth`` Conv2D-BatchNormalization-ReLU layers and a Dense head.

    Args:
      frozen_backbone: freeze every layer but the head (fine-tuning).
      depth: conv-BN-ReLU layers.
      channels: filters per convolution.
      input_shape: ``(height, width, channels)``.
      classes: head outputs.

    Returns:
      An uncompiled ``keras.Sequential``.
    """
    import keras  # only this workload needs Keras

    layers = [keras.Input(input_shape)]
    for _ in range(depth):
        layers += [keras.layers.Conv2D(channels, 3, padding="same"), keras.layers.BatchNormalization(),
                   keras.layers.ReLU()]
    layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(classes)]
    model = keras.Sequential(layers)
    if frozen_backbone:
        for layer in model.layers[:-2]:
            layer.trainable = False
    return model


def transformer_classifier(blocks=12, dim=64, heads=4, tokens=64, classes=10, seed=0):
    """A Keras functional transformer encoder with a Dense head (the XLA workload of the tests
    and the benchmark).

    Each block: multi-head self-attention and a ``4 * dim`` GELU MLP, each added to its input
    and layer-normalised; the head averages the tokens.

    Args:
      blocks: encoder blocks.
      dim: features per token.
      heads: attention heads (``dim`` must be a multiple).
      tokens: sequence length.
      classes: head outputs.
      seed: Keras's global seed, set before the weights are drawn.

    Returns:
      An uncompiled ``keras.Model`` mapping ``[batch, tokens, dim]`` to ``[batch, classes]``.

    Example:
      >>> model = transformer_classifier(blocks=1, dim=8, heads=2, tokens=4)
      >>> model.output_shape
      (None, 10)
    """
    import keras  # only the Keras workloads need Keras

    keras.utils.set_random_seed(seed)
    layers = keras.layers
    inputs = keras.Input((tokens, dim))
    h = inputs
    for _ in range(blocks):
        a = layers.MultiHeadAttention(heads, dim // heads)(h, h)
        h = layers.LayerNormalization()(h + a)
        f = layers.Dense(dim)(layers.Dense(4 * dim, activation="gelu")(h))
        h = layers.LayerNormalization()(h + f)
    return keras.Model(inputs, layers.Dense(classes)(layers.GlobalAveragePooling1D()(h)))


def mlp_step(batch_size: int = 64, depth: int = 8, width: int = 256):
    """The MLP's training step and a batch: a builder for ``measure_runs(..., processes=n)``.

    Returns:
      ``(step, (x, y))``.

    Example:
      >>> step, batch = mlp_step(batch_size=4, depth=2, width=8)
      >>> float(step(*batch)) > 0
      True
    """
    step, _ = build_mlp_step(depth, width)
    return step, mlp_batch(batch_size, width)


def transformer_step(batch_size: int = 8, blocks: int = 4, dim: int = 64, heads: int = 4, tokens: int = 64):
    """A training step of `transformer_classifier` (plain backprop, SGD) and a synthetic batch:
    a builder for ``measure_runs(..., processes=n)``.

    Returns:
      ``(step, (x, labels))``: ``step(x, labels)`` runs one step and returns the loss.

    Example:
      >>> step, batch = transformer_step(batch_size=2, blocks=1, dim=8, heads=2, tokens=4)
      >>> float(step(*batch)) > 0
      True
    """
    model = transformer_classifier(blocks=blocks, dim=dim, heads=heads, tokens=tokens)
    variables = model.trainable_variables

    @tf.function
    def step(x, labels):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
        for variable, grad in zip(variables, tape.gradient(loss, variables)):
            variable.assign_sub(0.01 * grad)
        return loss

    x = tf.random.stateless_normal([batch_size, tokens, dim], seed=[1, 0])
    labels = tf.random.stateless_uniform([batch_size], seed=[1, 1], maxval=10, dtype=tf.int32)
    return step, (x, labels)


def mlp_training_step(batch_size: int = 64, depth: int = 8, width: int = 256) -> float:
    """Builds the MLP and runs one training step: a `run_capped` target.

    Args:
      batch_size: rows in the batch.
      depth: hidden layers.
      width: units per layer.

    Returns:
      The loss of the step.
    """
    step, _ = build_mlp_step(depth, width)
    return float(step(*mlp_batch(batch_size, width)))


def residual_chain(depth: int, width: int, seed: int = 0):
    """A residual chain h <- h + relu(h W), the workload of the checkpointing tests and benchmark.

    Args:
      depth: number of residual layers.
      width: features per layer.
      seed: seed of the weights (stateless, so equal seeds give equal weights).

    Returns:
      A pair: the list of weight variables, and `loss_fn(x)` returning mean(h * h).
    """
    weights = [tf.Variable(tf.random.stateless_normal([width, width], [seed, i]) * 0.05)
               for i in range(depth)]

    def loss_fn(x):
        h = x
        for w in weights:
            h = h + tf.nn.relu(h @ w)
        return tf.reduce_mean(h * h)

    return weights, loss_fn


UNEVEN_WIDTHS = (64, 768, 256, 1024, 64, 512) * 4


def uneven_chain(widths=UNEVEN_WIDTHS, seed=7):
    """A ReLU chain whose layer widths vary 16-fold, where equal spacing keeps the wrong layers.

    Args:
      widths: output features of each layer; the input has ``widths[-1]`` features.
      seed: seed of the weights.

    Returns:
      A pair: the list of weight variables, and ``loss_fn(x)`` returning mean(h * h).
    """
    sizes = [widths[-1]] + list(widths)
    weights = [
        tf.Variable(tf.random.stateless_normal([a, b], [seed, i]) / float(a) ** 0.5)
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]))
    ]

    def loss_fn(x):
        h = x
        for w in weights:
            h = tf.nn.relu(h @ w)
        return tf.reduce_mean(h * h)

    return weights, loss_fn


def lstm_regressor(layers=2, units=128, steps=512, features=32, seed=0):
    """A stack of Keras LSTM layers over a sequence and a per-step Dense head.

    Each LSTM returns its whole sequence, so training keeps every step's gates: the memory
    of plain backprop grows with ``steps``.

    Args:
      layers: LSTM layers.
      units: units per LSTM.
      steps: sequence length (time steps).
      features: features per step of the input.
      seed: Keras's random seed for the weights.

    Returns:
      A ``keras.Sequential`` mapping ``[batch, steps, features]`` to ``[batch, steps, 1]``.
    """
    import keras

    keras.utils.set_random_seed(seed)
    stack = [keras.Input((steps, features))]
    stack += [keras.layers.LSTM(units, return_sequences=True) for _ in range(layers)]
    return keras.Sequential(stack + [keras.layers.Dense(1)])


def gru_scan(steps=1024, units=256, features=64, seed=0, recompute_cell=False):
    """A GRU recurrence written with ``tf.scan`` over ``steps`` time steps.

    Args:
      steps: time steps (the length of the inputs' first axis).
      units: state features.
      features: input features per step.
      seed: seed of the weights (stateless).
      recompute_cell: wrap the cell in ``tf.recompute_grad`` (its gates recomputed in the
        backward pass, step by step).

    Returns:
      A pair: the list of weight variables, and ``loss_fn(x)`` for ``x`` of shape
      ``[steps, batch, features]``, returning the mean square of every step's state.
    """
    del steps  # the length comes with x; kept in the signature to name the workload
    weights = [tf.Variable(tf.random.stateless_normal([features + units, units], [seed, i])
                           / float(features + units) ** 0.5) for i in range(3)]
    update, reset, candidate = weights

    def cell(h, x_t):
        xh = tf.concat([x_t, h], axis=1)
        z = tf.sigmoid(xh @ update)
        r = tf.sigmoid(xh @ reset)
        c = tf.tanh(tf.concat([x_t, r * h], axis=1) @ candidate)
        return (1.0 - z) * h + z * c

    step = tf.recompute_grad(cell) if recompute_cell else cell

    def loss_fn(x):
        h0 = tf.zeros([tf.shape(x)[1], units], x.dtype)
        return tf.reduce_mean(tf.square(tf.scan(step, x, initializer=h0)))

    return weights, loss_fn
