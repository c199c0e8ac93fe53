"""Test-wide settings: quiet TensorFlow logs, make the repository importable."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Exact CPU memory statistics (the default allocator leaves small tensors out); must be
# set before TensorFlow is imported. test_measure checks the default allocator separately.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
