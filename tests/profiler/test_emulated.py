import signal
from concurrent.futures import ThreadPoolExecutor

import pytest

import memgrad
from memgrad._src.profiler import emulated

HOLD = "tests.profiler.capped_targets:hold"


# Each capped run is a fresh TensorFlow process, and one that runs out of memory idles about
# 10 s in TensorFlow's allocator (it waits for memory to be freed before it gives up). So the
# runs of one marker start together, at its first test, and each test reads its own: the
# module's memory tests took 86 s one after another. What a run reports (fits, its peak, the
# out-of-memory message) is its own process's, whatever else runs beside it.
_COUPLING = "tests.profiler.capped_targets:profiled_coupling_step"
_CAPPED = {
    "memory": {
        "fits": lambda: memgrad.profiler.run_capped(HOLD, "64MiB", {"batch_size": 8}),  # 32 MiB held
        "oom": lambda: memgrad.profiler.run_capped(HOLD, "64MiB", {"batch_size": 20}),  # 80 MiB held
        **{f"workload {onednn}": (lambda onednn=onednn: memgrad.profiler.run_capped(
            _COUPLING, "22MiB", {"batch_size": 3000}, env={"TF_ENABLE_ONEDNN_OPTS": onednn}))
           for onednn in ("0", "1")},
        "search": lambda: memgrad.profiler.max_batch_size(HOLD, "64MiB", low=14, high=16),
    },
    "slow": {
        "fail": lambda: memgrad.profiler.run_capped("tests.profiler.capped_targets:fail", "64MiB"),
        "no module": lambda: memgrad.profiler.run_capped("no_such_module_anywhere:fn", "64MiB"),
        **{f"crash {logged}": (lambda logged=logged: memgrad.profiler.run_capped(
            "tests.profiler.capped_targets:crash", "64MiB", {"after_logging_an_oom": logged}))
           for logged in (True, False)},
    },
}


def _started(group):
    pool = ThreadPoolExecutor(max_workers=len(_CAPPED[group]))
    futures = {key: pool.submit(call) for key, call in _CAPPED[group].items()}
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def memory_runs():
    yield from _started("memory")


@pytest.fixture(scope="module")
def slow_runs():
    yield from _started("slow")


@pytest.mark.memory
def test_capped_run_fits_below_its_cap_and_reports_the_peak(memory_runs):
    run = memory_runs["fits"].result()
    assert run.fits
    assert run.limit_bytes == 64 * 2**20
    assert 32 * 2**20 <= run.peak_bytes <= 40 * 2**20


@pytest.mark.memory
def test_capped_run_reports_out_of_memory_above_its_cap(memory_runs):
    run = memory_runs["oom"].result()
    assert not run.fits
    assert run.peak_bytes is None
    assert "out of memory" in str(run)


@pytest.mark.slow  # two fresh processes
def test_failures_other_than_memory_raise(slow_runs):
    with pytest.raises(memgrad.profiler.CappedRunError, match="not a memory problem"):
        slow_runs["fail"].result()
    with pytest.raises(memgrad.profiler.CappedRunError, match="cannot import"):
        slow_runs["no module"].result()


@pytest.mark.slow  # two fresh processes
def test_a_crash_right_after_an_oom_is_an_oom_and_any_other_crash_raises(slow_runs):
    run = slow_runs["crash True"].result()
    assert not run.fits and run.peak_bytes is None and run.oom_report is None
    assert run.message.startswith("OOM when allocating tensor with shape[3000,32] and type float on CPU:0 ")
    assert f"crashed with signal {int(signal.SIGSEGV)}" in run.message and "oneDNN" in run.message
    with pytest.raises(memgrad.profiler.CappedRunError, match=rf"crashed \(signal {int(signal.SIGSEGV)}\) in its capped"):
        slow_runs["crash False"].result()


@pytest.mark.memory
@pytest.mark.parametrize("onednn", ["0", "1"])
def test_the_commands_workload_runs_out_of_memory_with_and_without_onednn(memory_runs, onednn):
    # With oneDNN on, this workload's failed allocation crashes the capped process (measured,
    # TensorFlow 2.21); without it, the step raises ResourceExhaustedError. Both are an OOM.
    run = memory_runs[f"workload {onednn}"].result()
    assert not run.fits and run.message.startswith("OOM when allocating tensor with shape["), run


def test_run_capped_passes_env_but_not_over_the_cap():
    with pytest.raises(ValueError, match="TF_CPU_BFC_MEM_LIMIT_IN_MB"):
        memgrad.profiler.run_capped(HOLD, "64MiB", env={"TF_CPU_BFC_MEM_LIMIT_IN_MB": "4096"})
    with pytest.raises(TypeError, match="dict of str to str"):
        memgrad.profiler.run_capped(HOLD, "64MiB", env={"TF_ENABLE_ONEDNN_OPTS": 0})


@pytest.mark.parametrize("target", ["no_colon", "a:b:c", ":fn", 17])
def test_malformed_target_is_rejected(target):
    with pytest.raises(ValueError, match="module:function"):
        memgrad.profiler.run_capped(target, "64MiB")


@pytest.mark.parametrize("limit", ["100KB", "lots", -3])
def test_malformed_limit_is_rejected(limit):
    with pytest.raises(ValueError, match="Received"):
        memgrad.profiler.run_capped(HOLD, limit)


def test_max_batch_size_finds_the_largest_fitting_batch(monkeypatch):
    """The search logic, with a fake device on which batches up to 37 fit."""
    calls = []

    def fake_run(target, limit, kwargs, timeout, env=None):
        calls.append(kwargs["batch_size"])
        fits = kwargs["batch_size"] <= 37
        return emulated.CappedRun(target, kwargs, 2**20, fits, 1 if fits else None, "", 0.0)

    monkeypatch.setattr(emulated, "run_capped", fake_run)
    search = memgrad.profiler.max_batch_size(HOLD, "1MiB", {"mib_per_item": 4})
    assert search.batch_size == 37
    assert len(calls) == len(set(calls)) <= 12  # doubling then bisection, no repeats
    assert memgrad.profiler.max_batch_size(HOLD, "1MiB", high=20).batch_size == 20
    monkeypatch.setattr(emulated, "run_capped",
                        lambda t, l, kwargs, timeout, env=None: fake_run(t, l, {"batch_size": 99}, timeout))
    assert memgrad.profiler.max_batch_size(HOLD, "1MiB").batch_size == 0


@pytest.mark.memory
def test_max_batch_size_on_the_emulated_device(memory_runs):
    # 4 MiB per item and ~2 MiB of runtime buffers under a 64 MiB cap: 15 items fit, 16 do not.
    search = memory_runs["search"].result()
    assert search.batch_size == 15
    outcomes = {run.kwargs["batch_size"]: run.fits for run in search.probes}
    assert outcomes[15] and not outcomes[16]


@pytest.mark.parametrize("bounds", [{"low": 0}, {"low": 8, "high": 4}])
def test_max_batch_size_rejects_bad_bounds(bounds):
    with pytest.raises(ValueError, match="low <= high"):
        memgrad.profiler.max_batch_size(HOLD, "64MiB", **bounds)


def _linear_device(calls, fixed_mib=3.0, mib_per_item=0.1, cap_mib=64):
    """A fake emulated device whose peak is fixed_mib + batch * mib_per_item (fits 610 items)."""

    def fake_run(target, limit, kwargs, timeout, env=None):
        batch = kwargs["batch_size"]
        calls.append(batch)
        peak = int((fixed_mib + batch * mib_per_item) * 2**20)
        fits = peak <= cap_mib * 2**20
        return emulated.CappedRun(target, kwargs, cap_mib * 2**20, fits, peak if fits else None, "", 0.0)

    return fake_run


@pytest.mark.parametrize("start", [100, 5000])
def test_max_batch_size_from_a_guess_extrapolates_the_fitting_peaks(monkeypatch, start):
    calls = []
    monkeypatch.setattr(emulated, "run_capped", _linear_device(calls))
    search = memgrad.profiler.max_batch_size(HOLD, "64MiB", start=start, high=10**5)
    assert search.batch_size == 610
    assert calls[0] == start and len(calls) == len(set(calls)) <= 9, calls
    # Without the guess, doubling and bisection take more probes for the same answer.
    plain_calls = []
    monkeypatch.setattr(emulated, "run_capped", _linear_device(plain_calls))
    assert memgrad.profiler.max_batch_size(HOLD, "64MiB", high=10**5).batch_size == 610
    assert len(plain_calls) > len(calls)


def test_max_batch_size_stops_within_the_tolerance(monkeypatch):
    calls = []
    monkeypatch.setattr(emulated, "run_capped", _linear_device(calls))
    search = memgrad.profiler.max_batch_size(HOLD, "64MiB", start=50, rtol=0.05, high=10**5)
    failing = min(run.kwargs["batch_size"] for run in search.probes if not run.fits)
    assert 0.95 * 610 <= search.batch_size <= 610 < failing <= search.batch_size * 1.05 + 1


def test_max_batch_size_takes_few_probes_when_the_extrapolation_is_too_cautious(monkeypatch):
    """Peaks that sit near the cap whatever the batch (an allocator that grows by whole
    regions) make every aim land just above the largest fit: the search must still take a
    logarithmic number of probes, not one per 5% of the way (it once took about 70)."""
    calls = []

    def fake_run(target, limit, kwargs, timeout, env=None):
        batch = kwargs["batch_size"]
        calls.append(batch)
        fits = batch <= 40000
        return emulated.CappedRun(target, kwargs, 2**30, fits, int(0.99 * 2**30) if fits else None, "", 0.0)

    monkeypatch.setattr(emulated, "run_capped", fake_run)
    search = memgrad.profiler.max_batch_size(HOLD, "1GiB", start=2000, rtol=0.05, high=1 << 16)
    failing = min(run.kwargs["batch_size"] for run in search.probes if not run.fits)
    assert 0.95 * 40000 <= search.batch_size <= 40000 < failing <= search.batch_size * 1.05 + 1
    assert len(calls) == len(set(calls)) <= 16, calls


@pytest.mark.parametrize("arguments, match", [({"start": 0}, "start"), ({"start": 10, "high": 5}, "start"),
                                              ({"rtol": 1.5}, "rtol")])
def test_max_batch_size_rejects_a_bad_guess_or_tolerance(arguments, match):
    with pytest.raises(ValueError, match=match):
        memgrad.profiler.max_batch_size(HOLD, "64MiB", **arguments)


def test_max_batch_size_rejects_an_on_probe_that_is_not_callable():
    with pytest.raises(TypeError, match="on_probe to be a callable"):
        memgrad.profiler.max_batch_size(HOLD, "64MiB", on_probe=3)
