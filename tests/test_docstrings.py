"""The ``>>>`` examples in memgrad's and the zoo's docstrings run, and show what they say.

One test per module with examples, run by `doctest` with ELLIPSIS and NORMALIZE_WHITESPACE in
the module's own namespace. The zoo is imported as ``memgrad_zoo`` (tests/conftest.py maps it
to this checkout's ``models/``). Modules whose examples train a model or start processes are
marked ``slow``.
"""

import doctest
import importlib
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = {"memgrad": "memgrad", "models": "memgrad_zoo"}  # folder -> import name
# Examples that fit models or run fresh processes (seconds to a minute each on 2 cores).
SLOW = {"memgrad._src.profiler.emulated", "memgrad_zoo.glow",
        "memgrad_zoo.train", "memgrad.cli.sweep", "memgrad_zoo.revnet", "memgrad_zoo.resnet",
        "memgrad_zoo.densenet"}


def _modules_with_examples():
    """Module names whose source holds a ``>>>`` line (found without importing them)."""
    names = []
    for folder, package in PACKAGES.items():
        for directory, _, files in os.walk(os.path.join(ROOT, folder)):
            for file in sorted(files):
                if not file.endswith(".py"):
                    continue
                path = os.path.join(directory, file)
                with open(path, encoding="utf-8") as handle:
                    if not any(line.lstrip().startswith(">>>") for line in handle):
                        continue
                parts = os.path.relpath(path, os.path.join(ROOT, folder))[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                names.append(".".join([package, *parts]))
    return sorted(names)


MODULES = _modules_with_examples()


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in MODULES])
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    tests = [t for t in doctest.DocTestFinder().find(module) if t.examples]
    assert tests, f"{name} has '>>>' lines but doctest finds no examples in its docstrings"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = []
    for test in tests:
        runner.run(test, out=report.append)
    failed, attempted = runner.summarize(verbose=False)
    assert failed == 0, f"{failed} of {attempted} examples failed in {name}:\n" + "".join(report)


def test_the_modules_with_examples_are_found():
    assert {"memgrad._src.units", "memgrad._src.reversible.coupling", "memgrad_zoo.layers"} <= set(MODULES)
