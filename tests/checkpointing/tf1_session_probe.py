"""TF1-style code run against memgrad in a fresh process (v2 behaviour off is process-wide).

Ports the behaviours openai/gradient-checkpointing tested: reference variables, a graph run
by `tf.compat.v1.Session`, the input held in a variable, `monkey_patch` and collections, and
tf_keras (Keras 2) training, whose v1 optimizer calls
`tensorflow.compat.v2.compat.v1.gradients`. `report()` returns the findings (test_tf1.py calls
it in a fresh process); by hand, this prints them as one JSON line after ``MARKER``:

    python -m tests.checkpointing.tf1_session_probe
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"  # before TensorFlow is imported

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_v2_behavior()
tf1 = tf.compat.v1

import memgrad  # noqa: E402

MARKER = "TF1_SESSION_PROBE "


def _chain(n, batch=1024, width=256, mark_every=0):
    """A tanh chain whose input is a (reference) variable, as in openai's tests."""
    rng = np.random.RandomState(0)
    x = tf1.Variable(rng.randn(batch, width).astype("float32") * 0.1, name="x")
    weights = [tf1.Variable(rng.randn(width, width).astype("float32") * 0.05)
               for _ in range(n)]
    h = x
    for i, w in enumerate(weights):
        h = tf.tanh(h @ w)
        if mark_every and (i + 1) % mark_every == 0:
            tf1.add_to_collection("checkpoints", h)
    return tf.reduce_sum(h), [x] + weights


def _relative_error(reference, other):
    return max(float(np.abs(a - b).max() / max(np.abs(a).max(), 1e-30))
               for a, b in zip(reference, other))


def _session_peak(fetch):
    """Peak bytes above the start of one `Session.run(fetch)` (after a warm-up run)."""
    with tf1.Session() as session:
        session.run(tf1.global_variables_initializer())
        session.run(fetch)
        with memgrad.profiler.memory_window("CPU:0") as window:
            values = session.run(fetch)
    return window.peak_above_baseline_bytes, values


def memory_and_gradients(n):
    """Plain vs `memgrad.gradients('memory')` on a chain of n layers, each in a fresh graph."""
    result = {}
    for mode in ("plain", "memory"):
        with tf1.Graph().as_default():
            loss, xs = _chain(n)
            if mode == "plain":
                grads = tf1.gradients(loss, xs)
            else:
                with memgrad.record_rewrites() as log:
                    grads = memgrad.gradients(loss, xs, checkpoints="memory")
                result["segments"] = log[-1].segments
                result["calls"] = len(log)
            result[mode + "_bytes"], result[mode] = _session_peak(grads)
    result["error"] = _relative_error(result.pop("plain"), result.pop("memory"))
    return result


def patched_collection():
    """`monkey_patch('collection')` in a TF1 graph: tf.gradients itself is checkpointed."""
    with tf1.Graph().as_default():
        loss, xs = _chain(12, batch=64, width=32, mark_every=3)
        reference = tf1.gradients(loss, xs)
        memgrad.monkey_patch(checkpoints="collection")
        try:
            with memgrad.record_rewrites() as log:
                patched = tf1.gradients(loss, xs)
        finally:
            memgrad.unpatch()
        entry = log[-1]
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            a, b = session.run([reference, patched])
    return {"error": _relative_error(a, b), "calls": len(log),
            "segments": entry.segments, "checkpoints": entry.checkpoints}


def tf_keras_fit():
    """tf_keras (Keras 2) trains through memgrad under monkey_patch: same loss and weights."""
    import tf_keras

    results = []
    for patch in (False, True):
        with tf1.Graph().as_default():
            tf1.set_random_seed(0)
            np.random.seed(0)
            model = tf_keras.Sequential(
                [tf_keras.layers.Dense(32, activation="tanh", input_shape=(16,))]
                + [tf_keras.layers.Dense(32, activation="tanh") for _ in range(8)]
                + [tf_keras.layers.Dense(1)])
            model.compile(optimizer=tf_keras.optimizers.legacy.SGD(0.05), loss="mse")
            rng = np.random.RandomState(1)
            x = rng.randn(64, 16).astype("float32")
            y = rng.randn(64, 1).astype("float32")
            if patch:
                memgrad.monkey_patch(checkpoints="memory")
            try:
                with memgrad.record_rewrites() as log:
                    history = model.fit(x, y, epochs=2, batch_size=64, verbose=0, shuffle=False)
            finally:
                memgrad.unpatch()
            results.append({"loss": history.history["loss"],
                            "weights": [w.tolist() for w in model.get_weights()[:2]],
                            "calls": len(log), "segments": log[-1].segments if log else 0})
    plain, patched = results
    weight_error = _relative_error([np.array(w) for w in plain["weights"]],
                                   [np.array(w) for w in patched["weights"]])
    return {"plain_loss": plain["loss"], "patched_loss": patched["loss"],
            "weight_error": weight_error, "calls": patched["calls"],
            "segments": patched["segments"]}


def report():
    return {
        "chain_25": memory_and_gradients(25),
        "chain_100": memory_and_gradients(100),
        "patched_collection": patched_collection(),
        "tf_keras": tf_keras_fit(),
    }


if __name__ == "__main__":
    sys.stdout.write(MARKER + json.dumps(report()) + "\n")
