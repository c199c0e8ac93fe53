"""largest_live_tensors: the buffers alive at a step's peak, read from TensorFlow's profiler."""

import pytest
import tensorflow as tf

from memgrad._src.profiler import live
from memgrad._src.profiler.live import LiveTensor, largest_live_tensors, replay, requested_peak


def _alloc(address, usage, nbytes, op, shape="[1]", dtype=1):
    return (0, "MemoryAllocation", {"addr": address, "bytes_allocated": usage, "requested_bytes": nbytes,
                                    "tf_op": op, "shape": shape, "data_type": dtype})


def _free(address, usage, nbytes=0):
    return (0, "MemoryDeallocation", {"addr": address, "bytes_allocated": usage, "allocation_bytes": nbytes})


def test_replay_lists_what_was_alive_at_the_highest_usage():
    events = [_alloc(1, 100, 100, "a"), _alloc(2, 400, 300, "b", "[3,25]"), _free(1, 300),
              _alloc(3, 350, 50, "c"), _free(2, 50), _alloc(4, 250, 200, "d")]
    peak = replay(events, k=5)
    assert peak.peak_bytes == 400
    assert peak.tensors == (LiveTensor("b", "[3,25]", "float32", 300), LiveTensor("a", "[1]", "float32", 100))
    assert peak.other_bytes == 0
    top1 = replay(events, k=1)
    assert [t.op for t in top1.tensors] == ["b"] and top1.other_bytes == 100


def test_the_requested_peak_leaves_out_the_allocators_fitting():
    # The allocator gave 512 B for a 300-B request (its usage, not the request, says so); a
    # buffer from before the call (address 9) released during it is credited at its size.
    events = [_alloc(1, 612, 100, "a"), _alloc(2, 1124, 300, "b"), _free(9, 900, 224),
              _free(1, 800, 100), _alloc(3, 1000, 250, "c"), _free(2, 488), _alloc(4, 1200, 300, "d")]
    # a + b = 400; then 400 - 224 - 100 + 250 = 326, less b (300), plus d: 326.
    assert requested_peak(events) == 400 and replay(events, k=1).requested_peak_bytes == 400
    assert replay(events, k=1).peak_bytes == 1200
    # An address allocated again without its release recorded counts its new size only.
    assert requested_peak([_alloc(1, 100, 100, "a"), _alloc(1, 200, 40, "b"), _alloc(2, 300, 30, "c")]) == 100


def test_the_requested_peak_counts_a_variable_whose_storage_moves_once():
    # Keras's assign_sub writes the new value to a new buffer and frees the old storage (from
    # before the step): three weights of 400 B updated one after another, then a 500-B
    # gradient. Only the gradient is above the baseline at the end.
    events = []
    for weight in range(3):
        events += [_alloc(20 + weight, 0, 400, f"sgd/sub_{weight}"), _free(10 + weight, 0, 400)]
    events += [_alloc(2, 0, 500, "gradient"), _free(2, 0, 500)]
    assert requested_peak(events) == 500
    # As the allocator's usage does, a call that releases more from before than it makes
    # stays at or below its baseline: nothing above it.
    assert requested_peak([_free(9, 0, 400), _alloc(1, 0, 100, "a"), _alloc(2, 0, 200, "b")]) == 0


def test_a_variable_whose_storage_moves_during_the_step_is_counted_once():
    # An assignment can adopt its value's buffer and free the variable's old one: the weight's
    # bytes are then a buffer made during the step. Baseline: the weight (400 B) and an input (100 B).
    weight = tf.Variable(tf.zeros([100]))
    events = [_alloc(1, 800, 300, "dense/MatMul"), _alloc(10, 1200, 400, "sgd/mul"), _free(9, 800, 400),
              _alloc(2, 1300, 500, "gradient_tape/dense/MatMul"), _free(2, 800, 500), _free(1, 500, 300)]
    split = live.categorize(events, 500, [weight], [], "CPU:0", k=5)
    assert split.peak_bytes == 1300 and split.total_bytes == 1300, split
    assert (split.weights, split.inputs_and_other, split.activations, split.temporaries) == (400, 100, 300, 500)
    assert "sgd/mul" not in [t.op for t in split.tensors]
    # A new value still alive at the peak next to the old storage is a buffer of its own.
    before = [_alloc(10, 900, 400, "sgd/mul"), _alloc(2, 1400, 500, "gradient_tape/dense/MatMul"),
              _free(2, 900, 500), _free(9, 500, 400)]
    split = live.categorize(before, 500, [weight], [], "CPU:0", k=5)
    assert split.total_bytes == split.peak_bytes == 1400 and split.temporaries == 500, split
    assert split.activations == 400  # the new value, made outside a gradient scope


@pytest.mark.memory
def test_the_step_peak_holds_the_activations_plain_backprop_keeps():
    width, batch, depth = 256, 512, 6
    kernels = [tf.Variable(tf.random.stateless_normal([width, width], [0, i]) * 0.05) for i in range(depth)]

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            h = x
            for i, kernel in enumerate(kernels):
                h = tf.tanh(tf.matmul(h, kernel, name=f"layer{i}"))
            loss = tf.reduce_sum(h)
        return tape.gradient(loss, kernels)

    x = tf.ones([batch, width])
    peak = largest_live_tensors(step, args=(x,), k=4, device="CPU:0")
    activation = batch * width * 4
    assert len(peak.tensors) == 4
    assert all(t.bytes == activation and t.shape == f"[{batch},{width}]" and t.dtype == "float32"
               for t in peak.tensors), peak
    # Plain backprop keeps the forward activations until their gradients are taken.
    assert sum(t.op.startswith("layer") for t in peak.tensors) >= 2, peak
    assert peak.peak_bytes >= sum(t.bytes for t in peak.tensors)
    assert "largest tensors alive at the peak" in str(peak)


def test_args_other_than_a_sequence_or_a_tensor_are_rejected():
    with pytest.raises(TypeError, match=r"Expected args to be a tuple or list.*Received: 5"):
        largest_live_tensors(lambda x: x, args=5)


def test_bad_k_is_rejected():
    with pytest.raises(ValueError, match="k to be an int >= 1"):
        largest_live_tensors(tf.function(lambda: tf.ones([2])), k=0)


def test_no_events_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(live, "_allocation_events", lambda space, device: [])
    with pytest.raises(RuntimeError, match="recorded no allocation"):
        largest_live_tensors(tf.function(lambda x: x * 2.0), args=(tf.ones([4]),), device="CPU:0")


def test_a_live_tensor_prints_as_one_report_line():
    from memgrad.profiler import LiveTensor

    named = LiveTensor(op="model/dense/MatMul", shape="[512,256]", dtype="float32", bytes=524288,
                       layer="model/dense", category="activations")
    assert str(named) == "   512.00 KiB  float32   [512,256]            model/dense  [activations]"
    # No layer: the op names it; no category: none shown.
    assert str(LiveTensor(op="MatMul", shape="[2]", dtype="float32", bytes=8)) == (
        "          8 B  float32   [2]                  MatMul")


def test_onednn_enabled_follows_the_environment_when_it_says():
    import os

    import memgrad

    said = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    if said not in ("0", "1"):
        pytest.skip("TF_ENABLE_ONEDNN_OPTS unset: TensorFlow decides by the CPU")
    assert memgrad.profiler.onednn_enabled() is (said == "1")
