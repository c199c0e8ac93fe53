"""Predicted against measured peaks of real models' training steps (fresh-process probes),
and the workloads `predict_max_batch_size` is checked on against the emulated small device.

Every model is built with random weights (keras.applications with ``weights=None``, keras-hub
backbones from a config): nothing is downloaded.
"""

import os

import keras
import tensorflow as tf

import memgrad

GPT2 = dict(vocabulary_size=1000, num_layers=2, num_heads=2, hidden_dim=128, intermediate_dim=512,
            max_sequence_length=128)


def _gpt2_backbone():
    import keras_hub

    keras.utils.set_random_seed(0)
    return keras_hub.models.GPT2Backbone(**GPT2)


def _cnn(name, image_size):
    keras.utils.set_random_seed(0)
    return getattr(keras.applications, name)(weights=None, input_shape=(image_size, image_size, 3), classes=10)


def training_step(model, checkpoints=None):
    """A `tf.function` training step: the loss's gradients, applied by SGD after the whole
    backward pass (as Keras's fit does). ``checkpoints``: a memgrad strategy, or None for
    plain `tf.GradientTape`."""
    variables = model.trainable_variables
    optimizer = keras.optimizers.SGD(0.0)
    optimizer.build(variables)
    text = isinstance(model.input, dict)

    @tf.function
    def step(inputs, labels):
        tape = memgrad.GradientTape(checkpoints=checkpoints) if checkpoints else tf.GradientTape()
        with tape:
            outputs = model(inputs, training=True)
            if text:
                loss = tf.add_n([tf.reduce_mean(tf.square(o)) for o in tf.nest.flatten(outputs)
                                 if o.dtype.is_floating])
            else:
                loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, outputs))
        optimizer.apply(tape.gradient(loss, variables), variables)
        return loss

    return step


def _batch(model, batch_size, spec=False):
    make = (lambda shape, dtype: tf.TensorSpec(shape, dtype)) if spec else (
        lambda shape, dtype: tf.ones(shape, dtype))
    labels = make([batch_size], tf.int32)
    if isinstance(model.input, dict):
        length = GPT2["max_sequence_length"]
        return {"token_ids": make([batch_size, length], tf.int32),
                "padding_mask": make([batch_size, length], tf.int32)}, labels
    return make([batch_size, *model.input.shape[1:]], tf.float32), labels


def _model(name, image_size=64):
    return _gpt2_backbone() if name == "GPT2" else _cnn(name, image_size)


def predicted_and_measured(name, batch_size, checkpoints=None, image_size=64):
    """``{"predicted": bytes, "measured": bytes, "notes": [...]}``: the predicted and the
    measured (median of three) peak above baseline of one training step."""
    model = _model(name, image_size)
    step = training_step(model, checkpoints)
    inputs, labels = _batch(model, batch_size)
    prediction = memgrad.profiler.predict_peak(step, (inputs, labels))
    measured = _median_peak(step, (inputs, labels), calls=3)
    return {"predicted": prediction.peak_above_baseline_bytes, "measured": measured,
            "notes": list(prediction.notes), "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS")}


def gpt2_run(batch_size):
    """One training step of the GPT-2 backbone at ``batch_size`` (a `run_capped` target)."""
    model = _gpt2_backbone()
    step = training_step(model)
    step(*_batch(model, batch_size))


def gpt2_build(batch_size):
    """``(step, argument specs)`` of the same step, for `predict_max_batch_size`."""
    model = _gpt2_backbone()
    return training_step(model), _batch(model, batch_size, spec=True)


def max_batch_predicted_and_bracketed(limit, overhead_bytes, rtol=0.2):
    """The largest GPT-2 batch under ``limit`` predicted, and the two emulated-device runs that
    bracket it: the largest batch that fits is within ``rtol`` of the prediction exactly when
    ``below = ceil(predicted / (1 + rtol))`` fits and ``above = floor(predicted / (1 - rtol)) + 1``
    does not. ``below`` runs under the cap; ``above`` runs under four times the cap and does
    not fit when its allocator's peak exceeds the cap (the cap counts that same allocator), so
    neither run waits out TensorFlow's retries after an out-of-memory (about 20 s). Two
    runs side by side, where a search for the exact batch takes five or more."""
    import concurrent.futures
    import math

    predicted = memgrad.profiler.predict_max_batch_size(gpt2_build, limit, low=1, high=512,
                                                        overhead_bytes=overhead_bytes).batch_size
    below = max(1, math.ceil(predicted / (1 + rtol)))
    above = math.floor(predicted / (1 - rtol)) + 1

    def run(batch_size, cap):
        return memgrad.profiler.run_capped("tests.profiler.predict_probe:gpt2_run", cap,
                                           {"batch_size": batch_size}, timeout=600)

    cap = memgrad.profiler.parse_bytes(limit)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(run, (below, above), (limit, 4 * cap)))
    over = runs[1].peak_bytes is None or runs[1].peak_bytes > cap
    return {"predicted": predicted, "below": below, "above": above,
            "below_fits": runs[0].fits, "above_fits": not over,
            "peaks": [r.peak_bytes for r in runs]}


def _median_peak(step, args, calls=3):
    """The median peak above baseline of ``calls`` calls of ``step(*args)`` (a step's peak
    moves from call to call by up to 10%)."""
    runs = memgrad.profiler.measure_runs(step, args, device="CPU:0", repeats=calls)
    return sorted(run.peak_above_baseline_bytes for run in runs)[calls // 2]


def _xla_inner_step():
    """A step whose one XLA-compiled call holds a 16 MiB temporary for a scalar result."""
    weights = tf.Variable(tf.random.normal([256, 2048], seed=1))

    @tf.function(jit_compile=True)
    def inner(x):
        return tf.reduce_sum(tf.tanh(tf.matmul(x, weights)))

    @tf.function
    def step(x):
        return inner(x) * 2.0

    return step, tf.ones([2048, 256])


def _conv_gradient_step():
    """Gradients of a 1x1 convolution: Eigen's Conv2DBackpropInput/Filter allocate a working
    set of up to about 32 MiB (without oneDNN), far above the 0.4 MiB tensors."""
    keras.utils.set_random_seed(0)
    conv = keras.layers.Conv2D(24, 1)
    x = tf.ones([16, 16, 16, 96])
    conv.build(x.shape)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(conv(x) ** 2)
        return tape.gradient(loss, [x, *conv.trainable_variables])

    return step, x


def scratch_predicted_and_measured():
    """``{name: {"with": bytes, "without": bytes, "measured": bytes}}``: predicted peaks above
    baseline with and without kernels' measured scratch, and measured (median of three), for
    a step with an XLA-compiled call and for a convolution's gradients."""
    result = {}
    for name, build in (("xla", _xla_inner_step), ("conv", _conv_gradient_step)):
        step, x = build()
        result[name] = {
            "with": memgrad.profiler.predict_peak(step, x).peak_above_baseline_bytes,
            "without": memgrad.profiler.predict_peak(step, x, scratch=False).peak_above_baseline_bytes,
            "measured": _median_peak(step, (x,), calls=3),
        }
    return result
