"""The copies of a recomputed segment that never run, and the FLOPs a segment does recompute.

The rewrite copies a segment whole, but TensorFlow runs only the copies some gradient
depends on. The copy of an op does not run when each of the op's outputs is either kept by
the cut that ends the segment (the kept tensor is read instead of the copy's; a kept ReLU's
gradient reads the kept output, `memgrad._src.checkpointing.segment_ends.peel`) or read by no
gradient and consumed only by ops whose copies do not run either (the matrix product that
feeds that ReLU: its own gradient reads its inputs, not its output). On a ReLU chain cut at
ReLUs that is two ops of every segment; counting them made the model's recomputation twice
what runs (`memgrad.RewriteRecord.recomputed_flops` reads what runs).
"""

import heapq

import numpy as np


def idle_positions(model, b):
    """Sorted positions, at most ``b``, of the ops whose copies do not run in a segment that
    ends at position ``b`` (`MemoryModel` positions; whichever position the segment starts
    at, the ops after it among these)."""
    profile, position = model.profile, model.position
    kept = ((profile.births <= b) & (profile.deaths > b)) | model._forced
    heap = [-int(p) for p in np.unique(profile.births[kept]) if p <= b] + [-int(b)]
    heapq.heapify(heap)
    seen, idle = set(), set()
    while heap:
        p = -heapq.heappop(heap)
        if p in seen:
            continue
        seen.add(p)  # every consumer of op p comes later: all are decided by now
        op = profile.ops[p]
        if _copy_idle(model, op, kept, idle):
            idle.add(p)
            for t in op.inputs:
                if t.op in position:
                    heapq.heappush(heap, -position[t.op])
    return np.array(sorted(idle), dtype=np.int64)


def _copy_idle(model, op, kept, idle):
    outputs_read = model.reads[model.position[op]][1]
    if outputs_read and len(op.outputs) > 1:
        return False  # its gradient is taken on the copy, which reads the copy's outputs
    for k, t in enumerate(op.outputs):
        j = model.index.get(t.ref())
        if j is not None and kept[j]:
            continue
        if k in outputs_read:
            return False
        for consumer in t.consumers():
            q = model.position.get(consumer)
            if q is None:
                if consumer in model.view.region:
                    return False  # a forward op outside the activation order: assumed to run
                continue
            read = model.reads[q][0]
            if q not in idle or any(i in read for i, x in enumerate(consumer.inputs)
                                    if x.ref() == t.ref()):
                return False
    return True


def segment_flops(model, starts, b):
    """FLOPs recomputed for the segments ``(a, b]`` for each ``a`` in ``starts`` (a NumPy
    array or an int): the ops after ``a`` up to ``b`` less those whose copies do not run,
    and nothing for a single op, which is differentiated in place."""
    idle = model._idle.get(b)
    if idle is None:
        idle = model._idle[b] = idle_positions(model, b)
    cumulative = np.concatenate([[0.0], np.cumsum(model.flops[idle])])
    starts = np.asarray(starts)
    after = cumulative[-1] - cumulative[np.searchsorted(idle, starts, side="right")]
    flops = model.flops_prefix[b + 1] - model.flops_prefix[starts + 1] - after
    return np.where(b - starts <= 1, 0.0, flops)
