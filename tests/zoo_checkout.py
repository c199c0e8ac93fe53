"""Imports this checkout's ``models/`` as ``memgrad_zoo`` (no TensorFlow import here).

The zoo installs as ``memgrad_zoo``; an editable install may point at another checkout. The
tests and their fresh-process probes test this one, as tests/conftest.py does for memgrad.
"""

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def import_zoo_from_this_checkout():
    init = os.path.join(ROOT, "models", "__init__.py")
    if "memgrad_zoo" in sys.modules or not os.path.exists(init):
        return
    spec = importlib.util.spec_from_file_location("memgrad_zoo", init,
                                                  submodule_search_locations=[os.path.dirname(init)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["memgrad_zoo"] = module
    spec.loader.exec_module(module)
