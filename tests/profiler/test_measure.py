import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

import memgrad
from memgrad._src.profiler import format_bytes, parse_bytes, resolve_device
from tests.profiler.measure_probe import ACTIVATION_BYTES, BATCH, KEPT, WIDTH

# Measured in a fresh process (tests/profiler/measure_probe.py): the allocator's history in a
# long process moves small peaks by a chunk.
FRESH_PROCESSES = {"keep chain": dict(target="tests.profiler.measure_probe:keep_chain_reports", timeout=300)}


@pytest.mark.memory
def test_peak_matches_analytic_bytes_of_kept_activations(fresh_results):
    report = fresh_results["keep chain"]["large"]
    expected = KEPT * ACTIVATION_BYTES
    assert report["peak_above_baseline_bytes"] == pytest.approx(expected, rel=0.10)
    assert report["baseline_bytes"] >= ACTIVATION_BYTES  # the input is live before the call
    assert report["peak_bytes"] == report["baseline_bytes"] + report["peak_above_baseline_bytes"]
    assert report["device"] == "CPU:0"
    assert report["wall_time_s"] > 0


@pytest.mark.memory
def test_peak_scales_with_what_the_call_keeps(fresh_results):
    large, small = fresh_results["keep chain"]["large"], fresh_results["keep chain"]["small"]
    ratio = large["peak_above_baseline_bytes"] / small["peak_above_baseline_bytes"]
    assert ratio == pytest.approx(KEPT / 2, rel=0.10)


@pytest.mark.memory
def test_eager_call_and_kwargs_and_repeats():
    def eager(x, scale=1.0):
        return [tf.tanh(x) * scale for _ in range(4)]

    x = tf.random.normal([BATCH, WIDTH])
    report = memgrad.profiler.measure(eager, args=(x,), kwargs={"scale": 2.0}, repeats=3, warmup=0)
    assert report.peak_above_baseline_bytes >= 4 * ACTIVATION_BYTES
    assert report.as_dict()["peak_above_baseline_bytes"] == report.peak_above_baseline_bytes
    assert "MiB" in str(report)


def test_non_callable_is_rejected():
    with pytest.raises(TypeError, match="expected a callable.*Received: 42"):
        memgrad.profiler.measure(42)


@pytest.mark.parametrize("kind", ["tensor", "ndarray"])
def test_a_single_tensor_or_array_is_one_argument(kind):
    # Built here, not in parametrize: the scaling probe imports this module and must start
    # with an untouched allocator.
    single = tf.ones([4, 3]) if kind == "tensor" else tf.ones([4, 3]).numpy()
    shapes = []
    memgrad.profiler.measure(lambda x: shapes.append(tuple(x.shape)), args=single, warmup=0)
    assert shapes == [(4, 3)]


@pytest.mark.parametrize("junk", [5, None, "ab", {"x": 1}, {1, 2}])
def test_other_args_are_rejected_before_any_call(junk):
    calls = []
    with pytest.raises(TypeError, match=r"Expected args to be a tuple or list.*Received: "):
        memgrad.profiler.measure(lambda *a: calls.append(a), args=junk)
    assert calls == []


@pytest.mark.parametrize("device", ["TPU:0", "cpu", "CPU:x", 3, "/job:worker"])
def test_malformed_device_is_rejected(device):
    with pytest.raises(ValueError, match="Expected a device name such as 'CPU:0'"):
        memgrad.profiler.measure(lambda: None, device=device)


def test_absent_device_is_rejected():
    with pytest.raises(ValueError, match="does not exist on this machine"):
        resolve_device("CPU:7")
    if not tf.config.list_logical_devices("GPU"):
        with pytest.raises(ValueError, match="available GPU devices: none"):
            memgrad.profiler.measure(lambda: None, device="GPU:0")


def test_device_names_are_normalised():
    assert resolve_device("/device:CPU:0") == "CPU:0"
    assert resolve_device("cpu:0") == "CPU:0"
    expected_default = "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"
    assert resolve_device(None) == expected_default


@pytest.mark.parametrize("bad", [{"warmup": -1}, {"repeats": 0}, {"repeats": 1.5}])
def test_bad_counts_are_rejected(bad):
    with pytest.raises(ValueError, match="Received"):
        memgrad.profiler.measure(lambda: None, **bad)


def _run_without_bfc(script, **extra_env):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPU_ALLOCATOR_USE_BFC"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=os.pathsep.join(sys.path), **extra_env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env,
                          capture_output=True, text=True, timeout=300, check=True)


@pytest.mark.memory
def test_default_cpu_allocator_measures_large_tensors_and_warns():
    # When TensorFlow started before memgrad could ask for the BFC allocator, oneDNN's allocator
    # still measures 1 MiB activations. TensorFlow turns oneDNN on by default only on CPUs with
    # AVX-512, so it is forced here. (Without oneDNN, measure raises instead:
    # tests/profiler/test_categories.py.)
    completed = _run_without_bfc(
        """
        import tensorflow as tf
        tf.ones([1]).numpy()  # TensorFlow starts its devices and chooses its CPU allocator here
        import memgrad
        f = tf.function(lambda x: [x * float(i) for i in range(1, 17)])
        r = memgrad.profiler.measure(f, args=(tf.ones([256, 1024]),))
        print("RATIO", r.peak_above_baseline_bytes / (16 * 2**20))
        """,
        TF_ENABLE_ONEDNN_OPTS="1",
    )
    ratio = float(completed.stdout.split("RATIO")[1])
    assert ratio == pytest.approx(1.0, rel=0.10)
    assert "TF_CPU_ALLOCATOR_USE_BFC=true" in completed.stderr  # the coarse-statistics warning


@pytest.mark.parametrize(
    "text, expected",
    [("512MB", 512 * 10**6), ("512MiB", 512 * 2**20), ("1.5GiB", 3 * 2**29), ("64m", 64 * 2**20),
     ("4096", 4096), (4096, 4096), ("2 KB", 2000), ("0", 0)],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "MB", "12 parsecs", "-5MB", -1, None, True, "1e3"])
def test_parse_bytes_rejects_malformed_sizes(text):
    with pytest.raises(ValueError, match="Received"):
        parse_bytes(text)


@pytest.mark.parametrize("size", [float("nan"), float("inf"), float("-inf"), "nan", "inf", "9" * 400 + "TB"],
                         ids=["nan", "inf", "-inf", "'nan'", "'inf'", "400 digits TB"])
def test_parse_bytes_rejects_non_finite_sizes(size):
    with pytest.raises(ValueError, match=r"Expected a (finite, non-negative )?byte size.*Received: "):
        parse_bytes(size)


def test_parse_bytes_keeps_large_ints_exact():
    assert parse_bytes(2**63 + 1) == 2**63 + 1
    assert parse_bytes(10**400) == 10**400


def test_format_bytes():
    assert format_bytes(3 * 2**20) == "3.00 MiB"
    assert format_bytes(512) == "512 B"
    assert format_bytes(2**31) == "2.00 GiB"


def test_memory_window_reads_what_a_block_held_and_its_peak():
    x = tf.ones([512, 256])  # 512 KiB
    with memgrad.profiler.memory_window("CPU:0") as window:
        kept = tf.tanh(x) + 1.0  # held after the block
        temporary = tf.concat([x, x], axis=0) * 2.0  # 1 MiB, freed in the block
        del temporary
    assert window.device == "CPU:0"
    assert window.held_bytes >= 512 * 256 * 4
    assert window.peak_above_baseline_bytes >= window.held_bytes + 2 * 512 * 256 * 4
    assert window.peak_bytes == window.baseline_bytes + window.peak_above_baseline_bytes
    del kept


def test_memory_window_rejects_a_bad_device():
    with pytest.raises(ValueError, match="Expected a device name"):
        memgrad.profiler.memory_window("TPU:7")


def test_only_the_allocator_module_reads_the_allocators_statistics():
    """One way to measure: memgrad, its scripts and tests read TensorFlow's allocator
    statistics only through memgrad._src.allocator (MemoryWindow, measure_runs)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    allowed = {os.path.join("memgrad", "_src", "allocator.py"), os.path.join("tests", "profiler", "test_measure.py")}
    found = []
    for folder in ("memgrad", "scripts", "tests", "models"):
        for directory, _, files in os.walk(os.path.join(root, folder)):
            for name in files:
                path = os.path.join(directory, name)
                relative = os.path.relpath(path, root)
                if not name.endswith(".py") or relative in allowed:
                    continue
                text = open(path, encoding="utf-8").read()
                found += [relative for call in ("reset_memory_stats(", "get_memory_info(") if call in text]
    assert found == []


@pytest.mark.memory
def test_measure_runs_over_fresh_processes_reports_their_spread():
    batch, depth, width = 256, 4, 512
    spread = memgrad.profiler.measure_runs("memgrad.profiler.workloads:mlp_step", device="CPU:0",
                                           kwargs={"batch_size": batch, "depth": depth, "width": width},
                                           processes=3, repeats=2, env={"TF_NUM_INTEROP_THREADS": "1"})
    assert isinstance(spread, memgrad.profiler.RunSpread)
    assert [len(runs) for runs in spread.processes] == [2, 2, 2]
    # The step keeps each layer's tanh output for backprop: at least depth activations.
    assert spread.min_bytes >= depth * batch * width * 4
    assert spread.min_bytes <= spread.median_bytes <= spread.max_bytes
    assert len(spread.process_peaks) == 3
    assert spread.relative_spread == pytest.approx((spread.max_bytes - spread.min_bytes) / spread.median_bytes)
    assert spread.as_dict()["median_bytes"] == spread.median_bytes
    assert "3 processes" in str(spread)


@pytest.mark.parametrize("bad, message", [
    (dict(args=(1,)), r"pass its own arguments as kwargs\. Received: args=\(1,\)"),
    (dict(processes=0), r"processes must be a positive integer\. Received: processes=0"),
    (dict(processes=True), r"processes must be a positive integer\. Received: processes=True"),
])
def test_bad_fresh_process_arguments_are_rejected_before_any_process(bad, message):
    options = dict(processes=2)
    options.update(bad)
    with pytest.raises(ValueError, match=message):
        memgrad.profiler.measure_runs("memgrad.profiler.workloads:mlp_step", **options)


def test_env_without_processes_is_rejected():
    with pytest.raises(ValueError, match=r"env applies only to fresh processes.*Received: env="):
        memgrad.profiler.measure_runs(tf.function(lambda: tf.ones([2])), env={"TF_NUM_INTEROP_THREADS": "1"})


def test_a_builder_that_returns_no_call_is_named():
    from memgrad._src.profiler.fresh import FreshProcessError

    with pytest.raises(FreshProcessError, match=r"memgrad.profiler.workloads:mlp_batch must return the call"):
        memgrad.profiler.measure_runs("memgrad.profiler.workloads:mlp_batch", kwargs={"batch_size": 2, "width": 2},
                                      processes=1)
