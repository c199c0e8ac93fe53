"""TensorFlow's own control-flow gradient tests, re-expressed (controlflow_port.py), in CI.

The whole matrix (every case through every entry point, without and with XLA) takes about
20 minutes on 2 cores: `scripts/controlflow_port.py` runs it and writes
docs/controlflow_port.json, from which docs/loops.md's table comes. Here each case runs
through one entry point, rotating through them in the order of the cases, every other
round of entries compiled with XLA, so every entry point meets loops, conds, lists and
second derivatives with and without XLA in each run (third and fourth derivatives, 13
cases at 2-20 s each, only in the matrix). A case must end as the committed matrix says it
ends; nothing may be wrong, None or crash (but the crashes the matrix records and
KNOWN_CRASHES pins, each a known bug).
"""

import json
import os

import pytest

from tests.checkpointing import controlflow_port as port

MATRIX = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "controlflow_port.json")
ACCEPTABLE = ("exact", "fallback", "unmarked", "unsupported")


def _committed():
    with open(MATRIX) as f:
        rows = json.load(f)["rows"]
    return {(r["case"], r["entry"], r["xla"]): r for r in rows}


COMMITTED = _committed()


# Crashes the matrix records, each a known memgrad bug (see docs/loops.md): pinned, so a
# fix shows up here (and the matrix must be run again) and no new one passes unnoticed.
KNOWN_CRASHES = {}  # (case, entry, xla): why


def _slice(index):
    """The entry point (rotating) and XLA setting (every other round) of case ``index``;
    a case whose XLA compilation aborts TensorFlow's process runs without XLA here."""
    entry = port.ENTRIES[index % len(port.ENTRIES)]
    xla = bool((index // len(port.ENTRIES)) % 2)
    if xla and "aborts the process" in COMMITTED[(port.CASES[index].name, entry, True)][
            "detail"]:
        xla = False
    return entry, xla


def test_the_port_holds_at_least_100_cases_and_the_matrix_covers_them():
    assert len(port.CASES) >= 100
    assert len({c.name for c in port.CASES}) == len(port.CASES), "two cases share a name"
    for case in port.CASES:
        for entry in port.ENTRIES:
            for xla in (False, True):
                assert (case.name, entry, xla) in COMMITTED, (case.name, entry, xla)
    bad = [r for key, r in COMMITTED.items()
           if r["status"] not in ACCEPTABLE and key not in KNOWN_CRASHES]
    assert not bad, bad
    for key in KNOWN_CRASHES:
        assert COMMITTED[key]["status"] == "crash", (key, COMMITTED[key])


# Third and fourth derivatives take 2-20 s a case: the matrix runs them, CI does not.
IN_CI = [i for i, case in enumerate(port.CASES) if case.order <= 2]


# The XLA-compiled half (the path GPU users get by default) takes 1-8 s a case, the rest
# under a second: it runs in CI's slow lane, out of the fast inner loop.
@pytest.mark.parametrize("index", [pytest.param(i, marks=pytest.mark.slow) if _slice(i)[1] else i
                                   for i in IN_CI],
                         ids=[f"{i}-{_slice(i)[0]}{'-xla' if _slice(i)[1] else ''}"
                              for i in IN_CI])
def test_a_case_through_its_entry_point_ends_as_committed(index):
    case = port.CASES[index]
    entry, xla = _slice(index)
    outcome = port.run_case(case, jit_compile=xla, entries=(entry,))[entry]
    if (case.name, entry, xla) not in KNOWN_CRASHES:
        assert outcome.status in ACCEPTABLE, (case.name, entry, xla, outcome)
    expected = COMMITTED[(case.name, entry, xla)]
    assert outcome.status == expected["status"], (case.name, entry, xla, outcome, expected)
