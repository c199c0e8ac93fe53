"""A rewrite that fails inside TensorFlow's op creation with a C++ exception leaves the graph
locked (TensorFlow 2.21): memgrad logs why and raises GraphLockedError there instead of
falling back to tf.gradients, which would wait forever with no word. TensorFlow's clean-up of
the trace may still wait on the lock, so the locking case runs in its own process, which a
watchdog ends, and the test reads what it printed."""

import os
import subprocess
import sys

import pytest

from memgrad._src.profiler.fresh import FreshProcessError, run_in_fresh_process

TIMEOUT_S = 120


def _variant_sum_that_locks(x):
    """AddN of three TensorLists, the last without handle data and the others with it: its
    shape function throws std::out_of_range (a bare IndexError) and keeps the graph locked.
    Standing for a failure memgrad does not know of yet."""
    import tensorflow as tf
    from tensorflow.python.ops import list_ops

    def as_list(t):
        return list_ops.tensor_list_from_tensor(t, element_shape=x.shape[1:])

    bare = tf.compat.v1.placeholder_with_default(as_list(4.0 * x), shape=[])
    # tf.raw_ops: past the ordering memgrad gives every Python AddN while it builds.
    return tf.raw_ops.AddN(inputs=[as_list(x), as_list(2.0 * x), bare])


def rewrite_failing(how):
    """In a fresh process: memgrad.gradients whose rewrite fails ``how`` ('locking': the
    variant sum above; 'plain': an IndexError of memgrad's own); what the caller sees."""
    import warnings

    import tensorflow as tf

    import memgrad
    from memgrad._src.checkpointing import api

    def failing_rewrite(view, *args, **kwargs):
        if how == "locking":
            _variant_sum_that_locks(view.xs[0] if hasattr(view, "xs") else tf.ones([2, 3]))
        raise IndexError("memgrad's own failure")

    api.rewrite_gradients = failing_rewrite

    @tf.function
    def step(x):
        h = x
        for _ in range(8):
            h = tf.tanh(h) * 1.5
        return memgrad.gradients(tf.reduce_sum(h), x, checkpoints="memory")[0]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            grad = step(tf.ones([2, 3]))
        except Exception as error:  # reported to the test
            return {"raised": type(error).__name__, "message": str(error)}
    return {"raised": None, "finite": bool(tf.reduce_all(tf.math.is_finite(grad))),
            "warnings": [str(w.message) for w in caught]}


def _run(how):
    try:
        return run_in_fresh_process(f"{__name__}:rewrite_failing", [how], timeout=TIMEOUT_S)
    except FreshProcessError as error:
        pytest.fail(f"the step gave no result (a hang is killed after {TIMEOUT_S} s): {error}")


def exit_once_memgrad_logs_an_error():
    """In the watched process: end it as soon as memgrad logs an error (what it does just
    before raising GraphLockedError), rather than wait for TensorFlow's clean-up of the locked
    trace, which may never finish."""
    import logging

    class ExitHandler(logging.Handler):
        def emit(self, record):
            sys.stderr.write(f"{record.getMessage()}\nmemgrad logged an error\n")
            sys.stderr.flush()
            os._exit(0)

    logging.getLogger("memgrad").addHandler(ExitHandler())


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WATCHDOG_S = 120  # a safety net: the process ends once memgrad logs, about 20 s on 2 cores


@pytest.mark.slow
def test_a_rewrite_that_locks_the_graph_says_why_instead_of_falling_back_into_a_hang():
    code = (f"import faulthandler; faulthandler.dump_traceback_later({WATCHDOG_S}, exit=True)\n"
            "from tests.checkpointing.test_graph_lock import exit_once_memgrad_logs_an_error\n"
            "exit_once_memgrad_logs_an_error()\n"
            "from tests.checkpointing.test_graph_lock import rewrite_failing\n"
            "print('RESULT', rewrite_failing('locking'), flush=True)\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=WATCHDOG_S + 60)
    said = done.stdout + done.stderr
    assert "left this graph locked" in said and "AddN" in said, said[-3000:]
    assert "cannot fall back to tf.gradients" in said
    assert "memgrad logged an error" in said and "Timeout" not in said, said[-3000:]


def test_any_other_rewrite_failure_still_falls_back_with_a_warning():
    found = _run("plain")
    assert found["raised"] is None and found["finite"], found
    assert any("building the rewrite raised IndexError" in w for w in found["warnings"]), found["warnings"]
