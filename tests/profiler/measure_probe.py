"""Peaks of calls that keep a known number of activations (a fresh-process probe).

A fresh process: the BFC allocator's slack (chunks handed out unsplit) depends on what earlier
work allocated; in a long pytest process a 32-activation peak read 37.75 MiB against 33.55 once.
"""

import tensorflow as tf

import memgrad

BATCH, WIDTH, KEPT = 256, 1024, 32
ACTIVATION_BYTES = BATCH * WIDTH * 4


@tf.function
def keep_chain(x):
    """A chain whose KEPT activations are all returned, hence all alive at the end."""
    outputs, h = [], x
    for _ in range(KEPT):
        h = tf.tanh(h)
        outputs.append(h)
    return outputs


def keep_chain_reports():
    """``{"small": report, "large": report}`` as dicts: a call keeping 2 activations, and
    `keep_chain` keeping KEPT."""
    x = tf.random.normal([BATCH, WIDTH])
    small = memgrad.profiler.measure(tf.function(lambda x: [tf.tanh(x), tf.tanh(x) * 2.0]), args=(x,))
    large = memgrad.profiler.measure(keep_chain, args=(x,), device="CPU:0")
    return {"small": small.as_dict(), "large": large.as_dict()}
