"""Memory by category, the OOM report, and `measure` with no environment set in either import order."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from memgrad.profiler import OutOfMemoryError, explain_oom, memory_by_category, oom_report

_UNSET = {"TF_CPU_ALLOCATOR_USE_BFC": None}  # as a user's shell has it
# TensorFlow started before memgrad: without oneDNN its default CPU allocator keeps no statistics
# and measure raises. oneDNN's allocator (TensorFlow's default on AVX-512 CPUs) keeps coarse ones,
# and measure warns instead: tests/profiler/test_measure.py checks that case.
_UNSET_WITHOUT_ONEDNN = {**_UNSET, "TF_ENABLE_ONEDNN_OPTS": "0"}
FRESH_PROCESSES = {
    # Cold: a warm interpreter has imported TensorFlow already (conftest.py).
    **{order: dict(target="tests.profiler.import_order_probe:measure_after", args=[order], env=_UNSET,
                   timeout=300, warm=False) for order in ("memgrad first", "tensorflow first")},
    "an op first": dict(target="tests.profiler.import_order_probe:measure_after", args=["an op first"],
                        env=_UNSET_WITHOUT_ONEDNN, timeout=300, warm=False),
    "oom": dict(target="tests.profiler.import_order_probe:capped_oom_report", timeout=600,
                expected_s=40),  # wall time in CI's memory pass (the longest start first: conftest.py)
    "conv": dict(target="tests.profiler.import_order_probe:conv_categories", timeout=600),
    "mlp": dict(target="tests.profiler.import_order_probe:mlp_categories", timeout=600),
}


def _closest(split):
    """Of the peaks `measure` found on single calls of the step, the one nearest the split's
    total: the categories must add up to a peak the step really reaches."""
    return min(split["measured_peaks"], key=lambda peak: abs(peak - split["total_bytes"]))


@pytest.fixture(scope="module")
def probes(fresh_results):
    return fresh_results


@pytest.mark.memory
@pytest.mark.parametrize("order", [pytest.param(order, marks=pytest.mark.fresh(order))
                                   for order in ("memgrad first", "tensorflow first")])
def test_measure_works_with_no_environment_in_either_import_order(probes, order):
    result = probes[order]
    assert "error" not in result, result
    # tanh(x) * 2 on 512x512 float32: two 1 MiB tensors at most, one at least.
    assert 2**20 <= result["peak_above_baseline_bytes"] <= 2 * 2**20 + 2**16, result


@pytest.mark.memory
@pytest.mark.fresh("an op first")
def test_measure_after_tensorflow_started_says_the_one_thing_to_do(probes):
    result = probes["an op first"]
    assert result["error"] == "MemoryStatsUnavailableError"
    assert "\n" not in result["message"]
    assert "import memgrad before running any TensorFlow op" in result["message"], result


def _variable_bytes(variables):
    return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables)


def _mlp_step(optimizer):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((512,))] + [keras.layers.Dense(512, activation="relu")
                                                       for _ in range(6)] + [keras.layers.Dense(10)])

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True)))
        grads = tape.gradient(loss, model.trainable_weights)
        # Adam starts once every gradient is made. Without this barrier its updates interleave
        # with the backward pass in an order the executor's cost estimates decide, one thread or
        # not, and in some processes no gradient is alive at the peak (seen on CI, oneDNN off).
        with tf.control_dependencies(grads):
            grads = [tf.identity(grad) for grad in grads]
        optimizer.apply(grads, model.trainable_weights)
        return loss

    return model, step


def _conv_step(tape_class=tf.GradientTape):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((32, 32, 8))] + [
        keras.layers.Conv2D(16, 3, padding="same", activation="relu") for _ in range(16)] + [
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])

    @tf.function
    def step(x):
        with tape_class() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True)))
        grads = tape.gradient(loss, model.trainable_weights)
        for variable, grad in zip(model.trainable_weights, grads):
            variable.assign_sub(1e-3 * grad)
        return loss

    return model, step


@pytest.mark.memory
@pytest.mark.fresh("mlp")
def test_categories_sum_to_the_measured_peak_on_an_mlp_with_adam(probes):
    split = probes["mlp"]
    # The allocator's own usage at the peak of the profiled call, rebuilt buffer by buffer.
    assert split["total_bytes"] == pytest.approx(split["peak_bytes"], rel=0.01), split
    assert split["total_bytes"] == pytest.approx(_closest(split), rel=0.05), split
    assert split["weights"] == split["weights_expected"] > 0
    assert split["optimizer"] == split["optimizer_expected"] > 2 * split["weights"]  # two slots per weight
    # Adam waits for every gradient (the barrier in _mlp_step), so they are alive at the peak:
    # 0.83-1.08x of the weights' bytes measured in nine processes, oneDNN on and off.
    assert split["gradients"] > 0.5 * split["weights"], split
    assert all(t["category"] in ("activations", "gradients", "temporaries") for t in split["tensors"])
    assert "weights" in split["text"] and "largest tensors alive at the peak" in split["text"]


@pytest.mark.memory
@pytest.mark.fresh("conv")
def test_categories_of_a_conv_net_sum_to_the_peak_and_show_what_checkpointing_removes(probes):
    found = probes["conv"]
    for name, split in found.items():
        assert split["total_bytes"] == pytest.approx(split["peak_bytes"], rel=0.01), (name, split)
        assert split["total_bytes"] == pytest.approx(_closest(split), rel=0.05), (name, split)
        assert split["weights"] == split["weights_expected"] > 0
    activation = 32 * 32 * 32 * 16 * 4  # one conv layer's output: 2 MiB
    # Measured: plain holds 15 of the 16 conv outputs at its peak (30.0 MiB) next to 51 MiB of
    # Eigen's convolution scratch (temporaries); checkpointing holds 22.0 MiB of activations.
    assert found["plain"]["activations"] >= 12 * activation, found["plain"]
    assert found["plain"]["temporaries"] > 0
    assert found["memory"]["activations"] < 0.8 * found["plain"]["activations"], found


@pytest.mark.memory
@pytest.mark.fresh("oom")
def test_the_oom_report_on_the_emulated_device_names_the_largest_live_tensor(probes):
    result = probes["oom"]
    assert result["fits"] is False and "OOM when allocating tensor with shape" in result["message"]
    tensors = result["report"]["memory"]["tensors"]
    largest = tensors[0]
    # The widest layer's output, [512, 4096] float32 (8 MiB), kept for backprop.
    assert largest["shape"] == "[512,4096]" and largest["bytes"] == 512 * 4096 * 4, tensors
    assert largest["layer"].split("/")[-1].startswith("wide") and largest["category"] == "activations"
    assert largest["bytes"] == max(t["bytes"] for t in tensors)
    assert "largest tensors alive at the peak" in result["text"] and "wide" in result["text"]


def test_explain_oom_reruns_a_failed_step_under_the_profiler_and_raises_with_the_report():
    calls = []

    def step(n):
        calls.append(n)
        held = tf.fill([n, 1024], 1.0)  # alive when the step fails
        raise tf.errors.ResourceExhaustedError(
            None, None, f"OOM when allocating tensor with shape[{n},4096] and type float on CPU:0")

    with pytest.raises(OutOfMemoryError) as caught:
        explain_oom(k=3, device="CPU:0")(step)(256)
    assert isinstance(caught.value, tf.errors.ResourceExhaustedError) and calls == [256, 256]
    report = caught.value.report
    assert report.message == "OOM when allocating tensor with shape[256,4096] and type float"
    assert report.tensors[0].shape == "[256,1024]" and report.tensors[0].bytes == 256 * 1024 * 4
    assert "OOM when allocating" in str(caught.value) and "in use when it failed" in str(caught.value)


def test_explain_oom_passes_results_through_and_oom_report_is_none_when_it_fits():
    step = explain_oom(tf.function(lambda x: tf.reduce_sum(x * 2.0)))
    assert float(step(tf.ones([4]))) == 8.0
    assert oom_report(tf.function(lambda x: x + 1.0), tf.ones([4]), device="CPU:0") is None


def test_bad_arguments_are_clear_errors():
    with pytest.raises(TypeError, match="explain_oom expected a callable step. Received: 5"):
        explain_oom(5)
    with pytest.raises(TypeError, match=r"Expected weights to be variables .*Received: 3"):
        memory_by_category(tf.function(lambda: tf.ones([2])), weights=[3])
    with pytest.raises(ValueError, match="k to be an int >= 1"):
        memory_by_category(tf.function(lambda: tf.ones([2])), k=0)
