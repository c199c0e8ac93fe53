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
FRESH_PROCESSES = {
    **{f"{name}/fixed": dict(target=_PROBE, args=[name, LIMITS[name], CALLS],
                             env={"TF_NUM_INTEROP_THREADS": "1"}, timeout=600) for name in MODELS},
    **{f"{name}/default": dict(target=_PROBE, args=[name, LIMITS[name], 0], timeout=600)
       for name in MODELS},
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

    Measured with one inter-op thread: two-block GPT-2 at Budget(0.6) (5.83 MiB) requested
    5.34 MiB in every call of every process, oneDNN off and on, while the allocator's peak
    read 5.54-6.24 MiB (eight to twenty calls per process, 0.95-1.07x the budget), and one
    CI process read 6.73-6.87 MiB (1.15-1.18x) in all five calls. MobileNetV3Small at
    Budget(0.8): 0.82-0.93x of the budget, except one call in thirty at 1.14x (11.0 MiB at
    9.69). DenseNet121 (64x64, batch 8) at Budget(0.8): 0.83-0.87x of 70.7 MiB with oneDNN,
    0.96-0.98x of 87.5 without."""
    r = fresh_results[f"{name}/fixed"]
    if "refused" in r:
        _refused_only_where_eigen_scratch_dominates(name, r)
        pytest.skip("no plan fits: MobileNetV3Small without oneDNN (Eigen's scratch dominates)")
    mib = r["budget_bytes"] / 2**20
    requested = [round(p / 2**20, 3) for p in r["requested"]]
    assert len(set(requested)) == 1, (requested, mib)  # the order is fixed: the same bytes
    assert max(r["requested"]) <= r["budget_bytes"], (requested, mib)
    shown = ([round(p / 2**20, 2) for p in r["peaks"]], mib)
    assert max(r["peaks"]) <= 1.2 * r["budget_bytes"], shown


def _refused_only_where_eigen_scratch_dominates(name, result):
    """Without oneDNN, Eigen's convolution gradients keep scratch buffers (up to 32 MiB each)
    that outweigh MobileNetV3Small's activations: every plan is modelled above plain
    backprop, and the error says so. Anywhere else a refusal is a failure."""
    assert name == "mobilenet_v3_small" and not onednn_enabled(), result
    assert "more than plain backprop" in result["refused"], result
