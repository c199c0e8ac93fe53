"""Graph-mode peaks of a training step, converted vs unconverted (a fresh-process probe).

In a graph the peak depends on the schedule the executor picks; with two inter-op threads it
moved by half a MiB of 2 MiB between runs of the same graph (2.54 vs 2.01 MiB measured once,
a failure of the 1.03x bound). With one inter-op thread the schedule is fixed.
"""

import keras
import tensorflow as tf

import memgrad
from memgrad.profiler.workloads import conv_classifier


def conv_net(frozen_backbone):
    return conv_classifier(frozen_backbone, depth=16, channels=16)


def step_peak(model, graph=False, calls=1):
    """The least peak of ``calls`` measured steps (one trace, one warm-up)."""
    x = tf.random.stateless_normal([16, 32, 32, 8], seed=[0, 1])  # activations of 1 MiB
    y = tf.range(16) % 10
    optimizer = keras.optimizers.SGD(0.01)
    optimizer.build(model.trainable_variables)

    def step():
        with tf.GradientTape() as tape:
            logits = model(x, training=False)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    step = tf.function(step) if graph else step
    return min(memgrad.profiler.measure(step, warmup=int(i == 0)).peak_above_baseline_bytes for i in range(calls))


def graph_peaks():
    """{"frozen"/"trainable": [keras peak, converted peak]} of a graph-mode step."""
    tf.config.threading.set_inter_op_parallelism_threads(1)
    results = {}
    for frozen in (True, False):
        keras_model = conv_net(frozen)
        converted = memgrad.selective.convert(keras_model)
        results["frozen" if frozen else "trainable"] = [
            step_peak(m, graph=True, calls=3) for m in (keras_model, converted)]
    return results
