"""The 'memory' plan's cuts: the least estimated peak, by dynamic programming.

The model (`memgrad._src.checkpointing.plans`): the activation ops in topological order,
cuts after some of them; the backward pass keeps every tensor alive across a cut, and
recomputes one segment (the ops between two cuts) at a time, so the estimated peak is the
kept bytes plus the bytes the largest segment produces.

For a bound S on the largest segment, the least kept bytes K(S) is a shortest path over cut
positions. A tensor alive across cuts i < j is alive across every cut between them, so
counting each kept tensor at the first cut it crosses counts it once: a cut j after the
cut i adds the tensors born after i and alive across j, ``w(i, j)``, and a path from the
start to the end whose every step produces at most S bytes is a plan.

The search is a branch and bound over S. K is non-increasing, so a plan whose largest
segment lies in (S_a, S_b] keeps at least K(S_b) and estimates more than K(S_b) + S_a. A
coarse geometric grid (ratio `COARSE_RATIO`) from the largest op's bytes up to a known
plan's estimate gives plans and, per interval, that lower bound; the intervals whose bound
is under the best plan's estimate divided by the fine ratio are solved again on a fine grid
(ratio ``r``). The optimum's largest segment M lies in an interval that was either dropped
(its bound, at most the optimum, times ``r`` is above the plan found) or refined, where a
grid value S <= r M keeps at most the optimum's bytes: the plan found is within ``r`` of
the least estimate. Each solve takes every bound of its grid together, one position at a
time: O(n * bounds * window) for n positions and the positions within the largest bound.
"""

import dataclasses

import numpy as np

from memgrad._src.graph.memory_model import tensors_read

# The fine grid's ratio: the plan found is within this factor of the model's least estimate.
GRID_RATIO = 1.01
# The first grid's ratio, whose intervals the fine grid refines where they can still win.
COARSE_RATIO = 1.15


def least_cuts(profile, upper, ratio=GRID_RATIO):
    """Cut positions whose estimated peak is within ``ratio`` of the least any cuts reach.

    Args:
      profile: a `memgrad._src.graph.separators.CutProfile`.
      upper: the estimate of a known plan (or the total bytes): no plan whose largest
        segment exceeds it can beat it, so larger bounds are not solved.
      ratio: the fine grid's ratio, > 1.

    Returns:
      ``(estimate, cuts)``: the estimate (kept bytes plus the largest segment's bytes) and
      the sorted cut positions; ``(total, [])`` when no cut helps.
    """
    if not ratio > 1:
        raise ValueError(f"Expected a grid ratio above 1. Received: {ratio!r}")
    n = len(profile.ops)
    produced = np.asarray(profile.produced, dtype=np.float64)
    total = float(produced[-1]) if n else 0.0
    if n < 3 or total <= 0:
        return total, []
    low = float(np.diff(np.concatenate([[0.0], produced])).max())
    upper = min(float(upper), total)
    if low >= upper:
        return total, []
    solver = _Solver(profile)
    coarse = max(ratio, COARSE_RATIO)
    bounds = _grid(low, upper, coarse)
    kept, plans = solver.solve(bounds)
    best = min(plans, key=lambda plan: plan[0], default=(total, []))
    if coarse > ratio:
        # Plans whose largest segment lies in (bounds[k - 1], bounds[k]] keep at least
        # kept[k]; the first interval starts at the largest op, under which no plan lies.
        starts = np.concatenate([[low], bounds[:-1]])
        fine = [_grid(a, b, ratio)[1:] for a, b, k_b in zip(starts, bounds, kept)
                if k_b + a < best[0] / ratio and b > a]
        if fine:
            _, refined = solver.solve(np.unique(np.concatenate(fine)))
            best = min([best] + refined, key=lambda plan: plan[0])
    if best[0] >= total:
        return total, []
    return best


def _grid(low, high, ratio):
    """``low * ratio**k`` up to and including ``high``."""
    count = max(int(np.ceil(np.log(high / low) / np.log(ratio))), 0) + 1
    bounds = low * ratio ** np.arange(count)
    bounds[-1] = high
    return bounds


class _Solver:
    """The shortest paths for a set of bounds on the segments' bytes."""

    def __init__(self, profile):
        self.profile = profile
        n = self.n = len(profile.ops)
        self.produced = np.asarray(profile.produced, dtype=np.float64)
        # Nodes: 0 is the start (nothing produced), node p + 1 a cut after op p.
        self.at = np.concatenate([[0.0], self.produced[:n - 1]])
        births, deaths = profile.births, profile.deaths
        self.born = [[] for _ in range(n)]
        self.dying = [[] for _ in range(n + 1)]
        for k in np.flatnonzero(deaths > births):
            self.born[births[k]].append(k)
            self.dying[min(deaths[k], n)].append(k)

    def solve(self, bounds):
        """Returns ``(K, plans)``: the least kept bytes for each bound (inf where no path
        exists) and, for each bound with a path, its ``(estimate, cuts)``."""
        n, produced, at = self.n, self.produced, self.at
        births, sizes = self.profile.births, self.profile.sizes
        count = len(bounds)
        alive_by_birth = np.zeros(n + 1)  # index b + 1: bytes born at b, alive across the cut
        kept = np.full((count, n), np.inf)  # least kept bytes of a path ending at a node
        parent = np.zeros((count, n), dtype=np.int64)
        kept[:, 0] = 0.0
        rows = np.arange(count)
        for p in range(n - 1):  # the cut after op p, node p + 1
            for k in self.born[p]:
                alive_by_birth[births[k] + 1] += sizes[k]
            for k in self.dying[p]:
                alive_by_birth[births[k] + 1] -= sizes[k]
            node = p + 1
            first = min(int(np.searchsorted(at, produced[p] - bounds[-1], side="left")),
                        node - 1)
            # w[i - first]: bytes born after node i's op and alive across this cut.
            w = np.cumsum(alive_by_birth[first + 1:node + 1][::-1])[::-1]
            paths = kept[:, first:node] + w[None, :]
            # Node i reaches here within bound b where at[i] >= produced[p] - bounds[b].
            reach_from = np.searchsorted(at[first:node], produced[p] - bounds, side="left")
            paths[np.arange(node - first)[None, :] < reach_from[:, None]] = np.inf
            best = np.argmin(paths, axis=1)
            kept[:, node] = paths[rows, best]
            parent[:, node] = best + first
        finals = np.where((produced[-1] - at)[None, :] <= bounds[:, None], kept, np.inf)
        least = finals.min(axis=1)
        plans = []
        for b in range(count):
            node = int(np.argmin(finals[b]))
            if not np.isfinite(finals[b, node]) or node == 0:
                continue
            cuts = []
            while node != 0:
                cuts.append(node - 1)
                node = int(parent[b, node])
            cuts.reverse()
            plans.append((plan_estimate(self.profile, cuts)[0], cuts))
        return least, plans


def read_profile(view, profile):
    """``profile`` with ``produced`` counting only the tensors some gradient reads.

    A recomputed segment holds, at its backward pass's start, the tensors its gradients read
    (the rest are freed in the recomputation as in any forward pass), so these bytes, not
    every byte the segment makes, are its share of the peak: on GPT-2 (keras-hub, 6x384,
    batch 8x128) 'memory''s plan estimates 52.5 MiB so, against 106.5 counting every byte,
    and requested 58.5 MiB when measured (one inter-op thread, the weights' gradients
    applied as made).

    Args:
      view: the `memgrad._src.graph.ForwardGraph` the profile was made from.
      profile: its `memgrad._src.graph.separators.CutProfile`.

    Returns:
      A `CutProfile` with the same tensors and a new ``produced``.
    """
    read = set()
    for op in profile.ops:
        ins, outs = tensors_read(view, op)
        read.update(t.ref() for t in ins + outs)
    per_op = np.zeros(len(profile.ops))
    for k, t in enumerate(profile.tensors):
        if t.ref() in read:
            per_op[profile.births[k]] += profile.sizes[k]
    return dataclasses.replace(profile, produced=np.cumsum(per_op))


def plan_estimate(profile, cuts):
    """The estimated peak of cutting ``profile`` after the positions ``cuts``.

    Returns:
      ``(estimate, kept)``: the kept bytes (the tensors alive across any cut) plus the
      largest segment's bytes, and the kept bytes alone.
    """
    total = float(profile.produced[-1]) if len(profile.produced) else 0.0
    if not len(cuts):
        return total, total
    cuts = np.asarray(sorted(cuts), dtype=np.int64)
    first = np.searchsorted(cuts, profile.births)
    kept_mask = first < len(cuts)
    kept_mask[kept_mask] &= cuts[first[kept_mask]] < profile.deaths[kept_mask]
    kept = float(profile.sizes[kept_mask].sum())
    bounds = np.concatenate([[0.0], profile.produced[cuts], [total]])
    return kept + float(np.max(np.diff(bounds))), kept
