"""A reversible stack's peak at several depths, each depth alone in a fresh process.

The stack of tests/reversible/memory_probe.py (additive or affine couplings, batch 4096,
width 128, the default float64 carry), frozen and differentiated with respect to its input:
what a training step holds besides the weights' gradients. Each (depth, mode) runs in its own
Python process with one inter-op thread, so no earlier step's allocations shape the
allocator's fitting; the suite's probe measures every depth in one process, one after the
other. Prints the allocator's peak (median of five calls, the first warmed up) and the bytes
requested at the peak (TensorFlow's profiler), in MiB.

    python scripts/reversible_depth.py                       # additive, 8 and 64 blocks
    python scripts/reversible_depth.py --kind affine --depths 8 32 64

As in the suite's probe, oneDNN's allocator keeps the statistics (TF_ENABLE_ONEDNN_OPTS=1,
TF_CPU_ALLOCATOR_USE_BFC=false): every tensor here is at least 1 MiB, which it counts
exactly, where BFC adds the slack of chunks it hands out whole.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = "REVERSIBLE_DEPTH "


def measure(kind: str, depth: int, graph: bool) -> dict:
    """In this process: the frozen stack's peaks, in MiB."""
    import tensorflow as tf

    import memgrad
    from tests.reversible.memory_probe import BATCH, WIDTH, input_gradient_step, make_stack

    tf.config.threading.set_inter_op_parallelism_threads(1)
    x = tf.random.stateless_normal([BATCH, WIDTH], seed=[0, 1])
    step = input_gradient_step(make_stack(kind, depth), graph)
    peaks = sorted(memgrad.profiler.measure(step, args=(x,), device="CPU:0", warmup=int(call == 0))
                   .peak_above_baseline_bytes for call in range(5))
    requested = memgrad.profiler.largest_live_tensors(step, args=(x,), k=1, device="CPU:0").requested_peak_bytes
    return {"peak": peaks[2] / 2**20, "requested": requested / 2**20}


def run(kind: str, depth: int, graph: bool) -> dict:
    """`measure` in a fresh Python process."""
    env = dict(os.environ, PYTHONPATH=ROOT, TF_ENABLE_ONEDNN_OPTS="1", TF_CPU_ALLOCATOR_USE_BFC="false",
               TF_CPP_MIN_LOG_LEVEL="2")
    child = subprocess.run([sys.executable, "-W", "ignore", os.path.abspath(__file__), "--child",
                            kind, str(depth), "graph" if graph else "eager"],
                           cwd=ROOT, env=env, capture_output=True, text=True)
    for line in child.stdout.splitlines():
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):])
    raise RuntimeError(f"{kind} at {depth} blocks failed:\n{child.stderr[-3000:]}")


def _cell(result: dict) -> str:
    return f"{result['peak']:.2f} ({result['requested']:.2f} req.)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=["additive", "affine"], default="additive")
    parser.add_argument("--depths", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, depth, mode = args.child
        print(MARKER + json.dumps(measure(kind, int(depth), mode == "graph")), flush=True)
        return 0
    print(f"{args.kind} couplings, frozen, gradient with respect to the input (MiB; each cell its own process)")
    print(f"{'mode':<14}" + "".join(f"{str(d) + ' blocks':>20}" for d in args.depths) + f"{'growth':>18}")
    for graph in (False, True):
        found = [run(args.kind, depth, graph) for depth in args.depths]
        cells = "".join(f"{_cell(r):>20}" for r in found)
        growth = f"{found[-1]['peak'] / found[0]['peak']:.2f}x ({found[-1]['requested'] / found[0]['requested']:.2f}x)"
        print(f"{'tf.function' if graph else 'eager':<14}{cells}{growth:>18}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
