"""Small Keras models of the shapes checkpointing must handle, with data to train them."""

import keras
import numpy as np
import tensorflow as tf

L = keras.layers


def _data(shape, classes, seed=0, batch=8):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch,) + tuple(shape)).astype("float32")
    y = rng.integers(0, classes, size=(batch,)).astype("int32")
    return tf.constant(x), tf.constant(y)


def deep_chain(depth=24, width=32):
    inputs = keras.Input((width,))
    h = inputs
    for _ in range(depth):
        h = L.Dense(width, activation="tanh")(h)
    model = keras.Model(inputs, L.Dense(10)(h))
    return model, *_data((width,), 10)


def residual(depth=16, width=32):
    inputs = keras.Input((width,))
    h = inputs
    for _ in range(depth):
        h = L.Add()([h, L.Dense(width)(L.Dense(width, activation="relu")(h))])
    model = keras.Model(inputs, L.Dense(10)(h))
    return model, *_data((width,), 10)


def densenet(blocks=2, layers=4, growth=4):
    inputs = keras.Input((8, 8, 3))
    h = L.Conv2D(8, 3, padding="same")(inputs)
    for _ in range(blocks):
        features = [h]
        for _ in range(layers):
            z = L.Concatenate()(features) if len(features) > 1 else features[0]
            z = L.Conv2D(growth, 3, padding="same", activation="relu")(z)
            features.append(z)
        h = L.Conv2D(8, 1)(L.Concatenate()(features))
        h = L.AveragePooling2D(2)(h)
    model = keras.Model(inputs, L.Dense(10)(L.GlobalAveragePooling2D()(h)))
    return model, *_data((8, 8, 3), 10)


def unet(levels=3, channels=4):
    inputs = keras.Input((16, 16, 2))
    h = inputs
    skips = []
    for i in range(levels):
        h = L.Conv2D(channels * 2**i, 3, padding="same", activation="relu")(h)
        skips.append(h)
        h = L.MaxPooling2D()(h)
    h = L.Conv2D(channels * 2**levels, 3, padding="same", activation="relu")(h)
    for i in reversed(range(levels)):
        h = L.UpSampling2D()(h)
        h = L.Concatenate()([h, skips[i]])
        h = L.Conv2D(channels * 2**i, 3, padding="same", activation="relu")(h)
    model = keras.Model(inputs, L.Dense(10)(L.GlobalAveragePooling2D()(h)))
    return model, *_data((16, 16, 2), 10)


def transformer(blocks=2, dim=16, heads=2, tokens=6):
    inputs = keras.Input((tokens, dim))
    h = inputs
    for _ in range(blocks):
        a = L.MultiHeadAttention(heads, dim // heads)(h, h)
        h = L.LayerNormalization()(h + a)
        f = L.Dense(dim)(L.Dense(2 * dim, activation="gelu")(h))
        h = L.LayerNormalization()(h + f)
    model = keras.Model(inputs, L.Dense(10)(L.GlobalAveragePooling1D()(h)))
    return model, *_data((tokens, dim), 10)


def embedding(vocab=50, dim=8, tokens=5):
    inputs = keras.Input((tokens,), dtype="int32")
    h = L.Embedding(vocab, dim)(inputs)
    h = L.Dense(dim, activation="relu")(h)
    h = L.Dense(dim, activation="relu")(h)
    model = keras.Model(inputs, L.Dense(10)(L.GlobalAveragePooling1D()(h)))
    rng = np.random.default_rng(1)
    x = tf.constant(rng.integers(0, vocab, size=(8, tokens)).astype("int32"))
    y = tf.constant(rng.integers(0, 10, size=(8,)).astype("int32"))
    return model, x, y


def batchnorm_dropout(depth=6, width=16):
    inputs = keras.Input((width,))
    h = inputs
    for i in range(depth):
        h = L.Dense(width)(h)
        h = L.BatchNormalization()(h)
        h = L.ReLU()(h)
        h = L.Dropout(0.3, seed=i)(h)
    model = keras.Model(inputs, L.Dense(10)(h))
    return model, *_data((width,), 10)


class SubclassedNet(keras.Model):
    def __init__(self, depth=6, width=16):
        super().__init__()
        self.blocks = [L.Dense(width, activation="relu") for _ in range(depth)]
        self.head = L.Dense(10)

    def call(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def subclassed(depth=6, width=16):
    model = SubclassedNet(depth, width)
    x, y = _data((width,), 10)
    model(x)
    return model, x, y


BUILDERS = {
    "deep_chain": deep_chain,
    "residual": residual,
    "densenet": densenet,
    "unet": unet,
    "transformer": transformer,
    "embedding": embedding,
    "batchnorm_dropout": batchnorm_dropout,
    "subclassed": subclassed,
}

loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def max_relative_error(reference, other):
    """Largest |a - b| / max|a| over a list of gradient pairs (dense or IndexedSlices).

    A gradient that is zero in exact arithmetic (the bias of a Dense layer followed by
    BatchNormalization, the key bias of attention) is float rounding noise in both
    computations (about 1e-8), so each variable's
    scale is floored at 1% of the largest gradient of the model.
    """
    pairs = [(tf.convert_to_tensor(a).numpy(), tf.convert_to_tensor(b).numpy())
             for a, b in zip(reference, other)]
    overall = max(float(np.abs(a).max()) for a, _ in pairs)
    worst = 0.0
    for a, b in pairs:
        scale = max(float(np.abs(a).max()), 1e-2 * overall, 1e-30)
        worst = max(worst, float(np.abs(a - b).max()) / scale)
    return worst


class rewritten:
    """Asserts that every `memgrad.gradients` call made inside the block was rewritten.

    A call that fell back to plain `tf.gradients` gives tf.gradients' results, so a
    gradient-equality test would pass on it without testing the rewrite. With
    ``allow_plain_speed``, a 'speed' call that ran plain backprop by design (its plan would
    free under 5% of what plain backprop keeps) passes. Used as a context
    manager around the first (tracing) call of a step:

        with rewritten(calls=2):
            reference, checkpointed = step(x, y)
    """

    def __init__(self, calls=1, min_segments=2, allow_plain_speed=False):
        self.calls = calls
        self.min_segments = min_segments
        self.allow_plain_speed = allow_plain_speed

    def __enter__(self):
        import memgrad

        self._recording = memgrad.record_rewrites()
        self._log = self._recording.__enter__()
        return self

    def __exit__(self, kind, value, traceback):
        self._recording.__exit__(kind, value, traceback)
        if kind is not None:
            return False
        entries = list(self._log)
        assert len(entries) >= self.calls, (
            f"expected {self.calls} memgrad.gradients calls, saw {len(entries)} "
            "(was the step already traced?)")
        for entry in entries:
            if self.allow_plain_speed and entry.plan is not None and entry.plan.details.get(
                    "same_as_plain"):
                continue  # 'speed' found nothing to free: plain backprop, by design
            assert not entry.fallback, f"fell back to plain tf.gradients: {entry}"
            assert entry.segments >= self.min_segments, f"no real rewrite: {entry}"
        self.entries = entries
        return False
