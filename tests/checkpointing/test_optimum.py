"""The budget planner against the exact optimum of its problem on small graphs.

Under the memory model, the exact optimum (tests/checkpointing/exact_plans.py) is checked
against brute force over every subset of cut positions, then the planner's dynamic program
and the candidates a measuring Budget walks are compared with it at budgets from the
smallest feasible to plain backprop's peak.
"""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from memgrad._src.checkpointing.budget_planner import Planner
from memgrad._src.graph import ForwardGraph, MemoryModel
from tests.checkpointing.budget_workloads import dense_blocks, residual, tanh_chain, uneven
from tests.checkpointing.exact_plans import exact_plan

SMALL = {
    "residual12": lambda: residual(depth=12, batch=512),  # 38 ops
    "tanh16": lambda: tanh_chain(depth=16, batch=512),  # 34 ops
    "uneven": lambda: uneven(batch=256),  # 50 ops
}


def _planner(weights, loss_fn, shape):
    out = {}

    @tf.function(autograph=False)
    def trace(x):
        loss = loss_fn(x)
        view = ForwardGraph([loss], weights)
        out["planner"] = Planner(view, MemoryModel(view))
        return loss

    trace.get_concrete_function(tf.TensorSpec(shape))
    return out["planner"]


def _budgets(planner, points):
    low, high = planner.smallest_feasible(), planner.plain_bytes
    return [low + f * (high - low) for f in np.linspace(0.0, 1.0, points + 1)[:-1]]


def _gap(flops, optimum):
    if optimum == 0:
        return 1.0 if flops == 0 else float("inf")
    return flops / optimum


def test_exact_optimum_matches_brute_force_over_every_subset():
    planner = _planner(*residual(depth=4, batch=512))
    model, positions = planner.model, planner.candidates
    assert 8 <= len(positions) <= 14, len(positions)
    plans = [model.predict(list(c)) for k in range(len(positions) + 1)
             for c in itertools.combinations(positions, k)]
    for budget in _budgets(planner, 12):
        brute = min(flops for peak, flops in plans if peak <= budget)
        flops, peak, _ = exact_plan(model, positions, budget)
        assert peak <= budget
        assert flops == pytest.approx(brute, rel=1e-9, abs=1.0)


def _compare(name, make, points):
    planner = _planner(*make())
    model = planner.model
    assert model.n <= 110, model.n
    worst = {"dynamic program": 1.0, "fixed candidates": 1.0, "candidates": 1.0}
    for budget in _budgets(planner, points):
        optimum, _, _ = exact_plan(model, planner.candidates, budget)
        _, peak, flops = planner.plan(budget)
        assert peak <= budget
        assert flops >= optimum * (1 - 1e-9) - 1.0  # nothing beats the optimum
        fixed = min(cost for cost, peak, _ in planner.candidate_plans() if peak <= budget)
        walked = min(cost for cost, peak, _ in planner.candidate_plans(budget) if peak <= budget)
        for key, value in (("dynamic program", flops), ("fixed candidates", fixed),
                           ("candidates", walked)):
            worst[key] = max(worst[key], _gap(value, optimum))
    print(f"{name} ({model.n} ops): worst recomputation over the optimum {worst}")
    return worst


@pytest.mark.parametrize("name", sorted(SMALL))
def test_planner_recomputes_within_10_percent_of_the_optimum(name):
    """Measured: the dynamic program and the candidates a measuring Budget walks (which
    include the program's plan for the budget) recompute the optimum's FLOPs at every one
    of 10 budgets; the fixed candidates alone recomputed up to 2.0x (residual), 1.5x (tanh)
    and 2.3x (uneven widths) of it between their levels."""
    worst = _compare(name, SMALL[name], points=10)
    assert worst["dynamic program"] <= 1.10, worst
    assert worst["candidates"] <= 1.10, worst


@pytest.mark.slow
def test_planner_recomputes_within_10_percent_of_the_optimum_on_dense_blocks():
    """Four dense blocks of eight layers (105 ops; no single-tensor separator inside a
    block). Measured: 1.0x for both at 20 budgets (the fixed candidates alone: 2.5x); CI
    checks 5 budgets spread over the same range."""
    worst = _compare("dense_blocks", lambda: dense_blocks(batch=256), points=5)
    assert worst["dynamic program"] <= 1.10, worst
    assert worst["candidates"] <= 1.10, worst
