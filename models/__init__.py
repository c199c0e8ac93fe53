"""memgrad's Keras model zoo, built on memgrad's memory-saving layers.

The repository keeps it in ``models/``; it installs and imports as ``memgrad_zoo`` (a top-level
``models`` would collide with user folders and a PyPI package of that name). It needs the
``zoo`` extra: ``pip install 'memgrad[zoo]'``.

- `memgrad_zoo.revnet.revnet`: RevNet (Gomez et al. 2017), the paper's CIFAR configurations, each
  stage's units in one constant-memory `memgrad.layers.ReversibleSequence`.
- `memgrad_zoo.resnet.resnet`: the pre-activation ResNets RevNet is compared against.
- `memgrad_zoo.densenet.densenet_bc`: DenseNet-BC whose concat -> BN -> ReLU -> 1x1 conv bottleneck
  is recomputed in the backward pass (Pleiss et al. 2017); ``efficient=False`` for the plain one.
- `memgrad_zoo.glow.Glow`: multi-scale Glow (Kingma & Dhariwal 2018) whose levels train with
  constant activation memory (Li & Grathwohl 2019).
- `memgrad_zoo.data`: scikit-learn's bundled digits, and a loader for a local CIFAR-10 copy.
- `memgrad_zoo.train`: the trainers behind ``memgrad-zoo revnet|resnet|densenet|glow --help``
  (also ``python -m memgrad_zoo ...``).
"""
