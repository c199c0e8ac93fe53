"""Predicted against measured peaks of real models' training steps (fresh-process probes),
and the workloads `predict_max_batch_size` is checked on against the emulated small device.

Every model is built with random weights (keras.applications with ``weights=None``, keras-hub
backbones from a config): nothing is downloaded.
"""

import os
import re

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


def max_batch_predicted_and_found(limit, overhead_bytes):
    """The largest GPT-2 batch under ``limit``: predicted, and found on the emulated device."""
    predicted = memgrad.profiler.predict_max_batch_size(gpt2_build, limit, low=1, high=512,
                                                        overhead_bytes=overhead_bytes)
    found = memgrad.profiler.max_batch_size("tests.profiler.predict_probe:gpt2_run", limit,
                                            low=1, high=512, start=max(predicted.batch_size, 1))
    return {"predicted": predicted.batch_size, "found": found.batch_size,
            "traces": len(predicted.probes), "runs": len(found.probes)}


def _median_peak(step, args, calls=7):
    """The median peak above baseline of ``calls`` calls of ``step(*args)``: a step's peak
    moves from call to call by up to 10% here, and in the budget sweep a median of three
    calls of one plan read 22.5 MiB where 'memory' read 20.4 in the same process."""
    return sorted(memgrad.profiler.measure(step, args, device="CPU:0", warmup=int(i == 0))
                  .peak_above_baseline_bytes for i in range(calls))[calls // 2]


def budget_sweep(fractions, batch_size=8):
    """Measured peaks above baseline (median of seven calls) of the GPT-2 backbone's training
    step under ``memgrad.strategies.Budget(f)`` for each fraction, with the plans' figures:
    ``{"measured", "predicted", "budget", "candidate", "recomputed", "within_margin",
    "smallest_fraction": [...], "plain", "memory": bytes, "memory_budget": {...}}``, lists in
    the given order (``within_margin``: False for a plan settled on as the least peak); a
    fraction that raised BudgetError has None figures and the smallest fraction the error
    named. "memory_budget" is a byte Budget of 1.05x what the 'memory' strategy measures:
    its budget, measured peak and whether it was refused; when refused, the budget the
    error names ("named") is planned in turn, with its measured peak ("named_measured")."""
    model = _gpt2_backbone()
    inputs, labels = _batch(model, batch_size)
    result = {"measured": [], "predicted": [], "budget": [], "candidate": [], "recomputed": [], "within_margin": [],
              "smallest_fraction": []}

    def planned(checkpoints):
        step = training_step(model, checkpoints)
        with memgrad.record_rewrites() as log:
            step.get_concrete_function(inputs, labels)
        return step, log[-1].plan.details

    for fraction in fractions:
        try:
            step, details = planned(memgrad.strategies.Budget(fraction))
        except memgrad.BudgetError as error:  # autograph keeps the type, not the attributes
            named = re.search(r"a fraction of at least ([0-9.]+)", str(error))
            result["smallest_fraction"].append(float(named.group(1)) if named else None)
            for key in ("measured", "predicted", "budget", "candidate", "recomputed", "within_margin"):
                result[key].append(None)
            continue
        result["smallest_fraction"].append(None)
        result["predicted"].append(details["predicted_bytes"])
        result["budget"].append(details["budget_bytes"])
        result["candidate"].append(details["candidate"])
        result["recomputed"].append(details["recomputed_flops"])
        result["within_margin"].append(details["within_margin"])
        result["measured"].append(_median_peak(step, (inputs, labels)))
    result["plain"] = _median_peak(training_step(model), (inputs, labels))
    result["memory"] = _median_peak(training_step(model, "memory"), (inputs, labels))
    budget = int(1.05 * result["memory"])
    try:
        step, _ = planned(memgrad.strategies.Budget(budget))
        result["memory_budget"] = {"budget": budget, "refused": False,
                                   "measured": _median_peak(step, (inputs, labels))}
    except memgrad.BudgetError as error:
        named = float(re.search(r"a budget of at least ([0-9.]+) MiB", str(error)).group(1))
        named = int((named + 0.005) * 2**20) + 1  # the error rounds to 0.01 MiB
        step, _ = planned(memgrad.strategies.Budget(named))
        result["memory_budget"] = {"budget": budget, "refused": str(error)[-400:], "measured": None,
                                   "named": named, "named_measured": _median_peak(step, (inputs, labels))}
    return result


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
