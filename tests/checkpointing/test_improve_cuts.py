"""'memory''s cut placement: `improve_cuts` moves each cut to where the estimate (kept bytes
plus the largest segment) is least between its neighbours, and never raises it."""

import numpy as np
import pytest

from memgrad._src.checkpointing.least_cuts import plan_estimate
from memgrad._src.checkpointing.plans import IMPROVE_MIN_GAIN, improve_cuts, memory_cuts
from memgrad._src.graph.separators import CutProfile


def _profile(births, deaths, sizes, n):
    births, deaths, sizes = (np.asarray(a) for a in (births, deaths, sizes))
    produced = np.zeros(n)
    np.add.at(produced, births, sizes)
    delta = np.zeros(n + 1)
    np.add.at(delta, births, sizes)
    np.add.at(delta, deaths, -sizes)
    return CutProfile(list(range(n)), np.cumsum(produced), np.cumsum(delta)[:n], births.astype(np.int64),
                      deaths.astype(np.int64), list(range(len(sizes))), sizes.astype(np.float64))


def _transformer_like(layers=6):
    """Per layer: a residual stream of 1 byte unit, alive from the layer's start to its end,
    and an expansion: 4 units made at the layer's third op and read by its fifth (the MLP's
    hidden activation), with 1-unit temporaries between."""
    births, deaths, sizes = [], [], []
    per = 6
    for layer in range(layers):
        base = layer * per
        births += [base, base + 1, base + 2, base + 3, base + 4]
        deaths += [base + per, base + 2, base + 4, base + 4, base + 5]
        sizes += [1.0, 1.0, 4.0, 1.0, 1.0]
    n = layers * per
    births.append(n - 1)
    deaths.append(n)  # the output
    sizes.append(1.0)
    return _profile(births, deaths, sizes, n)


def test_a_cut_where_a_wide_tensor_is_alive_moves_to_the_narrow_one_beside_it():
    profile = _transformer_like()
    wide = 6 * 2 + 2  # after layer 2's expansion: its residual and the 4-unit tensor alive
    cuts = [5, wide, 23]
    before, _ = plan_estimate(profile, cuts)
    improved = improve_cuts(profile, cuts)
    after, _ = plan_estimate(profile, improved)
    assert improved[1] != wide
    assert after < before
    assert [float(profile.sizes[t]) for t in profile.cut(improved[1])] == [1.0]  # a residual alone


@pytest.mark.parametrize("seed", range(25))
def test_the_estimate_never_rises_and_no_single_move_lowers_it_further(seed):
    """On random layered profiles: the result is sorted, inside the graph, no worse than the
    start, and a local optimum up to the least gain a move must make (checked by trying every
    position for every cut)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(8, 40))
    births = rng.integers(0, n - 1, size=2 * n)
    deaths = np.minimum(births + 1 + rng.geometric(0.4, size=2 * n), n)
    sizes = rng.choice([1.0, 2.0, 4.0, 8.0], size=2 * n)
    profile = _profile(births, deaths, sizes, n)
    k = int(rng.integers(1, max(2, n // 4)))
    cuts = sorted(rng.choice(np.arange(n - 1), size=k, replace=False).tolist())
    improved = improve_cuts(profile, cuts, sweeps=50)
    assert improved == sorted(set(improved)) and len(improved) == len(cuts)
    assert 0 <= improved[0] and improved[-1] <= n - 2
    estimate, start = plan_estimate(profile, improved)[0], plan_estimate(profile, cuts)[0]
    assert estimate <= start + 1e-9
    tolerance = IMPROVE_MIN_GAIN * start + 1e-9
    for j in range(len(improved)):
        lo = improved[j - 1] if j else -1
        hi = improved[j + 1] if j + 1 < len(improved) else n - 1
        for p in range(lo + 1, hi):
            moved = improved[:j] + [p] + improved[j + 1:]
            assert plan_estimate(profile, moved)[0] >= estimate - tolerance, (j, p)


def test_memory_cuts_ends_no_higher_than_its_spacing_alone():
    profile = _transformer_like(12)
    estimate, cuts = memory_cuts(profile)
    assert cuts
    assert all(len(profile.cut(c)) == 1 for c in cuts), [profile.cut(c) for c in cuts]
    assert estimate == plan_estimate(profile, cuts)[0]
