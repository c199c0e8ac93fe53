"""Fresh processes, cold and warm (forked from an interpreter that has imported TensorFlow):
the same environment, path, allocator and errors; one warm interpreter per set of variables
read at TensorFlow's import."""

import os
import time

import pytest

from memgrad._src.profiler import warm
from memgrad._src.profiler.fresh import FreshProcessError, FreshProcessPool, run_in_fresh_process

_DESCRIBE = "tests.profiler.fresh_targets:describe"
_PATH = "tests.profiler.fresh_targets:path"
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_variables_read_at_tensorflows_import_key_the_warm_interpreter():
    base = {"HOME": "/root", "TF_ENABLE_ONEDNN_OPTS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    key = warm._import_time_key(base)
    # Read later (devices, allocator, thread pools) or set per child: one interpreter serves all.
    for name in ("TF_CPU_ALLOCATOR_USE_BFC", "TF_CPU_BFC_MEM_LIMIT_IN_MB", "TF_NUM_INTEROP_THREADS",
                 "PYTHONPATH", "PYTEST_CURRENT_TEST", "HOME"):
        assert warm._import_time_key({**base, name: "other"}) == key, name
    # Read at the import: another interpreter.
    for name in ("TF_ENABLE_ONEDNN_OPTS", "TF_CPP_MIN_LOG_LEVEL", "XLA_FLAGS", "CUDA_VISIBLE_DEVICES",
                 "KERAS_BACKEND", "PYTHONHASHSEED", "OMP_NUM_THREADS"):
        assert warm._import_time_key({**base, name: "other"}) != key, name


@pytest.mark.slow
def test_a_warm_process_sees_what_a_cold_one_sees(tmp_path):
    env = {"MEMGRAD_TEST_PROBE": "yes", "TF_CPU_BFC_MEM_LIMIT_IN_MB": "300", "TF_NUM_INTEROP_THREADS": "1",
           "MEMGRAD_TEST_ROOT": _ROOT}
    cold = run_in_fresh_process(_DESCRIBE, [512], env=env, cwd=str(tmp_path), warm=False)
    warms = [run_in_fresh_process(_DESCRIBE, [512], env=env, cwd=str(tmp_path), warm=True) for _ in range(2)]
    for found in warms:
        assert found["tensorflow_before"] and not cold["tensorflow_before"]  # the one difference
        for key in ("cwd", "probe", "limit", "tests_first", "memgrad_before", "onednn", "inter_op",
                    "peak_above_baseline_bytes"):
            assert found[key] == cold[key], (key, found, cold)
    assert cold["probe"] == "yes" and cold["limit"] == "300" and cold["tests_first"]
    assert 2**20 <= cold["peak_above_baseline_bytes"] <= 2 * 2**20 + 2**16, cold
    assert len({cold["pid"], *(found["pid"] for found in warms)}) == 3  # each call its own process


@pytest.mark.slow
def test_a_warm_process_has_a_cold_ones_path_whatever_pythonpath_started_its_interpreter(tmp_path):
    """The first call starts the warm interpreter with the caller's whole path as PYTHONPATH;
    a later call that names only this checkout must still find site-packages (networkx)."""
    whole = {"MEMGRAD_TEST_ROOT": _ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"}  # a warm interpreter of its own
    narrow = {**whole, "PYTHONPATH": _ROOT}
    for env in (whole, narrow):
        cold = run_in_fresh_process(_PATH, env=env, cwd=str(tmp_path), warm=False)
        found = run_in_fresh_process(_PATH, env=env, cwd=str(tmp_path), warm=True)
        assert found["path"] == cold["path"], (env, found["path"], cold["path"])
        assert found["networkx"] and cold["networkx"]


@pytest.mark.slow
def test_oneDNN_switch_read_at_import_is_honoured_warm():
    found = {value: run_in_fresh_process(_DESCRIBE, [64], env={"TF_ENABLE_ONEDNN_OPTS": value,
                                                               "MEMGRAD_TEST_ROOT": _ROOT}, warm=True)
             for value in ("0", "1")}
    assert found["0"]["onednn"] is False and found["1"]["onednn"] is True, found


@pytest.mark.slow
def test_warm_errors_and_timeouts_are_reported_as_cold_ones():
    for is_warm in (False, True):
        with pytest.raises(FreshProcessError, match="ValueError: as asked"):
            run_in_fresh_process("tests.profiler.fresh_targets:fail", warm=is_warm)
        with pytest.raises(FreshProcessError, match="cannot import tests.profiler.fresh_targets:absent"):
            run_in_fresh_process("tests.profiler.fresh_targets:absent", warm=is_warm)
    start = time.perf_counter()
    with pytest.raises(FreshProcessError, match="did not finish within 2 s"):
        run_in_fresh_process("tests.profiler.fresh_targets:sleep", [60], timeout=2, warm=True)
    assert time.perf_counter() - start < 30
    with FreshProcessPool(max_workers=2) as pool:
        futures = [pool.submit("tests.profiler.fresh_targets:sleep", [seconds], warm=True) for seconds in (0, 1)]
        assert [future.result() for future in futures] == [0, 1]
