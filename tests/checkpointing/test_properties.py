"""Property: on random differentiable graphs, every memgrad strategy matches TensorFlow.

Each example draws a graph (tests/checkpointing/random_graphs.py: convolutions, dense and
residual layers, long skips, concat/split, batch normalisation, seeded dropout, tf.cond,
embeddings, several losses, intermediate xs, stop_gradients, unconnected xs) and checks
'memory', 'speed', a list of tensors, a Budget and memgrad.GradientTape against
tf.gradients / tf.GradientTape of the same forward in the same tf.function: equal None-ness,
max relative error <= 1e-5, and a real rewrite (at least two segments, no fallback) except
where a Budget legitimately keeps plain backprop or stop_gradients cut the input off. An
error over 1e-5 passes only as float32 noise: memgrad at most twice as far from the
float64 gradient as tf.gradients is (random_graphs._triage). The long run is
scripts/fuzz.py.
"""

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.checkpointing.random_graphs import (
    DTYPES, LOOP_KINDS, HypothesisChooser, RandomChooser, RandomGraph, check_graph, compare, draw_spec,
)


@pytest.mark.slow
@settings(max_examples=10, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_every_strategy_matches_tf_gradients_on_random_graphs(data):
    spec = draw_spec(HypothesisChooser(data))
    with warnings.catch_warnings():
        # 'memory' finding nothing worth keeping warns; the outcome reports it as fallback.
        warnings.simplefilter("ignore")
        result = check_graph(spec)
    assert len(result.outcomes) == 5
    assert not result.failures, result.report()


@pytest.mark.slow
@settings(max_examples=3, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_every_strategy_matches_tf_gradients_on_random_graphs_with_loops(data):
    """The same check on graphs holding at least one loop (tf.scan, tf.foldl, tf.map_fn,
    while loops over a TensorArray or a data-dependent number of steps, Keras recurrent
    layers, loops in a nested tf.function or a tf.cond, nested loops). The long run is
    `python scripts/fuzz.py --loops`."""
    spec = draw_spec(HypothesisChooser(data), loops=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = check_graph(spec)
    assert any(kind in LOOP_KINDS for kind, _ in spec.layers)
    assert not result.failures, result.report()


@pytest.mark.slow
@settings(max_examples=3, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_every_strategy_matches_tf_gradients_on_random_graphs_of_every_dtype(data):
    """The same check on graphs computing in float32, float64 or under a mixed-precision
    policy (float16 or bfloat16 ops on float32 variables), each within its dtype's
    tolerance (random_graphs.TOLERANCES); loops drawn too. The long run is
    `python scripts/fuzz.py --dtypes [--loops]`."""
    spec = draw_spec(HypothesisChooser(data), loops=data.draw(st.booleans()), dtypes=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = check_graph(spec)
    assert not result.failures, result.report()


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_drawn_graph_computes_in_its_dtype(dtype):
    import tensorflow as tf

    spec = draw_spec(RandomChooser("dtypes"))
    spec.dtype = dtype
    graph = RandomGraph(spec)
    compute = {"mixed_float16": tf.float16, "mixed_bfloat16": tf.bfloat16}.get(dtype, dtype)
    variables = tf.float32 if dtype.startswith("mixed") else dtype
    assert {tf.as_dtype(v.dtype) for v in graph.variables} == {tf.as_dtype(variables)}
    ys, records = graph.forward(graph.x, graph.ids, graph.labels)
    assert {r.dtype for r in records} == {tf.as_dtype(compute)}
    assert {y.dtype for y in ys} == {tf.as_dtype(variables)}  # the loss: float32 when mixed


@pytest.mark.parametrize("dtype, factor", [("float64", 1 + 1e-8), ("mixed_float16", 1.05)])
def test_the_check_catches_a_gradient_wrong_for_its_dtype(monkeypatch, dtype, factor):
    """The tolerance follows the dtype: 1e-8 off is wrong in float64 (where float32's 1e-5
    would let it pass), 5% off is wrong under mixed float16."""
    import memgrad

    original = memgrad.gradients

    def perturbed(*args, **kwargs):
        grads = original(*args, **kwargs)
        first = next(i for i, g in enumerate(grads) if g is not None)
        grads[first] = grads[first] * factor
        return grads

    monkeypatch.setattr(memgrad, "gradients", perturbed)
    spec = draw_spec(RandomChooser("harness"))
    spec.dtype = dtype
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = check_graph(spec, only=["memory"])
    assert [o.status for o in result.outcomes] == ["wrong"], result.report()


def test_the_check_catches_a_slightly_wrong_gradient(monkeypatch):
    """The harness itself: a gradient off by 0.1% must come out `wrong`, float64 triage
    included (memgrad then is far less accurate than tf.gradients)."""
    import memgrad
    original = memgrad.gradients

    def perturbed(*args, **kwargs):
        grads = original(*args, **kwargs)
        first = next(i for i, g in enumerate(grads) if g is not None)
        grads[first] = grads[first] * 1.001
        return grads

    monkeypatch.setattr(memgrad, "gradients", perturbed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = check_graph(draw_spec(RandomChooser("harness")), only=["memory"])
    assert [o.status for o in result.outcomes] == ["wrong"], result.report()


def test_the_check_compares_an_overflowed_gradient_entry_by_entry():
    """A float16 second derivative can overflow in tf.gradients too: memgrad's gradient must
    then be non-finite at the same entries, and the finite ones are compared."""
    inf, nan = float("inf"), float("nan")
    reference = [np.array([1.0, inf, 2.0])]
    assert compare(reference, [np.array([1.0, inf, 2.0])]) == (0.0, "")
    assert compare(reference, [np.array([1.0, nan, 2.0])]) == (0.0, "")
    assert compare(reference, [np.array([1.5, inf, 2.0])])[0] > 0.1
    error, problem = compare(reference, [np.array([1.0, 3.0, 2.0])])
    assert error == inf and "finite at 1 where it is not" in problem
    error, problem = compare([np.array([1.0, 2.0])], [np.array([nan, 2.0])])
    assert error == inf and "at 1 entries where the reference is finite" in problem


# A graph of `python scripts/fuzz.py --seed 0 --loops --higher` whose second derivative was
# silently wrong (3-12%) while units grew over a nested function's call and its gradient call
# (see `ForwardGraph._convex`): the last segment differentiated such a call and the unit did
# again. It stops at the outputs of a call in a unit now. The other graphs
# that were wrong (51: an intermediate x; 52: an x inside a unit) have fast unit tests in
# test_higher_order.py.
@pytest.mark.slow
def test_a_fuzz_graph_once_wrong_is_exact():
    spec = draw_spec(RandomChooser("0:9"), loops=True, higher=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = check_graph(spec)
    statuses = {o.status for o in result.outcomes}
    assert statuses <= {"ok", "budget_plain"}, result.report()


def fuzz_graph_report(seed, index):
    """In a fresh process: checks graph ``index`` of ``scripts/fuzz.py --seed seed --loops
    --higher`` every way and returns its report and whether it failed."""
    spec = draw_spec(RandomChooser(f"{seed}:{index}"), loops=True, higher=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = check_graph(spec)
    return {"failed": bool(result.failures), "report": result.report()}


# Graph 18 of `python scripts/fuzz.py --seed 4 --loops --higher` once deadlocked while tracing
# (the main thread blocked in TF_NewOperation after 'speed' and 'list' were rewritten in one
# graph; another run finished in 25 s). Not reproduced since: 23 runs in one process with 20
# hash seeds and 10 in fuzz.py's worker processes finished in 24-33 s each on a 2-core Intel
# Xeon. It runs in a fresh process under a timeout, so a hang fails this test instead of
# stopping the suite.
@pytest.mark.slow
def test_the_fuzz_graph_that_once_hung_finishes():
    from memgrad._src.profiler.fresh import FreshProcessError, run_in_fresh_process

    try:
        found = run_in_fresh_process("tests.checkpointing.test_properties:fuzz_graph_report", [4, 18],
                                     timeout=300)
    except FreshProcessError as error:
        pytest.fail(f"graph 18 of seed 4 gave no result: {error}")
    assert not found["failed"], found["report"]


# A graph of `python scripts/fuzz.py --seed 6` (two data-dependent tf.conds, each branch a
# function call): a segment reading only kept tensors, one of them a call's output, was
# differentiated in place with tf.gradients stopped at that output, which gave the call a
# SymbolicGradient node that failed when it ran (every strategy crashed). Such a segment is
# copied now.
def test_a_fuzz_graph_once_crashing_after_a_function_call_matches():
    spec = draw_spec(RandomChooser("6:18"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = check_graph(spec)
    assert not result.failures, result.report()
