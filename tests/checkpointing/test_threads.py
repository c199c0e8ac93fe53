"""memgrad.gradients from several Python threads: what it changes in TensorFlow's
`gradients_util` and `gen_math_ops` while it builds gradients is held by one thread at a time
and restored on every exit path."""

import threading

import numpy as np
import pytest
import tensorflow as tf

import memgrad
from memgrad._src.checkpointing import gradient_walk
from memgrad._src.tf_internals import gen_math_ops, gradients_util

SWAPPED = ("_MultiDeviceAddN", "_Consumers", "_IsPartitionedCall")
JOIN_TIMEOUT_S = 120


def _tensorflows_own():
    return dict({name: getattr(gradients_util, name) for name in SWAPPED}, add_n=gen_math_ops.add_n)


def _chain_step(seed, checkpoints):
    """A tanh chain's loss and its gradients by ``checkpoints`` ('plain': tf.gradients)."""
    weights = [tf.Variable(tf.random.stateless_normal([64, 64], seed=[seed, i]) / 8.0) for i in range(12)]

    @tf.function
    def step(x):
        h = x
        for w in weights:
            h = tf.tanh(h @ w)
        loss = tf.reduce_sum(h * h)
        if checkpoints == "plain":
            return tf.gradients(loss, weights)
        return memgrad.gradients(loss, weights, checkpoints=checkpoints)

    return step


def test_memgrad_gradients_from_two_threads_at_once():
    own = _tensorflows_own()
    x = tf.random.stateless_normal([32, 64], seed=[9, 9])
    cases = [(seed, mode) for seed in (1, 2) for mode in ("memory", "speed")]
    expected = {case: [g.numpy() for g in _chain_step(case[0], "plain")(x)] for case in cases}
    results, errors = {}, []
    start = threading.Barrier(len(cases))

    def run(case):
        try:
            step = _chain_step(*case)
            start.wait()  # every thread traces (and so builds its gradients) at the same moment
            results[case] = [g.numpy() for g in step(x)]
        except Exception as error:  # reported below, with the case
            errors.append((case, repr(error)))

    threads = [threading.Thread(target=run, args=(case,), name=f"memgrad-{case}") for case in cases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_TIMEOUT_S)
    assert not any(thread.is_alive() for thread in threads), "a thread hung building its gradients"
    assert not errors, errors
    for case in cases:
        for got, want in zip(results[case], expected[case]):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    assert _tensorflows_own() == own


def test_a_second_thread_waits_for_the_first_ones_swap():
    """Without the lock the second thread would save the first one's replacement as the
    original and put it back last: TensorFlow's own function would be lost."""
    own = _tensorflows_own()
    first_in, first_may_leave, second_in = threading.Event(), threading.Event(), threading.Event()

    def first():
        with gradient_walk.indexed_captures():
            first_in.set()
            first_may_leave.wait(JOIN_TIMEOUT_S)

    def second():
        first_in.wait(JOIN_TIMEOUT_S)
        with gradient_walk.indexed_captures():
            second_in.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    assert first_in.wait(JOIN_TIMEOUT_S)
    assert not second_in.wait(0.5)  # held out while the first swap is in place
    first_may_leave.set()
    for thread in threads:
        thread.join(JOIN_TIMEOUT_S)
    assert second_in.is_set()
    assert _tensorflows_own() == own


def test_a_swap_is_undone_when_the_block_raises():
    own = _tensorflows_own()
    with pytest.raises(RuntimeError, match="inside"):
        with gradient_walk.ordered_gradient_sums(), gradient_walk.stops_at_calls([]):
            assert _tensorflows_own() != own
            raise RuntimeError("inside")
    assert _tensorflows_own() == own
