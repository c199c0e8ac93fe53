"""'memory''s cuts by dynamic programming: within the grid's ratio of the least estimate (kept
bytes plus the largest segment), checked against every subset of cut positions."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from memgrad._src.checkpointing.least_cuts import (GRID_RATIO, least_cuts, plan_estimate,
                                                   read_profile)
from memgrad._src.checkpointing.plans import memory_cuts, memory_plan
from memgrad._src.graph import ForwardGraph
from memgrad._src.graph.separators import cut_profile
from tests.checkpointing.budget_workloads import uneven
from tests.checkpointing.test_improve_cuts import _profile, _transformer_like


def _random_profile(seed, n=None):
    rng = np.random.default_rng(seed)
    n = n or int(rng.integers(4, 13))
    births = rng.integers(0, n - 1, size=2 * n)
    deaths = np.minimum(births + 1 + rng.geometric(0.4, size=2 * n), n)
    sizes = rng.choice([1.0, 2.0, 4.0, 8.0], size=2 * n)
    return _profile(births, deaths, sizes, n)


def _brute_force(profile):
    n = len(profile.ops)
    best = plan_estimate(profile, [])[0]
    for k in range(1, n):
        for cuts in itertools.combinations(range(n - 1), k):
            best = min(best, plan_estimate(profile, list(cuts))[0])
    return best


@pytest.mark.parametrize("seed", range(40))
def test_within_the_grid_ratio_of_every_subset_of_cuts(seed):
    profile = _random_profile(seed)
    optimum = _brute_force(profile)
    total = float(profile.produced[-1])
    estimate, cuts = least_cuts(profile, upper=total)
    assert cuts == sorted(set(cuts)) and all(0 <= c <= len(profile.ops) - 2 for c in cuts)
    assert estimate == plan_estimate(profile, cuts)[0]
    assert optimum - 1e-9 <= estimate <= GRID_RATIO * optimum + 1e-9, (estimate, optimum, cuts)


@pytest.mark.parametrize("seed", range(10))
def test_an_exact_grid_finds_the_optimum(seed):
    """With a ratio a hair above 1 every bound between the largest op and the total is
    tried (the bytes are whole units here): the least estimate itself."""
    profile = _random_profile(100 + seed)
    estimate, _ = least_cuts(profile, upper=float(profile.produced[-1]), ratio=1.0001)
    assert estimate == pytest.approx(_brute_force(profile))


def test_never_above_the_spacing_heuristic_and_sqrt_n_on_a_uniform_chain():
    """A chain of n one-unit layers, each output read by the next: kept k - 1 units plus a
    segment of n / k, least at k = sqrt(n)."""
    n = 400
    births = np.arange(n)
    deaths = np.minimum(births + 1, n)
    profile = _profile(births, deaths, np.ones(n), n)
    heuristic, _ = memory_cuts(profile)
    estimate, cuts = least_cuts(profile, upper=heuristic)
    assert estimate <= heuristic
    assert estimate <= GRID_RATIO * (2 * np.sqrt(n) - 1)
    assert len(cuts) == pytest.approx(np.sqrt(n) - 1, abs=2)


def test_transformer_like_cuts_keep_the_residual_stream_alone():
    profile = _transformer_like(12)
    heuristic, _ = memory_cuts(profile)
    estimate, cuts = least_cuts(profile, upper=heuristic)
    assert estimate <= heuristic
    assert all([float(profile.sizes[t]) for t in profile.cut(c)] == [1.0] for c in cuts)


def test_no_cut_when_nothing_beats_keeping_everything():
    # The first op's 4 units are read by the last: any cut keeps them, for a 6-unit total.
    profile = _profile([0, 1, 2], [3, 2, 3], [4.0, 1.0, 1.0], 3)
    assert least_cuts(profile, upper=6.0) == (6.0, [])
    with pytest.raises(ValueError, match="ratio above 1"):
        least_cuts(profile, upper=6.0, ratio=1.0)


def _traced(loss_fn, weights, shape, make):
    out = {}

    @tf.function(autograph=False)
    def trace(x):
        loss = loss_fn(x)
        view = ForwardGraph([loss], weights)
        out.update(make(view))
        return loss

    trace.get_concrete_function(tf.TensorSpec(shape))
    return out


def test_a_segment_counts_only_the_tensors_its_gradients_read():
    """Dense + bias + ReLU: MatMul's gradient reads its input, ReLU's its output; neither
    the product nor the biased sum is read, so the read profile counts the ReLU outputs."""
    rng = np.random.default_rng(0)
    weights = [tf.Variable(rng.normal(size=(16, 16)).astype("float32")) for _ in range(4)]
    bias = tf.Variable(np.zeros(16, "float32"))

    def loss_fn(x):
        h = x
        for w in weights:
            h = tf.nn.relu(tf.nn.bias_add(h @ w, bias))
        return tf.reduce_sum(h)

    def make(view):
        profile = cut_profile(view)
        read = read_profile(view, profile)
        types = [profile.ops[b].type for b in profile.births]
        return dict(profile=profile, read=read, types=types)

    out = _traced(loss_fn, weights + [bias], [8, 16], make)
    profile, read, types = out["profile"], out["read"], out["types"]
    relu_bytes = sum(s for s, t in zip(profile.sizes, types) if t == "Relu")
    assert relu_bytes == 4 * 8 * 16 * 4
    assert read.produced[-1] == relu_bytes < profile.produced[-1]
    assert list(read.births) == list(profile.births) and list(read.sizes) == list(profile.sizes)


def test_memory_plans_reach_the_least_read_estimate():
    """On a ReLU chain whose widths vary 16-fold, 'memory''s cuts are within the grid's ratio
    of the least estimate (every bound tried) counting what the segments' gradients read, and
    below the spaced and moved cuts' by more than the 0.5% that must be saved to switch."""
    weights, loss_fn, shape = uneven(batch=64)

    def make(view):
        profile = cut_profile(view)
        read = read_profile(view, profile)
        plan = memory_plan(view)
        position = {op: i for i, op in enumerate(profile.ops)}
        cuts = sorted({position[t.op] for t in plan.tensors if t.op in position})
        _, spaced = memory_cuts(profile)
        exact, _ = least_cuts(read, upper=float(read.produced[-1]), ratio=1.0001)
        return dict(plan=plan_estimate(read, cuts)[0], spaced=plan_estimate(read, spaced)[0],
                    exact=exact)

    out = _traced(loss_fn, weights, shape, make)
    assert out["plan"] <= GRID_RATIO * out["exact"], out
    assert out["plan"] < 0.995 * out["spaced"], out
