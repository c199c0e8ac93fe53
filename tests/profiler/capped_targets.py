"""Workloads run by the emulated-device tests in a capped subprocess."""

import tensorflow as tf


def hold(batch_size: int, mib_per_item: int = 4) -> None:
    """Keeps ``batch_size`` float32 tensors of ``mib_per_item`` MiB alive at once."""
    floats = mib_per_item * 2**20 // 4
    items = [tf.fill([floats], float(i)) for i in range(batch_size)]
    tf.add_n([tf.reduce_sum(item) for item in items]).numpy()


def fail() -> None:
    """Fails for a reason other than memory."""
    raise ValueError("not a memory problem")


def fail_in_a_wide_layer(batch_size: int = 1024) -> None:
    """A training step whose widest activation (the layer named ``wide``: batch x 4096 float32,
    16 MiB at batch 1024) is the largest tensor alive when it runs out of memory under 24 MiB.
    Its weights take 2 MiB."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(64, activation="relu", name="narrow_a"),
                              keras.layers.Dense(4096, activation="relu", name="wide"),
                              keras.layers.Dense(64, activation="relu", name="narrow_b"),
                              keras.layers.Dense(1, name="head")])
    x = tf.random.stateless_normal([batch_size, 256], seed=[1, 2])

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True)))
        grads = tape.gradient(loss, model.trainable_weights)
        return [tf.reduce_sum(g) for g in grads]

    step()


def crash(after_logging_an_oom: bool) -> None:
    """Ends the process with a segfault, as a oneDNN kernel does after a failed allocation under
    the cap (TensorFlow 2.21), with or without TensorFlow's warning line naming the OOM first."""
    import os
    import signal
    import sys

    if after_logging_an_oom:
        sys.stderr.write("W0000 op_kernel.cc:1858] OP_REQUIRES failed at mkl_util.h:848 : RESOURCE_EXHAUSTED: "
                         "OOM when allocating tensor with shape[3000,32] and type float on CPU:0\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGSEGV)


def profiled_coupling_step(batch_size: int) -> None:
    """The command's headline workload (16 additive couplings of width 64, plain backprop) run as
    the command runs it, under TensorFlow's profiler: with oneDNN on, its out-of-memory under
    22 MiB crashes the process (TensorFlow 2.21)."""
    import memgrad
    from memgrad.cli.sweep import model_spec, workload

    tf.config.threading.set_inter_op_parallelism_threads(1)  # as the command runs

    step, inputs, model = workload(model_spec("coupling", width=64), "plain", 16, batch_size)
    memgrad.profiler.memory_by_category(step, inputs, weights=model.weights, device="CPU:0")
