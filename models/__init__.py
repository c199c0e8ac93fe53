"""memgrad's Keras model zoo, built on memgrad's memory-saving layers.

- `models.revnet.revnet`: RevNet (Gomez et al. 2017), the paper's CIFAR configurations, each
  stage's units in one constant-memory `memgrad.layers.ReversibleSequence`.
- `models.resnet.resnet`: the pre-activation ResNets RevNet is compared against.
- `models.densenet.densenet_bc`: DenseNet-BC whose concat -> BN -> ReLU -> 1x1 conv bottleneck
  is recomputed in the backward pass (Pleiss et al. 2017); ``efficient=False`` for the plain one.
- `models.glow.Glow`: multi-scale Glow (Kingma & Dhariwal 2018) whose levels train with
  constant activation memory (Li & Grathwohl 2019).
- `models.data`: scikit-learn's bundled digits, and a loader for a local CIFAR-10 copy.
- `models.train`: the entry points, ``python -m models.revnet|resnet|densenet|glow --help``.
"""
