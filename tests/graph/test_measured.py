"""measured_peak: part of a graph being traced, run once on zeros, in the terms
memgrad.profiler.measure reports."""

import pytest
import tensorflow as tf

import memgrad
from memgrad._src.graph.measured import measured_peak, measured_peaks, writes_state
from memgrad.profiler.workloads import residual_chain


def _gradient_sums(loss, weights):
    return [tf.reduce_sum(g) for g in tf.gradients(loss, weights)]


def test_a_gradient_measured_while_traced_reads_as_the_step_does():
    weights, loss_fn = residual_chain(8, 128)
    x = tf.random.stateless_normal([1024, 128], [0, 1])
    found = {}

    @tf.function
    def step(x):
        sums = _gradient_sums(loss_fn(x), weights)
        found["peak"] = measured_peak(tf.compat.v1.get_default_graph(), sums, "CPU:0")
        return tf.add_n(sums)

    step.get_concrete_function(x)
    measured = sorted(memgrad.profiler.measure(step, (x,), device="CPU:0").peak_above_baseline_bytes
                      for _ in range(3))[1]
    # Eight [1024, 128] layers: each keeps its input and ReLU's output, 0.5 MiB apiece.
    assert found["peak"] >= 8 * 2**20
    assert abs(found["peak"] - measured) <= 0.1 * measured, (found["peak"], measured)


def test_a_step_that_would_write_a_variable_is_not_run():
    counter = tf.Variable(0.0)
    w = tf.Variable(tf.ones([4, 4]))
    found = {}

    @tf.function
    def step(x):
        counter.assign_add(1.0)
        with tf.control_dependencies([counter.assign_add(1.0)]):
            loss = tf.reduce_sum(tf.tanh(x @ w))
        sums = _gradient_sums(loss, [w])
        found["peak"] = measured_peak(tf.compat.v1.get_default_graph(), sums, "CPU:0")
        return sums

    step.get_concrete_function(tf.ones([2, 4]))
    assert found["peak"] is None
    assert counter.numpy() == 0.0  # tracing ran nothing


def test_an_input_without_a_static_shape_is_not_run():
    w = tf.Variable(tf.ones([4, 4]))
    found = {}

    @tf.function(input_signature=[tf.TensorSpec([None, 4])])
    def step(x):
        sums = _gradient_sums(tf.reduce_sum(tf.tanh(x @ w)), [w])
        found["peak"] = measured_peak(tf.compat.v1.get_default_graph(), sums, "CPU:0")
        return sums

    step.get_concrete_function()
    assert found["peak"] is None


@pytest.mark.parametrize("op, refused", [("AssignAddVariableOp", True), ("ReadVariableOp", False),
                                         ("VariableShape", False), ("ResourceGather", False),
                                         ("RandomUniform", False), ("RngReadAndSkip", True),
                                         ("MatMul", False)])
def test_which_ops_count_as_writing_state(op, refused):
    graph_def = tf.compat.v1.GraphDef()
    graph_def.node.add(name="n", op=op)
    assert (writes_state(graph_def) == op) is refused


def test_a_keras_lstm_is_measured():
    """A loop reading its weights' shapes (VariableShape, stateful only in name) runs."""
    from memgrad.profiler.workloads import lstm_regressor

    model = lstm_regressor(layers=1, units=16, steps=32, features=4, seed=0)
    weights = model.trainable_variables
    found = {}

    @tf.function
    def step(x):
        sums = _gradient_sums(tf.reduce_mean(model(x, training=True) ** 2), weights)
        found["peak"] = measured_peak(tf.compat.v1.get_default_graph(), sums, "CPU:0")
        return sums

    step.get_concrete_function(tf.random.stateless_normal([8, 32, 4], [0, 1]))
    assert found["peak"] is not None and found["peak"] > 0


def test_each_run_is_reported_and_the_peak_is_their_median(monkeypatch):
    """Five runs whose allocator peaks read 3, 9, 4, 5 and 6 MiB above a zero baseline."""
    peaks, resets = [3, 9, 4, 5, 6], []
    monkeypatch.setattr(tf.config.experimental, "reset_memory_stats", lambda device: resets.append(device))
    monkeypatch.setattr(tf.config.experimental, "get_memory_info",
                        lambda device: dict(current=0, peak=peaks[len(resets) % 5 - 1] * 2**20 if resets else 0))
    found = {}

    @tf.function
    def step(x):
        sums = [tf.reduce_sum(tf.tanh(x))]
        graph = tf.compat.v1.get_default_graph()
        found["runs"] = measured_peaks(graph, sums, "CPU:0", count_outputs=True)
        found["peak"] = measured_peak(graph, sums, "CPU:0", count_outputs=True)
        return sums

    step.get_concrete_function(tf.ones([4, 4]))
    assert found["runs"] == [n * 2**20 for n in (3, 4, 5, 6, 9)]
    assert found["peak"] == 5 * 2**20
