"""memgrad's implementation. Nothing here is API: import from ``memgrad``, ``memgrad.layers``,
``memgrad.selective``, ``memgrad.strategies`` or ``memgrad.profiler`` instead.

Layers, bottom to top (tests/test_layering.py keeps imports pointing down):

- ``units``, ``tf_internals``: byte units; every private TensorFlow/Keras import.
- ``graph``: the read-only graph view, separators and the memory model.
- ``profiler``: the measuring instrument (imports no technique).
- ``recompute``, ``checkpointing``, ``reversible``, ``selective``: the techniques.
"""
