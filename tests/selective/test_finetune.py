"""Peaks of fine-tuning steps on keras.applications and keras-hub models, converted vs Keras.

Measured in fresh processes (BFC allocator, one inter-op thread): finetune_probe.py.
"""

import pytest

pytestmark = pytest.mark.memory

BFC = {"TF_CPU_ALLOCATOR_USE_BFC": "true"}
FRESH_PROCESSES = {
    "eager": dict(target="tests.selective.finetune_probe:eager_peaks",
                  args=[["resnet50_frozen", "bert_adapters"]], env=BFC, timeout=300),
    "graph": dict(target="tests.selective.finetune_probe:graph_peaks", args=[["bert_adapters"]], env=BFC,
                  timeout=300),
}


def _mib(value):
    return f"{value / 2**20:.2f} MiB"


def test_frozen_resnet50_eager_step_peaks_at_most_half_of_keras(fresh_results):
    # keras.applications.ResNet50(weights=None) at 32x32, batch 8, frozen under a trainable
    # head. Measured: 2.3 vs 120.6 MiB (0.02x): the frozen backbone runs unrecorded and
    # LeanFunctional frees each activation after its last consumer.
    keras_peak, converted_peak = fresh_results["eager"]["resnet50_frozen"]
    assert converted_peak <= 0.5 * keras_peak, f"{_mib(converted_peak)} vs {_mib(keras_peak)}"


def test_bert_with_adapters_eager_step_saves_memory(fresh_results):
    # keras-hub BertBackbone (2 layers, hidden 64, sequence 64, batch 8, dropout on), frozen,
    # with a trainable adapter after each encoder layer and a trainable head: gradients flow
    # through the frozen second encoder layer. Measured: 8.0 vs 26.1 MiB (0.31x).
    keras_peak, converted_peak = fresh_results["eager"]["bert_adapters"]
    assert converted_peak <= 0.5 * keras_peak, f"{_mib(converted_peak)} vs {_mib(keras_peak)}"


def test_bert_with_adapters_graph_step_is_keras_graph(fresh_results):
    # In a graph the converted layers run Keras's own computation: the traced training step
    # has exactly Keras's ops, so its peak cannot be higher than Keras's.
    assert fresh_results["graph"]["bert_adapters"]["op_difference"] == {}


def test_bert_with_adapters_graph_step_never_peaks_higher(fresh_results):
    # The allocator's own peak counts BFC chunks (up to twice a request, depending on what is
    # free): the same graph measured 4.8-5.3 MiB between runs. The requested bytes of the
    # live allocations replayed from the profiler repeat for one schedule (4.8234 MiB for
    # both, three runs), but the two steps' schedules can differ even with one inter-op
    # thread: a loop of `pytest -m memory` measured 4.95 vs 4.82 MiB (1.026x) once in five.
    # The same ops are asserted above; the bound is the spread of the same graph, 10%.
    keras_peak, converted_peak = fresh_results["graph"]["bert_adapters"]["requested_peaks"]
    assert converted_peak <= 1.10 * keras_peak, f"{_mib(converted_peak)} vs {_mib(keras_peak)}"
