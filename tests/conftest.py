"""Test-wide settings: quiet logs, exact CPU memory figures, two logical CPU devices."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Exact CPU memory statistics (the default allocator leaves small tensors out); must be
# set before TensorFlow is imported. test_measure checks the default allocator separately.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
# Fresh processes (probes, capped runs, also those started by memgrad-profile and the docs'
# examples, which inherit this) fork from a warm interpreter that has imported TensorFlow:
# each cold start spends 5-8 CPU-seconds importing it, and a CI run starts about 120. A probe
# that must order its own imports, or must differ from another in Python's hash seed, says
# warm=False. MEMGRAD_FRESH_WARM=0 runs every one cold.
os.environ.setdefault("MEMGRAD_FRESH_WARM", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# The zoo of this checkout as memgrad_zoo, not whichever copy is installed.
from tests.zoo_checkout import import_zoo_from_this_checkout  # noqa: E402

import_zoo_from_this_checkout()

import tensorflow as tf  # noqa: E402  (after the environment above)

# Two logical CPUs so tf.distribute.MirroredStrategy can be tested on a CPU-only machine.
# This must happen before TensorFlow's runtime starts, hence here.
_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
)


import pytest  # noqa: E402


def pytest_configure(config):
    """The markers. Plain ``python -m pytest`` leaves out ``slow`` and ``memory`` tests (the
    ``addopts`` in pyproject.toml); ``-m "slow or memory"`` runs those, ``-m ""`` everything."""
    config.addinivalue_line(
        "markers", "memory: asserts measured memory (peaks, ratios, what fits under a cap); "
        "often in fresh processes, minutes on 2 cores")
    config.addinivalue_line("markers", "slow: takes more than a couple of seconds (training, "
                            "large graphs, fresh processes) without asserting measured memory")
    config.addinivalue_line("markers", "profiler: every test under tests/profiler (set by "
                            "conftest), so CI's second pass selects them and the memory tests in one run")
    config.addinivalue_line("markers", "fresh(*keys): the keys of its module's FRESH_PROCESSES the "
                            "test reads (only selected tests' probes start; without it, all of them)")
    config.addinivalue_line("markers", "own_kernels: every probe the test reads sets "
                            "TF_ENABLE_ONEDNN_OPTS itself (set by conftest), so CI's second pass, "
                            "which flips that choice, would only repeat it")
    config.addinivalue_line("markers", "numerics: compares numbers that depend on which kernels run "
                            "(half-precision products: oneDNN's differ from Eigen's by CPU), so CI's second "
                            "pass runs it with oneDNN flipped too")
    config.addinivalue_line("markers", "kernel_neutral: dense layers and loops of them (no "
                            "convolution, no kernel scratch), measured the same with oneDNN's kernels "
                            "and without (CONTRIBUTING.md has the figures); CI's second pass leaves it out")


def pytest_itemcollected(item):
    """Marks the profiler's tests `profiler`: what the allocator counts and what a prediction
    reads of the kernels' scratch depend on the kernel choice, so CI runs them in both passes."""
    if item.nodeid.startswith("tests/profiler/"):
        item.add_marker("profiler")
    keys = _fresh_keys(item)
    if keys and all("TF_ENABLE_ONEDNN_OPTS" in (_fresh_processes(item)[key].get("env") or {}) for key in keys):
        item.add_marker("own_kernels")


def pytest_runtest_setup(item):
    """Fails a `memory` test in a pytest-xdist worker: another worker's threads would move the
    peaks it asserts on."""
    if hasattr(item.config, "workerinput") and item.get_closest_marker("memory"):
        pytest.fail("marked `memory`: it measures peaks and runs in one process; run the memory "
                    "tests without -n", pytrace=False)


@pytest.fixture(scope="session")
def mirrored_strategy():
    """One MirroredStrategy over the two logical CPUs for the whole session.

    Each strategy numbers its collective operations from the same starting key, and the
    collective executor is per process: two strategies in one session would reuse keys and
    pair up unrelated all-reduces ("Shape mismatch in the collective instance").
    """
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:2]
    assert len(devices) == 2, "tests/conftest.py configures two logical CPUs"
    return tf.distribute.MirroredStrategy(devices)


# Fresh-process probes. A test module that measures memory in fresh processes declares them
# at module level:
#
#     FRESH_PROCESSES = {key: dict(target="module:function", args=[...], kwargs={...}, env={...},
#                                  timeout=seconds, warm=False, expected_s=seconds)}
#
# (the arguments of memgrad._src.profiler.fresh.run_in_fresh_process, and optionally the
# probe's rough wall time in CI), and its fixtures take `fresh_results`, {key: the target's
# return value}. The processes of every module with a selected test that takes that fixture
# start in the background when collection finishes, FRESH_PROCESS_JOBS at a time, the longest
# expected first (`expected_s`, default 0: then in collection order), and those modules run
# last: the probes take most of the suite's wall time, and other tests run meanwhile. Longest
# first keeps a long probe from starting last and running alone at the end of the pass (the
# memgrad-profile --budget probe once took the last 3 of 16 minutes by itself).
FRESH_PROCESS_JOBS = 2
_fresh_pool = None
_fresh_futures = {}  # module name -> {key: future}


def _fresh_processes(item):
    """The FRESH_PROCESSES of the item's module if the item waits for them, else None."""
    if "fresh_results" not in getattr(item, "fixturenames", ()):
        return None
    return getattr(getattr(item, "module", None), "FRESH_PROCESSES", None)


def _fresh_keys(item):
    """The keys of the module's FRESH_PROCESSES the item reads: its `fresh` marker's, else all
    (None if it reads none)."""
    spec = _fresh_processes(item)
    if spec is None:
        return None
    marker = item.get_closest_marker("fresh")
    if marker is None:
        return list(spec)
    unknown = [key for key in marker.args if key not in spec]
    if unknown or not marker.args:
        raise pytest.UsageError(f"{item.nodeid}: fresh() names {list(marker.args)}; "
                                f"its module's FRESH_PROCESSES has {list(spec)}")
    return list(marker.args)


def _start_fresh_processes(selected):
    """Submits the probes ``[(module, key), ...]`` not submitted yet, the longest expected
    first (a stable sort: otherwise in the order given)."""
    global _fresh_pool
    if _fresh_pool is None:
        from memgrad._src.profiler.fresh import FreshProcessPool

        _fresh_pool = FreshProcessPool(max_workers=FRESH_PROCESS_JOBS)
    pending = [(module, key) for module, key in dict.fromkeys(selected)
               if key not in _fresh_futures.get(module.__name__, {})]
    pending.sort(key=lambda pair: -pair[0].FRESH_PROCESSES[pair[1]].get("expected_s", 0))
    for module, key in pending:
        spec = {k: v for k, v in module.FRESH_PROCESSES[key].items() if k != "expected_s"}
        _fresh_futures.setdefault(module.__name__, {})[key] = _fresh_pool.submit(**spec)


def pytest_collection_modifyitems(session, config, items):
    """Runs the modules that wait for fresh-process probes last, so the probes overlap the rest."""
    items.sort(key=lambda item: _fresh_processes(item) is not None)


def pytest_collection_finish(session):
    """Starts the selected modules' fresh-process probes while other tests run. Not in a
    pytest-xdist worker: each collects every test but runs only those it is handed, so its
    module's fixture starts the probes it needs when the first of them runs."""
    if session.config.option.collectonly or hasattr(session.config, "workerinput"):
        return
    _start_fresh_processes([(item.module, key) for item in session.items
                            if _fresh_processes(item) is not None for key in _fresh_keys(item)])


@pytest.fixture(scope="module")
def fresh_results(request):
    """{key: result} of the module's FRESH_PROCESSES that its selected tests read (waits for
    them; starts them if needed)."""
    module = request.module
    if not _fresh_futures.get(module.__name__):
        _start_fresh_processes([(module, key) for key in module.FRESH_PROCESSES])
    return {key: future.result() for key, future in _fresh_futures[module.__name__].items()}


def pytest_sessionfinish(session):
    """Cancels the probes not started and kills the running ones."""
    if _fresh_pool is not None:
        _fresh_pool.shutdown(kill=True)
