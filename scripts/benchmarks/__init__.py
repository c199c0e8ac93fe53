"""The benchmark suites of `scripts/benchmark.py`, one module each.

Importing the package sets TensorFlow's environment first: quiet start-up logs, and the BFC
allocator on CPU, so the memory figures are exact.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")  # exact CPU memory figures
