"""Predicted and measured peaks of one workload under several plans (a fresh-process probe).

`measure_plans(NAME)` (`python -m tests.checkpointing.budget_probe NAME` prints it as
`RESULT {json}`) returns, for plain
backprop, the 'memory' strategy, sqrt(n) spacing (every round(sqrt(layers))-th layer
output, with every tensor alive there) and `memgrad.strategies.Budget` at sqrt spacing's measured peak: the predicted peak,
the measured peak above baseline and the recomputed FLOPs. It runs in a fresh process so
the allocator's history, which moves BFC peaks by a few MiB, is the same every time.
"""

import json
import math
import os
import sys

os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import memgrad  # noqa: E402
from memgrad._src.checkpointing.budget_measure import PLAN_RUNS  # noqa: E402
from memgrad._src.checkpointing.plans import memory_plan  # noqa: E402
from memgrad._src.graph import ForwardGraph, MemoryModel  # noqa: E402
from tests.checkpointing.budget_workloads import LAYER_OUTPUT, WORKLOADS  # noqa: E402


def sqrt_spacing(model, layer_type):
    """Cuts after every k-th layer, k = round(sqrt(layers)): the tensors alive there."""
    ends = [p for p, op in enumerate(model.profile.ops) if op.type == layer_type]
    k = max(1, round(math.sqrt(len(ends))))
    return model.tensors_for(ends[k - 1:-1:k])


def measure_plans(name):
    weights, loss_fn, shape = WORKLOADS[name]()
    x = tf.random.stateless_normal(shape, [0, 3])
    results = {}

    def run(label, choose):
        info = {}

        @tf.function
        def step(x):
            loss = loss_fn(x)
            view = ForwardGraph([loss], weights)
            model = MemoryModel(view)
            checkpoints = choose(view, model)
            if checkpoints is None:
                info["predicted"], info["flops"] = model.predict([])
                grads = tf.gradients(loss, weights)
            elif isinstance(checkpoints, memgrad.strategies.Budget):
                with memgrad.record_rewrites() as log:
                    grads = memgrad.gradients(loss, weights, checkpoints=checkpoints)
                info["predicted"] = log[-1].plan.details["predicted_bytes"]
                info["flops"] = log[-1].plan.details["recomputed_flops"]
            else:
                cuts = model.positions_of(checkpoints)
                info["predicted"], info["flops"] = model.predict(cuts)
                grads = memgrad.gradients(loss, weights, checkpoints=checkpoints)
            return tf.add_n([tf.reduce_sum(g) for g in grads])

        try:
            peaks = [memgrad.profiler.measure(step, (x,), device="CPU:0").peak_above_baseline_bytes
                     for _ in range(PLAN_RUNS)]
        except memgrad.BudgetError as error:
            info.update(error=str(error), predicted=0.0, flops=0.0, measured=1.0)
        else:
            # The executor's schedule differs from call to call, and with it the peak (33-41
            # MiB on dense blocks under sqrt spacing): the median and the range of as many
            # calls as a Budget runs each plan at plan time.
            info["measured"] = sorted(peaks)[len(peaks) // 2]
            info["measured_range"] = [min(peaks), max(peaks)]
        results[label] = info

    run("plain", lambda view, model: None)
    run("memory", lambda view, model: memory_plan(view).tensors)
    run("sqrt", lambda view, model: sqrt_spacing(model, LAYER_OUTPUT[name]))
    budget = int(results["sqrt"]["measured"])
    results["budget_bytes"] = budget
    # The memory-model planner alone (what the planner-quality tests compare), the Budget
    # that simulates plain backprop and each rewrite, and the default Budget, which
    # measures them at trace time.
    run("budget", lambda view, model: memgrad.strategies.Budget(budget, measure=False, simulate=False))
    run("budget_simulated", lambda view, model: memgrad.strategies.Budget(budget, measure=False))
    run("budget_measured", lambda view, model: memgrad.strategies.Budget(budget))
    return results


if __name__ == "__main__":
    print("RESULT " + json.dumps(measure_plans(sys.argv[1])))
