"""Targets for tests/profiler/test_fresh.py: what a fresh process sees, cold or warm."""

import os
import sys


def describe(size):
    """The process's view of its start, and the allocator's peak of a ``size`` x ``size``
    float32 tensor made twice (tanh(x) * 2)."""
    tensorflow_before = "tensorflow" in sys.modules
    memgrad_before = "memgrad" in sys.modules
    import tensorflow as tf

    import memgrad  # imports networkx: on the path, as in a cold process

    networkx = "networkx" in sys.modules
    step = tf.function(lambda x: tf.reduce_sum(tf.tanh(x) * 2.0))
    report = memgrad.profiler.measure(step, args=(tf.ones([size, size]),), device="CPU:0")
    return {"pid": os.getpid(), "cwd": os.getcwd(), "path": [p for p in sys.path if p], "networkx": networkx, "probe": os.environ.get("MEMGRAD_TEST_PROBE"),
            "limit": os.environ.get("TF_CPU_BFC_MEM_LIMIT_IN_MB"),
            "tests_first": sys.path.index(os.environ["MEMGRAD_TEST_ROOT"]) < sys.path.index(
                os.path.dirname(os.path.dirname(tf.__file__))),
            "tensorflow_before": tensorflow_before, "memgrad_before": memgrad_before,
            "onednn": memgrad.profiler.onednn_enabled(),
            "inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
            "peak_above_baseline_bytes": report.peak_above_baseline_bytes}


def path():
    """The process's module search path and whether networkx is on it, without importing
    anything (a cold call takes a fraction of a second)."""
    import importlib.util

    return {"path": [p for p in sys.path if p], "networkx": importlib.util.find_spec("networkx") is not None}


def fail():
    raise ValueError("as asked")


def sleep(seconds):
    import time

    time.sleep(seconds)
    return seconds
