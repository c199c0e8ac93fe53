"""A graph TensorFlow left locked: say so at once, since nothing more can be built in it.

When a C++ exception escapes TensorFlow's op creation (a shape function's out-of-range
error arrives as a bare IndexError), the graph's lock is never released (TensorFlow 2.21):
the next op made in that graph waits forever. memgrad falls back to plain ``tf.gradients``
when its rewrite fails, and that fallback makes ops in the same graph, so it would hang the
trace with no word. Where the rewrite failed that way and the graph no longer takes an op,
memgrad logs the reason as an error (on stderr unless logging is configured otherwise) and
raises `GraphLockedError` instead of falling back. TensorFlow's own clean-up of the trace may
still wait on that lock as the error leaves it, which is why the reason is logged first.
memgrad avoids the one such failure it knows (AddN of TensorLists: `gradient_walk`).
"""

from __future__ import annotations

import logging
import threading

import tensorflow as tf

from memgrad._src import tf_internals

# How long a probe op may take to be made before the graph counts as locked. An unlocked
# graph takes one in about a millisecond.
PROBE_TIMEOUT_S = 5.0


class GraphLockedError(RuntimeError):
    """TensorFlow failed while making an op for memgrad's rewrite and left the graph locked:
    no op can be added to it any more, so memgrad cannot fall back to ``tf.gradients``."""


def accepts_ops(graph, timeout_s=PROBE_TIMEOUT_S) -> bool:
    """Whether an op can still be made in ``graph``: a constant is made from another thread,
    which waits at most ``timeout_s`` (a locked graph keeps that thread waiting for good; it
    is a daemon thread, and the op it makes, read by nothing, is pruned)."""
    made = threading.Event()

    def probe():
        with graph.as_default():
            tf.constant(0.0, name="memgrad_graph_lock_probe")
        made.set()

    threading.Thread(target=probe, name="memgrad-graph-lock-probe", daemon=True).start()
    return made.wait(timeout_s)


def raise_if_locked(error, stage):
    """Raises `GraphLockedError` (from ``error``) when ``error`` escaped an op creation as a
    C++ exception and the graph it was made in no longer takes an op; returns otherwise."""
    failed = tf_internals.failed_op_creation(error)
    if failed is None:
        return
    op_type, op_name, graph = failed
    if accepts_ops(graph if graph is not None else tf.compat.v1.get_default_graph()):
        return
    message = (
        f"TensorFlow failed while making a {op_type} op ({op_name!r}) when {stage}, with a C++ "
        f"exception ({type(error).__name__}: {str(error).strip()[:200]}) that left this graph locked: "
        "no op can be added to it any more, so memgrad cannot fall back to tf.gradients here (that "
        "would wait forever). Please report it with this message; meanwhile, plain tf.gradients "
        "or another checkpoints= strategy may avoid the failing op. TensorFlow's clean-up of this "
        "trace may wait on the same lock: if the program stops here, that is why.")
    logging.getLogger("memgrad").error(message)
    raise GraphLockedError(message) from error
