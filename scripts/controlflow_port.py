"""TensorFlow's control-flow gradient tests, re-expressed, through every memgrad entry point.

Runs every case of tests/checkpointing/controlflow_port.py (while loops, conds and
switch_case, TensorArrays, scan/fold/map_fn, Keras's recurrent layers; gradients up to the
4th order; gradients taken inside loop bodies and branches) through each entry point
('memory', 'speed', 'collection', a Budget, memgrad.GradientTape, monkey_patch), without and
with XLA, against tf.gradients (and tf.GradientTape for the tape). Prints a markdown table of
the outcomes and writes them all to a JSON file (the table in docs/loops.md comes from it).

    python scripts/controlflow_port.py                          # the whole matrix
    python scripts/controlflow_port.py --xla off --match scan   # a part of it
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tests.checkpointing import controlflow_port as port  # noqa: E402

STATUSES = ("exact", "fallback", "unmarked", "unsupported", "wrong", "none", "crash")


def _rows(case, xla, outcomes):
    return [{"case": case.name, "origin": case.origin, "order": case.order, "xla": xla,
             "entry": entry, "status": o.status, "detail": o.detail}
            for entry, o in outcomes.items()]


def run(cases, xla, out=None):
    """Runs ``cases`` in this process; each case's rows are appended to ``out`` (JSON
    lines) as soon as they are known, when given."""
    rows = []
    for case in cases:
        start = time.perf_counter()
        outcomes = port.run_case(case, jit_compile=xla)
        seconds = time.perf_counter() - start
        rows.extend(_rows(case, xla, outcomes))
        if out is not None:
            with open(out, "a") as f:
                f.write(json.dumps(_rows(case, xla, outcomes)) + "\n")
        bad = {e: o.status for e, o in outcomes.items() if o.status != "exact"}
        print(f"{seconds:6.1f}s {'xla ' if xla else '    '}{case.name}: "
              f"{bad or 'all exact'}", file=sys.stderr, flush=True)
    return rows


def _child(indices, xla, out, refs_only=False):
    """This script in a new process, on the cases at ``indices``; its return code."""
    command = [sys.executable, os.path.abspath(__file__), "--child",
               ",".join(map(str, indices)), "--xla", "on" if xla else "off", "--out", out]
    return subprocess.run(command + (["--refs-only"] if refs_only else [])).returncode


def run_isolated(cases, xla):
    """Runs ``cases`` in child processes: XLA aborts the whole process on some graphs
    (a failed CHECK inside its compiler), which no Python code can catch. A case whose
    process dies is run again with TensorFlow's references alone: if they abort too, the
    case is `unsupported` (TensorFlow's own); if not, each entry is a `crash`."""
    remaining = [port.CASES.index(c) for c in cases]
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "rows.jsonl")
        while remaining:
            open(out, "w").close()
            code = _child(remaining, xla, out)
            with open(out) as f:
                done = [json.loads(line) for line in f if line.strip()]
            for case_rows in done:
                rows.extend(case_rows)
            finished = {case_rows[0]["case"] for case_rows in done}
            remaining = [i for i in remaining if port.CASES[i].name not in finished]
            if code == 0 or not remaining:
                break
            culprit, remaining = remaining[0], remaining[1:]
            case = port.CASES[culprit]
            open(out, "w").close()
            alone = _child([culprit], xla, out, refs_only=True)
            if alone != 0:
                status, detail = "unsupported", ("TensorFlow's own XLA compilation of the "
                                                 "references aborts the process")
            else:
                status, detail = "crash", "the process aborted; the references alone do not"
            outcomes = {e: port.Outcome(status, detail) for e in port.ENTRIES}
            rows.extend(_rows(case, xla, outcomes))
            print(f"  (aborted) {'xla ' if xla else '    '}{case.name}: {status}",
                  file=sys.stderr, flush=True)
    return rows


def table(rows):
    """Markdown: per test file and XLA setting, how many (case, entry) pairs end how."""
    counts = collections.OrderedDict()
    for row in rows:
        key = (row["origin"], row["xla"])
        counts.setdefault(key, collections.Counter())[row["status"]] += 1
    cases = collections.Counter((r["origin"], r["xla"]) for r in rows if r["entry"] == "memory")
    lines = ["| re-expressed from | XLA | cases | " + " | ".join(STATUSES) + " |",
             "| --- | --- | ---: | " + " | ".join("---:" for _ in STATUSES) + " |"]
    total = collections.Counter()
    for (origin, xla), counter in counts.items():
        total.update(counter)
        lines.append(f"| {origin} | {'on' if xla else 'off'} | {cases[(origin, xla)]} | "
                     + " | ".join(str(counter[s]) for s in STATUSES) + " |")
    lines.append(f"| all | | {sum(cases.values())} | "
                 + " | ".join(f"**{total[s]}**" for s in STATUSES) + " |")
    reasons = collections.Counter(
        (r["entry"], r["detail"]) for r in rows if r["status"] in ("fallback", "unsupported"))
    lines.append("")
    for (entry, detail), n in reasons.most_common():
        lines.append(f"- {n} x {entry}: {detail}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--xla", choices=("both", "off", "on"), default="both")
    parser.add_argument("--match", default="", help="only the cases whose name matches")
    parser.add_argument("--json", default="controlflow_port.json", help="where to write rows")
    parser.add_argument("--merge", nargs="+", metavar="JSON",
                        help="run nothing: merge these files' rows into --json, print the table")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # case indices, for run_isolated
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--refs-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        cases = [port.CASES[int(i)] for i in args.child.split(",")]
        xla = args.xla == "on"
        if args.refs_only:
            port._run(cases[0], (), xla)
            return 0
        run(cases, xla, args.out)
        return 0
    if args.merge:
        parts = [json.load(open(path)) for path in args.merge]
        rows = [row for part in parts for row in part["rows"]]
        with open(args.json, "w") as f:
            json.dump({"cases": max(p["cases"] for p in parts),
                       "seconds": sum(p["seconds"] for p in parts), "rows": rows}, f, indent=1)
        print(table(rows))
        return 0
    modes = {"both": (False, True), "off": (False,), "on": (True,)}[args.xla]
    cases = [c for c in port.CASES if re.search(args.match, c.name)]
    start = time.perf_counter()
    rows = []
    for xla in modes:  # XLA in child processes (see run_isolated)
        rows.extend(run_isolated(cases, xla) if xla else run(cases, xla))
    with open(args.json, "w") as f:
        json.dump({"cases": len(cases), "seconds": round(time.perf_counter() - start),
                   "rows": rows}, f, indent=1)
    print(table(rows))
    bad = [r for r in rows if r["status"] in ("wrong", "none", "crash")]
    for r in bad:
        print(f"FAILED: {r['case']} / {r['entry']} / xla={r['xla']}: {r['status']} "
              f"{r['detail']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
