"""Leaf gradients first (`order.leaves_first`): the backward ops that continue past a layer
wait for its weights' gradients, so what only those read is freed before the chain goes on;
the values never change and no cycle is ever made."""

import numpy as np
import tensorflow as tf

import memgrad
from memgrad._src import tf_internals
from memgrad._src.checkpointing import order
from memgrad._src.graph.view import tensor_bytes


def _two_layers(graph, batch=8):
    """y = sum(tanh(tanh(x @ w1) @ w2)) in ``graph``, with its plain gradients for w1, w2, x."""
    with graph.as_default():
        x = tf.constant(np.linspace(-1, 1, 3 * batch).reshape(batch, 3), tf.float32)
        w1 = tf.constant(np.linspace(-0.5, 0.5, 15).reshape(3, 5), tf.float32)
        w2 = tf.constant(np.linspace(0.3, -0.3, 10).reshape(5, 2), tf.float32)
        y = tf.reduce_sum(tf.tanh(tf.matmul(tf.tanh(tf.matmul(x, w1)), w2)))
        mark = tf_internals.op_mark(graph)
        dw1, dw2, dx = tf.gradients(y, [w1, w2, x])
    return mark, dw1, dw2, dx


def _run(graph, tensors):
    with tf.compat.v1.Session(graph=graph) as session:
        return session.run(tensors)


def test_the_ops_after_a_layers_input_gradient_wait_for_its_weights_gradient():
    plain_graph, graph = tf.Graph(), tf.Graph()
    expected = _run(plain_graph, list(_two_layers(plain_graph)[1:]))
    mark, dw1, dw2, dx = _two_layers(graph)
    with graph.as_default():
        added = order.leaves_first(graph, mark, [dw1, dw2], tensor_bytes)
    # dw2 = h^T dz reads the hidden activation h; dh = dz w2^T goes on, and the op reading
    # dh (tanh's gradient) waits for dw2; the chain's end (dx = dpre w1^T, read by no op of
    # this call) waits for dw1.
    tanh_grad = dw1.op.inputs[1].op
    assert tanh_grad.type == "TanhGrad"
    assert added == 2
    assert dw2.op in tanh_grad.control_inputs
    assert dw1.op in dx.op.control_inputs
    for got, want in zip(_run(graph, [dw1, dw2, dx]), expected):
        np.testing.assert_array_equal(got, want)


def test_a_weight_gradient_larger_than_what_it_reads_is_not_ordered_first():
    """With a batch of 3, dw1 (3x5) is larger than the input x (3x3) it frees: an optimizer
    that applies it late would hold more than running it first saves."""
    graph = tf.Graph()
    mark, dw1, dw2, dx = _two_layers(graph, batch=3)
    with graph.as_default():
        added = order.leaves_first(graph, mark, [dw1, dw2], tensor_bytes)
    assert added == 1  # dw2 (5x2) reads h (3x5): still first
    assert dw1.op not in dx.op.control_inputs


def test_an_order_that_would_make_a_cycle_adds_nothing():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant([[0.5, -0.25]])
        saved = tf.ones([64])  # an activation the leaf gradient reads (and would free)
        mark = tf_internals.op_mark(graph)
        with tf.name_scope("f_grad"):  # one gradient function's ops
            incoming = tf.identity(x)
            chain = tf.tanh(incoming)  # the sibling that goes on
            later = tf.exp(chain)  # what would wait for the leaf gradient...
            beside = later * 2.0
            leaf = incoming * tf.reduce_sum(later) * tf.reduce_sum(saved)  # ...reads it: a cycle
        before = {op: list(op.control_inputs) for op in graph.get_operations()}
        added = order.leaves_first(graph, mark, [leaf], tensor_bytes)
    assert added == 0
    assert {op: list(op.control_inputs) for op in graph.get_operations()} == before
    values = np.array([[0.5, -0.25]])
    np.testing.assert_allclose(_run(graph, [leaf, beside])[0], values * np.exp(np.tanh(values)).sum() * 64, rtol=1e-5)


def test_nothing_is_ordered_without_new_ops_or_leaf_gradients():
    graph = tf.Graph()
    mark, dw1, _, _ = _two_layers(graph)
    later = tf_internals.op_mark(graph)
    assert order.leaves_first(graph, later, [dw1], tensor_bytes) == 0
    assert order.leaves_first(graph, mark, [None], tensor_bytes) == 0


def test_memory_gradients_match_plain_with_a_weight_read_by_two_layers():
    """A weight read by two layers: its gradient is a sum of two parts, each ordered against
    its own layer; 'memory' in a tf.function still gives plain autodiff's values."""
    w = tf.Variable(tf.random.stateless_normal([16, 16], seed=[1, 2]) * 0.3)
    v = tf.Variable(tf.random.stateless_normal([16, 16], seed=[3, 4]) * 0.3)
    x = tf.random.stateless_normal([8, 16], seed=[5, 6])

    def loss():
        h = x
        for weight in (w, v, w, v, w, v):
            h = tf.tanh(h @ weight) + h
        return tf.reduce_sum(h * h)

    @tf.function
    def grads(tape_class, **kwargs):
        with tape_class(**kwargs) as tape:
            value = loss()
        return tape.gradient(value, [w, v])

    got = grads(memgrad.GradientTape, checkpoints="memory")
    want = grads(tf.GradientTape)
    for g, e in zip(got, want):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-5, atol=1e-6)
