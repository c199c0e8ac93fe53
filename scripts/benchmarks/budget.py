"""Budgets between 'memory' and plain backprop: peaks, time, planning time."""

from __future__ import annotations

import time

import tensorflow as tf

import memgrad
from memgrad._src.checkpointing.plans import memory_plan
from memgrad._src.graph import ForwardGraph
from memgrad.profiler.workloads import UNEVEN_WIDTHS, residual_chain, uneven_chain

from benchmarks.checkpointing import gradient_step
from benchmarks.common import median_peak, time_side_by_side


def _sqrt_spacing_gradients(loss, variables):
    """memgrad.gradients keeping every round(sqrt(n))-th layer output of a ReLU chain."""
    relus = [op.outputs[0] for op in loss.graph.get_operations() if op.type == "Relu"]
    k = max(1, round(len(relus) ** 0.5))
    return memgrad.gradients(loss, variables, checkpoints=relus[k - 1:-1:k])


def budget_suite(rounds, batch=2048):
    """memgrad.strategies.Budget at sqrt(n) spacing's measured peak, on a chain of uneven widths."""
    x = tf.random.stateless_normal([batch, UNEVEN_WIDTHS[-1]], seed=[0, 3])
    weights, loss_fn = uneven_chain()
    sqrt_step = gradient_step(weights, loss_fn, _sqrt_spacing_gradients)
    plain_step = gradient_step(weights, loss_fn, tf.gradients)
    sqrt_peak = median_peak(sqrt_step, x)
    budget = memgrad.strategies.Budget(int(sqrt_peak))
    plans = []

    def budgeted(loss, variables):
        with memgrad.record_rewrites() as log:
            grads = memgrad.gradients(loss, variables, checkpoints=budget)
        plans.append(log[-1].plan)
        return grads

    budget_step = gradient_step(weights, loss_fn, budgeted)
    steps = {"budget": budget_step, "sqrt": sqrt_step, "plain": plain_step}
    seconds = time_side_by_side(steps, x, rounds)
    peaks = {key: median_peak(step, x) for key, step in steps.items()}
    last = dict(plans[-1].details)
    rows = [{
        "suite": "budget",
        "case": (f"Budget({sqrt_peak / 2**20:.1f} MiB = sqrt(n) spacing's measured peak), "
                 f"{len(weights)}-layer ReLU chain of widths 64-1024, batch {batch}: "
                 f"measured {peaks['budget'] / 2**20:.1f} MiB (predicted "
                 f"{last['predicted_bytes'] / 2**20:.1f}); time vs sqrt(n) spacing "
                 f"{seconds['budget'] / seconds['sqrt']:.2f}x "
                 f"({last['recomputed_flops'] / 1e9:.2f} GFLOP recomputed)"),
        "time_ratio": seconds["budget"] / seconds["plain"],
        "target_text": (f"time <= sqrt(n) spacing's "
                        f"({'met' if seconds['budget'] <= seconds['sqrt'] else 'missed'}), "
                        f"peak <= budget ({'met' if peaks['budget'] <= sqrt_peak else 'missed'})"),
        "ms_memgrad": seconds["budget"] * 1e3,
        "ms_plain": seconds["plain"] * 1e3,
        "memory_ratio": peaks["budget"] / peaks["plain"],
    }]
    planning = _planning_seconds(1250)
    rows.append({
        "suite": "budget",
        "case": (f"planning time at trace time, graph of {planning['ops']} ops (1250 residual "
                 f"layers), Budget(0.2): {planning['seconds']:.2f} s; ms columns: planning vs "
                 "the 'memory' strategy's analysis"),
        "time_ratio": planning["seconds"] / planning["memory"],
        "target_text": (f"<= 3 s ({'met' if planning['seconds'] <= 3 else 'missed'})"),
        "ms_memgrad": planning["seconds"] * 1e3,
        "ms_plain": planning["memory"] * 1e3,
        "memory_ratio": None,
    })
    return rows


def _planning_seconds(depth, width=128, batch=4096):
    weights, loss_fn = residual_chain(depth, width, seed=1)
    timings = {}

    @tf.function(autograph=False)
    def trace(x):
        loss = loss_fn(x)
        timings["ops"] = len(loss.graph.get_operations())
        view = ForwardGraph([loss], weights)
        start = time.perf_counter()
        memgrad.strategies.Budget(0.2).plan(view)
        timings["seconds"] = time.perf_counter() - start
        start = time.perf_counter()
        memory_plan(ForwardGraph([loss], weights))
        timings["memory"] = time.perf_counter() - start
        return loss

    trace.get_concrete_function(tf.TensorSpec([batch, width]))
    return timings
