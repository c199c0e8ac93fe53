"""A Budget's plan and the step's measured peaks on real models (a fresh-process probe).

`plan_and_measure(NAME, LIMIT, CALLS)` builds a model with random weights (nothing is
downloaded), traces `tests.profiler.predict_probe.training_step` under
``memgrad.strategies.Budget(LIMIT)`` (SGD applied after the whole backward pass, as ``fit``
does) and returns the plan: the tensors kept (by name), the ops copied, the candidate and
the figures of ``plan.details``; with CALLS > 0, also the step's measured peaks above
baseline (the allocator's) and, for two profiled calls, the peak of the bytes its buffers
requested (`PeakTensors.requested_peak_bytes`).
"""

import os

os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import memgrad  # noqa: E402
from tests.profiler.predict_probe import training_step  # noqa: E402

# A two-block GPT-2 (keras-hub, random init) and two small keras.applications CNNs.
GPT2 = dict(vocabulary_size=500, num_layers=2, num_heads=2, hidden_dim=64, intermediate_dim=256,
            max_sequence_length=64)
MODELS = ("gpt2", "mobilenet_v3_small", "densenet121")


def _model_and_batch(name):
    keras.utils.set_random_seed(0)
    if name == "gpt2":
        import keras_hub

        model = keras_hub.models.GPT2Backbone(**GPT2)
        length = GPT2["max_sequence_length"]
        inputs = {"token_ids": tf.ones([8, length], tf.int32),
                  "padding_mask": tf.ones([8, length], tf.int32)}
        return model, inputs
    if name == "mobilenet_v3_small":
        model = keras.applications.MobileNetV3Small(input_shape=(32, 32, 3), weights=None,
                                                    classes=10, include_preprocessing=False)
        return model, tf.ones([16, 32, 32, 3])
    if name == "densenet121":
        model = keras.applications.DenseNet121(input_shape=(64, 64, 3), weights=None, classes=10)
        return model, tf.ones([8, 64, 64, 3])
    raise ValueError(f"Expected one of {MODELS}. Received: {name!r}")


def plan_and_measure(name, limit, calls=0):
    """``{"kept": [...], "copied_ops", "candidate", "budget_bytes", "predicted_bytes",
    "plain_bytes", "recomputed_flops", "peaks": [...], "requested": [...], "threads"}``, or
    ``{"refused": message}``."""
    model, inputs = _model_and_batch(name)
    labels = tf.zeros([tf.nest.flatten(inputs)[0].shape[0]], tf.int32)
    step = training_step(model, memgrad.strategies.Budget(limit))
    with memgrad.record_rewrites() as log:
        try:
            step.get_concrete_function(inputs, labels)
        except memgrad.BudgetError as error:
            return {"refused": str(error)[-300:]}
    record = log[-1]
    details = record.plan.details
    result = {"kept": sorted(t.name for t in record.plan.tensors), "copied_ops": record.copied_ops,
              "candidate": details["candidate"],
              **{key: details[key] for key in ("budget_bytes", "predicted_bytes", "plain_bytes",
                                               "recomputed_flops", "scale_source")},
              "threads": os.environ.get("TF_NUM_INTEROP_THREADS")}
    if calls:
        runs = memgrad.profiler.measure_runs(step, (inputs, labels), device="CPU:0", repeats=calls)
        result["peaks"] = [run.peak_above_baseline_bytes for run in runs]
        result["requested"] = [
            memgrad.profiler.largest_live_tensors(
                step, (inputs, labels), k=1, device="CPU:0", warmup=0).requested_peak_bytes
            for _ in range(2)]
    return result
