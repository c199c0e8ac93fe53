"""The memory-budget planner: the cheapest cut positions that fit a byte budget under the
memory model, and the candidate plans a `Budget` measures (see `budget.py`).

`checkpoints=memgrad.strategies.Budget("96MiB")` (or `Budget(0.3)`, a fraction of the predicted plain
peak) chooses cut positions along the activation ops' topological order. Every cut keeps
the tensors alive across it (a separator, see `memgrad._src.graph.cut_profile`); the segments
between cuts are recomputed in backward, the last one excepted. The predicted peak and the
recomputed FLOPs of a plan come from `memgrad._src.graph.MemoryModel`.

The search is a dynamic program over cut positions, in forward order. Its state is the
last cut and the bytes kept so far, because every segment's peak is the kept bytes of the
cuts before it plus the segment's own bytes. Kept bytes are grouped into bands of the
budget (`BUCKET_CELLS` over the number of positions, between `MIN_BUCKETS` and
`MAX_BUCKETS` bands); each band holds the cheapest plan reaching it, with its exact kept
bytes, so every plan returned fits the budget under the model. Within a band a plan with
more FLOPs and fewer kept bytes is dropped, which is where the search may miss the optimum.
Against the exact optimum (tests/checkpointing/exact_plans.py, no bands) on graphs of
14-105 ops, at 20 budgets from the smallest feasible to plain backprop's, it recomputes
the optimum's FLOPs on all of them with 256 bands; with 64 it recomputed up to 36% more
on a chain of uneven widths and 11% more on dense blocks. On graphs with more than
`DENSE_LIMIT` candidate positions, the positions where the live bytes are at a local
minimum are candidates, with evenly spaced others up to `DENSE_LIMIT`. The 'memory'
strategy's placements (cuts near equal shares of the bytes, for every number of segments)
are evaluated too, and the cheapest feasible plan is returned.
"""

import dataclasses
import math

import numpy as np
import tensorflow as tf

from memgrad._src.checkpointing.plans import absorb_bias, cuts_for, memory_cuts
from memgrad._src.graph import idle_copies
from memgrad._src.graph.memory_model import MemoryModel
from memgrad._src.units import format_bytes

# Bands of kept bytes in the dynamic program: as many as fit BUCKET_CELLS (positions x
# bands) within these bounds (256 bands up to 256 positions, 64 from 1,024).
MIN_BUCKETS = 64
MAX_BUCKETS = 256
BUCKET_CELLS = 65536
DENSE_LIMIT = 512
# The budgets, as shares of the modelled plain peak, that a simulating Budget's candidate
# plans are made for (see `Planner.candidate_plans`).
CANDIDATE_LEVELS = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)
# How many prefixes of the 'memory' plan are candidates (see `_prefixes`).
PREFIXES = 8


class BudgetError(ValueError):
    """No checkpoint plan fits the budget (under the memory model).

    The message states the smallest budget some plan fits, in the terms the budget was
    given in (bytes, or a fraction). Raised while a `tf.function` is traced; autograph
    lets it through unchanged (``ag_pass_through``), so the error caught around the
    function's call, or around Keras's ``fit``, is this one, attributes and all.

    Attributes:
      budget_bytes: the budget asked for, in bytes.
      smallest_feasible_bytes: the smallest budget some plan fits, in whole bytes (rounded
        up: ``Budget(error.smallest_feasible_bytes)`` is accepted).
      smallest_feasible_fraction: the same as a `Budget` fraction (None for a byte budget,
        and when it would exceed 1: the message then names the bytes).
      plain_bytes: the predicted peak of plain backprop.
    """

    __init__ = Exception.__init__  # autograph re-creates only errors built from a message
    # Autograph re-raises a converted function's errors as new ones built from the message
    # (attributes lost) unless the error carries this attribute: then the original passes.
    ag_pass_through = True
    budget_bytes = smallest_feasible_bytes = smallest_feasible_fraction = plain_bytes = None


_SOURCE_WORDS = {"measured": "measured", "simulated": "simulated", "model": "modelled"}


def budget_error(budget_bytes, smallest_feasible_bytes, plain_bytes, margin=0.0, fraction=None,
                  source="model"):
    held = f", with the {margin:.0%} margin" if margin else ""
    how = _SOURCE_WORDS.get(source, source)
    # A whole number of bytes, rounded up (after float noise is rounded away): the budget
    # the error names is one `Budget` accepts when it is passed back.
    smallest_feasible_bytes = int(math.ceil(round(smallest_feasible_bytes, 6)))
    smallest_fraction = None
    if fraction is not None and plain_bytes > 0:
        # Rounded up, so the fraction named fits.
        smallest_fraction = math.ceil(smallest_feasible_bytes / plain_bytes * 1000) / 1000
        asked = f"Budget({fraction!r}) ({format_bytes(budget_bytes)})"
        expected = (f"a fraction of at least {smallest_fraction:g} "
                    f"({format_bytes(smallest_feasible_bytes)})")
        if smallest_fraction > 1.0:
            # No fraction can say it (a fractional Budget is at most 1): name the bytes.
            needed = smallest_feasible_bytes
            error = BudgetError(
                f"No checkpoint plan fits a budget of {asked} of activations. Expected a budget "
                f"of at least {needed} bytes ({format_bytes(smallest_feasible_bytes)}): the "
                f"smallest {how} peak of any plan ('memory' and the leaner ones){held}. "
                f"That is more than plain backprop's {how} peak of {int(plain_bytes)} bytes "
                f"({format_bytes(plain_bytes)}), so no fraction in (0, 1] expresses it: give "
                f"the budget in bytes, e.g. memgrad.strategies.Budget({needed}). Received: "
                f"Budget({fraction!r}), {int(budget_bytes)} bytes."
            )
            error.budget_bytes = budget_bytes
            error.smallest_feasible_bytes = smallest_feasible_bytes
            error.plain_bytes = plain_bytes
            return error  # smallest_feasible_fraction stays None
    else:
        asked = format_bytes(budget_bytes)
        expected = f"a budget of at least {format_bytes(smallest_feasible_bytes)}"
    error = BudgetError(
        f"No checkpoint plan fits a budget of {asked} of activations. Expected {expected}: "
        f"the smallest {how} peak of any plan{held}; plain backprop's {how} peak is "
        f"{format_bytes(plain_bytes)}. Received: {asked}."
    )
    error.budget_bytes = budget_bytes
    error.smallest_feasible_bytes = smallest_feasible_bytes
    error.smallest_feasible_fraction = smallest_fraction
    error.plain_bytes = plain_bytes
    return error



def _local_minima(live, positions):
    """Positions whose live bytes are at a local minimum (plateaus keep their last)."""
    keep = []
    for i, p in enumerate(positions):
        before = live[positions[i - 1]] if i > 0 else np.inf
        after = live[positions[i + 1]] if i + 1 < len(positions) else np.inf
        if live[p] <= before and live[p] < after:
            keep.append(p)
    return keep


def _band_winners(band, flops, kept, bands):
    """Per band, the transition with the fewest FLOPs, then the fewest kept bytes, then the
    first in order: ``(indices, their bands)``, bands ascending. Two minimum reductions and
    a unique over the ties, O(n): a sort on (band, FLOPs, kept) took most of a solve."""
    least = np.full(bands, np.inf)
    np.minimum.at(least, band, flops)
    tied = np.flatnonzero(flops == least[band])
    least_kept = np.full(bands, np.inf)
    np.minimum.at(least_kept, band[tied], kept[tied])
    tied = tied[kept[tied] == least_kept[band[tied]]]
    dest, first = np.unique(band[tied], return_index=True)
    return tied[first], dest


def _thinned(live, positions, limit=DENSE_LIMIT):
    """At most about ``limit`` of ``positions`` for the dynamic program: those where the live
    bytes are at a local minimum, and, where they are fewer than ``limit``, evenly spaced
    others up to it. Minima alone are too few on a flat profile: a chain of identical layers
    has one plateau, whose last position was the only candidate (a 300-layer Dense chain
    left the program none, so a Budget chose among the 'memory' placements only)."""
    minima = _local_minima(live, positions)
    room = limit - len(minima)
    if room <= 0:
        return minima
    taken = set(minima)
    others = [p for p in positions if p not in taken]
    step = max(1, math.ceil(len(others) / room))
    return sorted(taken.union(others[step - 1::step]))


class Planner:
    """The dynamic program over cut positions for one graph."""

    def __init__(self, view, model=None, hold_gradients=True, kernels=None):
        self.view = view
        self.model = model or MemoryModel(view, hold_gradients, kernels)
        m = self.model
        pr = m.profile
        self.n = m.n
        self.plain_bytes, _ = m.predict([])
        movable = set()
        for t in pr.tensors:
            moved = absorb_bias(view, [t])
            if moved[0].ref() != t.ref():
                movable.add(t.ref())
        candidates = []
        for p in range(self.n - 1):
            if m.cut_bytes(p) > 0 and not any(t.ref() in movable for t in pr.cut(p)):
                candidates.append(p)
        if len(candidates) > DENSE_LIMIT:
            candidates = _thinned(pr.live, candidates)
        self.candidates = candidates
        self._family = None
        self._candidates = None
        self._solved = {}  # budget -> `solve`'s cuts, for `cheapest`
        # Per tensor, excluding tensors every plan keeps anyway.
        self._births = pr.births[~m._forced]
        self._deaths = pr.deaths[~m._forced]
        self._sizes = pr.sizes[~m._forced]

    def family(self):
        """The 'memory' strategy's placements: `(peak, cost, cuts)` for every number of
        segments, cuts near equal shares of the bytes (computed once)."""
        if self._family is None:
            self._family = []
            for segments in range(2, min(self.n, 2 * math.isqrt(self.n) + 3) + 1):
                cuts = cuts_for(self.model.profile, segments)
                if cuts:
                    self._family.append(self.model.predict(cuts) + (cuts,))
        return self._family

    def _final(self, a):
        return self.model.segment_bytes(a, self.n - 1)

    def solve(self, budget):
        """The cheapest cut positions whose predicted peak fits `budget`, or None."""
        m = self.model
        n, B = self.n, float(budget)
        forced = m.forced_prefix  # [a + 1]: kept while segments after a run backward
        starts = np.array([-1] + self.candidates, dtype=np.int64)
        S = len(starts)
        K = int(min(MAX_BUCKETS, max(MIN_BUCKETS, BUCKET_CELLS // S)))
        unit = max(B / K, 1.0)
        flops = np.full((S, K), np.inf)
        kept = np.full((S, K), np.inf)
        parent = np.full((S, K, 2), -1, dtype=np.int64)
        flops[0, 0] = 0.0
        kept[0, 0] = 0.0
        saved_prefix = m.saved_prefix
        for i in range(1, S):
            b = starts[i]
            # States a < b whose segment (a, b] could fit: saved bytes alone must fit.
            lo = np.searchsorted(
                saved_prefix[starts[:i] + 1], saved_prefix[b + 1] - B, side="left")
            window = np.arange(lo, i)
            if not len(window):
                continue
            a = starts[window]
            seg = m.backward_tops(b)[a + 1] - saved_prefix[a + 1]
            seg_flops = idle_copies.segment_flops(m, a, b)
            across = (self._births <= b) & (self._deaths > b)
            by_birth = np.bincount(self._births[across], weights=self._sizes[across],
                                   minlength=n)
            born_before = np.concatenate([[0.0], np.cumsum(by_birth)])  # [q + 1]: birth <= q
            new = born_before[-1] - born_before[a + 1]

            k_a = kept[window]                      # (w, K)
            f_a = flops[window]
            ok = np.isfinite(f_a) & (forced[a + 1][:, None] + k_a + seg[:, None] <= B)
            new_kept = k_a + new[:, None]
            ok &= forced[b + 1] + new_kept <= B
            if not ok.any():
                continue
            rows, cols = np.nonzero(ok)
            nk = new_kept[rows, cols]
            nf = f_a[rows, cols] + seg_flops[rows]
            bucket = np.minimum((nk // unit).astype(np.int64), K - 1)
            pick, dest = _band_winners(bucket, nf, nk, K)
            flops[i, dest] = nf[pick]
            kept[i, dest] = nk[pick]
            parent[i, dest, 0] = window[rows[pick]]
            parent[i, dest, 1] = cols[pick]

        best = None
        for i in range(S):
            a = starts[i]
            fin = forced[a + 1] + kept[i] + self._final(a)
            feasible = np.isfinite(flops[i]) & (fin <= B)
            if not feasible.any():
                continue
            k = np.flatnonzero(feasible)
            k = k[np.lexsort((fin[k], flops[i, k]))[0]]
            key = (flops[i, k], fin[k])
            if best is None or key < best[0]:
                best = (key, i, k)
        if best is None:
            return None
        _, i, k = best
        cuts = []
        while i > 0:
            cuts.append(int(starts[i]))
            i, k = parent[i, k]
        return sorted(cuts)

    def cheapest(self, budget):
        """`solve(budget)`, computed once per budget."""
        if budget not in self._solved:
            self._solved[budget] = self.solve(budget)
        return self._solved[budget]

    def smallest_feasible(self, tolerance=0.005):
        """The smallest budget some plan fits (bisection over `solve`, within `tolerance`)."""
        # Start from the best 'memory' placement (it fits its own peak): the searches
        # then run at tight budgets, where the dynamic program's windows are short.
        hi = min([self.plain_bytes] + [peak for peak, _, _ in self.family()])
        lo = 0.0
        while hi - lo > tolerance * hi:
            mid = (lo + hi) / 2
            if self.solve(mid) is None:
                lo = mid
            else:
                hi = mid
        return hi

    def plan(self, budget):
        """`(cuts, predicted peak, recomputed FLOPs)` of the cheapest plan within `budget`.

        Raises:
          BudgetError: when no plan fits.
        """
        m = self.model
        if budget >= self.plain_bytes:
            return [], self.plain_bytes, 0.0
        cuts = self.solve(budget)
        options = [] if cuts is None else [m.predict(cuts) + (cuts,)]
        options += [option for option in self.family() if option[0] <= budget]
        if not options:
            raise budget_error(budget, self.smallest_feasible(), self.plain_bytes)
        peak, cost, cuts = min(options, key=lambda option: option[1])
        return cuts, peak, cost

    def candidate_plans(self, budget=None):
        """The plans a measuring or simulating `Budget` chooses among: `(cost, predicted
        peak, cuts)` sorted by recomputed FLOPs (then peak), distinct.

        They are the cheapest plans under the model for budgets of `CANDIDATE_LEVELS` of
        its plain peak, its leanest plan, and the 'memory' strategy's plan (which the model
        may rank too high: ResNet50's simulates at 43 MiB where the model's leanest does at
        101), the same for every budget; with ``budget`` (bytes on the model's scale), also
        the model's cheapest plan for it, which makes the family continuous: the fixed
        plans alone recomputed up to 2.5x the optimum between their levels.
        """
        fixed = self._fixed_candidates()
        if budget is None or budget >= self.plain_bytes:
            return fixed
        cuts = self.cheapest(budget)
        if not cuts or any(list(cuts) == option[2] for option in fixed):
            return fixed
        peak, cost = self.model.predict(cuts)
        return sorted(fixed + [(cost, peak, cuts)], key=lambda option: option[:2])

    def _fixed_candidates(self):
        if self._candidates is None:
            found = {}
            for level in CANDIDATE_LEVELS:
                cuts = self.solve(level * self.plain_bytes)
                if cuts is None:
                    break
                found.setdefault(tuple(cuts), cuts)
            leanest = self.solve(self.smallest_feasible())
            _, memory = memory_cuts(self.model.profile)
            for cuts in (leanest, memory):
                if cuts:
                    found.setdefault(tuple(cuts), list(cuts))
            for cuts in _prefixes(memory):
                found.setdefault(tuple(cuts), cuts)
            options = [self.model.predict(cuts) + (cuts,) for cuts in found.values() if cuts]
            self._candidates = sorted(((cost, peak, cuts) for peak, cost, cuts in options),
                                      key=lambda option: option[:2])
        return self._candidates


def _prefixes(cuts, count=PREFIXES):
    """Up to ``count`` plans between plain backprop and the plan ``cuts``: its first k cuts,
    for k spread evenly over 1 .. len(cuts) - 1. Everything after the last of them is kept
    (the last segment is never recomputed), so the forward pass is recomputed only up to
    there: a family from plain backprop to the plan that does not rest on the memory model's
    peaks, which can miss by 2x (ResNet50's 'memory' plan: 124.7 MiB modelled, 50 measured)."""
    cuts = list(cuts or [])
    if len(cuts) < 2:
        return []
    ks = sorted({max(1, round(len(cuts) * i / (count + 1))) for i in range(1, count + 1)})
    return [cuts[:k] for k in ks if k < len(cuts)]


@dataclasses.dataclass
class CurvePoint:
    """One point of the budget curve.

    Attributes:
      budget_bytes: the budget.
      predicted_bytes: the chosen plan's predicted activation peak (None if none fits).
      recomputed_flops: FLOPs the plan runs again in backward.
      extra_compute: recomputed FLOPs over the forward pass's FLOPs.
      checkpoints: how many tensors the plan keeps.
    """

    budget_bytes: float
    predicted_bytes: float
    recomputed_flops: float
    extra_compute: float
    checkpoints: int


@tf.autograph.experimental.do_not_convert
def budget_curve(view, budgets=None, points=8, model=None):
    """Predicted peak and recomputation for a range of budgets.

    Args:
      view: a `memgrad._src.graph.ForwardGraph`.
      budgets: budgets in bytes; by default `points` budgets spaced evenly from the
        smallest feasible one to plain backprop's predicted peak.
      points: how many default budgets.
      model: a `memgrad._src.graph.MemoryModel` of the view, if one exists already.

    Returns:
      A list of `CurvePoint`, one per budget, smallest budget first.

    Example:
      ```python
      view = memgrad._src.graph.ForwardGraph([loss], variables)   # inside a tf.function
      for point in budget_curve(view, points=5):
          print(point.budget_bytes, point.predicted_bytes, point.extra_compute)
      ```
    """
    planner = Planner(view, model)
    forward = float(planner.model.flops.sum())
    if budgets is None:
        low = planner.smallest_feasible()
        budgets = np.linspace(low, planner.plain_bytes, points)
    curve = []
    for budget in sorted(float(b) for b in budgets):
        try:
            cuts, peak, cost = planner.plan(budget)
        except BudgetError:
            curve.append(CurvePoint(budget, None, float("nan"), float("nan"), 0))
            continue
        kept = len(planner.model.tensors_for(cuts))
        curve.append(CurvePoint(budget, peak, cost, cost / forward if forward else 0.0, kept))
    return curve
