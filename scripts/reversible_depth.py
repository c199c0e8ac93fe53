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
    python scripts/reversible_depth.py --policy mixed_float16   # a Keras dtype policy

As in the suite's probe, oneDNN's allocator keeps the statistics (TF_ENABLE_ONEDNN_OPTS=1,
TF_CPU_ALLOCATOR_USE_BFC=false): every tensor here is at least 1 MiB, which it counts
exactly, where BFC adds the slack of chunks it hands out whole.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def run(kind: str, depth: int, graph: bool, policy: str | None = None) -> dict:
    """tests/reversible/memory_probe.py's `frozen_peaks` in a fresh Python process, in MiB."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # importing memgrad imports TensorFlow here too
    from memgrad._src.profiler.fresh import run_in_fresh_process

    found = run_in_fresh_process("tests.reversible.memory_probe:frozen_peaks", [kind, depth, graph, 5, policy],
                                 timeout=1800, cwd=ROOT,
                                 env={"TF_ENABLE_ONEDNN_OPTS": "1", "TF_CPU_ALLOCATOR_USE_BFC": "false",
                                      "TF_CPP_MIN_LOG_LEVEL": "2"})
    return {key: value / 2**20 for key, value in found.items()}


def _cell(result: dict) -> str:
    return f"{result['peak']:.2f} ({result['requested']:.2f} req.)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=["additive", "affine"], default="additive")
    parser.add_argument("--depths", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--policy", default=None,
                        help="a Keras dtype policy for the blocks' networks (float64, mixed_float16, "
                             "float16; default: Keras's, float32)")
    args = parser.parse_args(argv)
    policy = f", {args.policy} policy" if args.policy else ""
    print(f"{args.kind} couplings{policy}, frozen, gradient with respect to the input "
          "(MiB; each cell its own process)")
    print(f"{'mode':<14}" + "".join(f"{str(d) + ' blocks':>20}" for d in args.depths) + f"{'growth':>18}")
    for graph in (False, True):
        found = [run(args.kind, depth, graph, args.policy) for depth in args.depths]
        cells = "".join(f"{_cell(r):>20}" for r in found)
        growth = f"{found[-1]['peak'] / found[0]['peak']:.2f}x ({found[-1]['requested'] / found[0]['requested']:.2f}x)"
        print(f"{'tf.function' if graph else 'eager':<14}{cells}{growth:>18}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
