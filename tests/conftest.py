"""Test-wide settings: quiet logs, exact CPU memory figures, two logical CPU devices."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Exact CPU memory statistics (the default allocator leaves small tensors out); must be
# set before TensorFlow is imported. test_measure checks the default allocator separately.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402  (after the environment above)

# Two logical CPUs so tf.distribute.MirroredStrategy can be tested on a CPU-only machine.
# This must happen before TensorFlow's runtime starts, hence here.
_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
)


import pytest  # noqa: E402


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


def pytest_collection_modifyitems(session, config, items):
    """Runs the modules that wait for memory probes last, so the probes overlap the rest."""
    from tests import probes

    owners = probes.owners()
    items.sort(key=lambda item: getattr(getattr(item, "module", None), "__name__", None) in owners)


def pytest_collection_finish(session):
    """Starts the selected modules' memory probes (tests/probes.py) while other tests run."""
    if session.config.option.collectonly:
        return
    from tests import probes

    modules = []
    for item in session.items:
        name = getattr(item.module, "__name__", None) if hasattr(item, "module") else None
        if name and name not in modules:
            modules.append(name)
    probes.start_for(modules)


def pytest_sessionfinish(session):
    from tests import probes

    probes.stop()
