"""A Budget decides on the graph alone: the same model and budget give the same plan in fresh
processes (whatever the executor's threads), and the step's measured peak holds the budget.

Each model is planned in two fresh processes: one with a single inter-op thread
(``TF_NUM_INTEROP_THREADS=1``, the executor's order of ops fixed), which also measures the
step, and one with TensorFlow's default threads. CI runs this module once with oneDNN on
and once off (it is marked `memory`).
"""

import pytest

from memgrad.profiler import onednn_enabled
from tests.checkpointing.budget_plan_probe import MODELS

# The budgets: GPT-2's least is 0.509 (named by the BudgetError for 0.5), MobileNetV3Small's
# 0.745 (oneDNN on), DenseNet121's 0.761 (oneDNN off; its weights' gradients, held until the
# optimizer applies them, are a third of plain's peak); these sit above them, where a real
# plan is chosen.
LIMITS = {"gpt2": 0.6, "mobilenet_v3_small": 0.8, "densenet121": 0.8}
CALLS = 5
_PROBE = "tests.checkpointing.budget_plan_probe:plan_and_measure"
# Wall time in CI's memory pass, measuring (fixed) and planning only (default): conftest.py
# starts the longest probes first.
_EXPECTED_S = {"gpt2": (45, 25), "mobilenet_v3_small": (65, 30), "densenet121": (90, 55)}
FRESH_PROCESSES = {
    **{f"{name}/fixed": dict(target=_PROBE, args=[name, LIMITS[name], CALLS],
                             env={"TF_NUM_INTEROP_THREADS": "1"}, timeout=600,
                             expected_s=_EXPECTED_S[name][0]) for name in MODELS},
    # Cold, while the fixed ones fork from the suite's warm interpreter (conftest.py): the
    # two differ in Python's hash seed too, so a plan that followed a set's order would differ.
    **{f"{name}/default": dict(target=_PROBE, args=[name, LIMITS[name], 0], timeout=600, warm=False,
                               expected_s=_EXPECTED_S[name][1]) for name in MODELS},
}


@pytest.mark.memory
@pytest.mark.parametrize("name", MODELS)
def test_the_same_plan_in_fresh_processes_whatever_the_threads(fresh_results, name):
    fixed, default = fresh_results[f"{name}/fixed"], fresh_results[f"{name}/default"]
    if "refused" in fixed:  # the same refusal, naming the same budget
        assert default == fixed
        _refused_only_where_eigen_scratch_dominates(name, fixed)
        return
    assert fixed["recomputed_flops"] > 0 and fixed["kept"], fixed  # a real plan
    for key in ("kept", "copied_ops", "candidate", "budget_bytes", "predicted_bytes", "plain_bytes"):
        assert fixed[key] == default[key], (key, fixed[key], default[key])


@pytest.mark.memory
@pytest.mark.parametrize("name", MODELS)
def test_the_measured_step_holds_the_budget(fresh_results, name):
    """With the executor's order fixed, the bytes the step's buffers request at its peak are
    the same in every call and within the budget; the allocator's peak, which adds BFC's
    chunk fitting (a free chunk under twice the request is handed out whole, and which one
    is free depends on what was freed before), is within 1.2x the budget in every call.

    Measured with one inter-op thread, in fresh processes started as this suite starts
    them: two-block GPT-2 at Budget(0.6) (5.83 MiB) requested 4.58 MiB, the model's figure,
    in each of 21 processes (oneDNN off and on); the allocator read 4.60-5.19 MiB. Before
    the first recomputation waited for the last segment's weight gradients it requested
    5.34 MiB, or 6.34 in 3 processes of 24 (the allocator up to 6.87, 1.18x). MobileNetV3Small
    at Budget(0.8) (9.99 MiB, oneDNN): 8.34-8.42 MiB requested (the same in a process's
    calls), 8.51-10.23 read. DenseNet121 (64x64, batch 8) at Budget(0.8): 49.96-52.15 of
    70.66 MiB requested with oneDNN (51.45-58.54 read), 53.50-53.61 of 87.5 without
    (67.61-72.88 read)."""
    r = fresh_results[f"{name}/fixed"]
    if "refused" in r:
        _refused_only_where_eigen_scratch_dominates(name, r)
        pytest.skip("no plan fits: MobileNetV3Small without oneDNN (Eigen's scratch dominates)")
    mib = r["budget_bytes"] / 2**20
    requested = r["requested"]
    shown = ([round(p / 2**20, 3) for p in requested], mib)
    assert min(requested) > 0 and len(set(requested)) == 1, shown  # the order is fixed
    assert max(requested) <= r["budget_bytes"], shown
    shown = ([round(p / 2**20, 2) for p in r["peaks"]], mib)
    assert max(r["peaks"]) <= 1.2 * r["budget_bytes"], shown


def _refused_only_where_eigen_scratch_dominates(name, result):
    """Without oneDNN, Eigen's convolution gradients keep scratch buffers (up to 32 MiB each)
    that outweigh MobileNetV3Small's activations: every plan is modelled above plain
    backprop, and the error says so. Anywhere else a refusal is a failure."""
    assert name == "mobilenet_v3_small" and not onednn_enabled(), result
    assert "more than plain backprop" in result["refused"], result
