"""One process of the two-worker `MultiWorkerMirroredStrategy` test (tests/test_multiworker.py).

    python -m tests.multiworker_worker OUT.npz            # one process, no strategy
    TF_CONFIG=... python -m tests.multiworker_worker OUT.npz   # a worker of the cluster

Trains two models for one step on the same 16 examples (global batch 16) and saves the
step each weight took: a residual Dense chain differentiated by `memgrad.GradientTape`
and a model around a `ReversibleSequence`. Weights start from a NumPy seed, so every process
starts from the same values.
"""

import functools
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import memgrad  # noqa: E402
from memgrad.layers import AdditiveCoupling, ReversibleSequence  # noqa: E402

BATCH, WIDTH = 16, 16


def _checkpointed():
    inputs = keras.Input((WIDTH,))
    h = inputs
    for _ in range(6):
        h = keras.layers.Add()([h, keras.layers.Dense(WIDTH, activation="tanh")(h)])
    return keras.Model(inputs, keras.layers.Dense(1)(h))


def _reversible():
    blocks = [AdditiveCoupling(keras.layers.Dense(WIDTH // 2, activation="tanh"),
                               keras.layers.Dense(WIDTH // 2, activation="tanh"))
              for _ in range(3)]
    return keras.Sequential([keras.Input((WIDTH,)), ReversibleSequence(blocks), keras.layers.Dense(1)])


def _train(strategy, build, tape_class, x, y, seed):
    """One step of a custom training loop (Keras 3's `fit` fails under
    MultiWorkerMirroredStrategy whatever the model: keras-team/keras#20585): each input
    pipeline takes its share of the global batch, the loss is summed over the replica's
    examples and divided by the global batch, and the optimizer sums the replicas' gradients.
    Returns the step each weight took."""
    with strategy.scope():
        model = build()
        optimizer = keras.optimizers.SGD(0.1)
    rng = np.random.default_rng(seed)
    model.set_weights([rng.standard_normal(w.shape).astype("float32") * 0.3
                       for w in model.get_weights()])
    start = model.get_weights()

    def dataset_fn(context):
        share = BATCH // context.num_input_pipelines
        part = slice(context.input_pipeline_id * share, (context.input_pipeline_id + 1) * share)
        return tf.data.Dataset.from_tensor_slices((x[part], y[part])).batch(share)

    batch = next(iter(strategy.distribute_datasets_from_function(dataset_fn)))

    @tf.function
    def step(batch):
        def replica_step(xb, yb):
            with tape_class() as tape:
                loss = tf.reduce_sum((model(xb, training=True) - yb) ** 2) / BATCH
            optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

        strategy.run(replica_step, args=batch)

    step(batch)
    return [s - w for s, w in zip(start, model.get_weights())]


def main(out):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, WIDTH)).astype("float32")
    y = rng.standard_normal((BATCH, 1)).astype("float32")
    if "TF_CONFIG" in os.environ:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        assert strategy.num_replicas_in_sync == 2, strategy.num_replicas_in_sync
    else:
        strategy = tf.distribute.get_strategy()
    checkpointed_tape = functools.partial(memgrad.GradientTape, checkpoints="memory")
    results = {}
    with memgrad.record_rewrites() as log:
        for name, build, tape, seed in (("checkpointed", _checkpointed, checkpointed_tape, 1),
                                        ("reversible", _reversible, tf.GradientTape, 2)):
            for i, w in enumerate(_train(strategy, build, tape, x, y, seed)):
                results[f"{name}/{i}"] = w
    assert len(log) == 1 and log[0].segments >= 2 and not log[0].fallback, list(log)
    np.savez(out, **results)


if __name__ == "__main__":
    main(sys.argv[1])
