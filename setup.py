"""Installs memgrad: memory-saving training for TensorFlow 2.

The repository keeps the model zoo in ``models/``; it installs as the package ``memgrad_zoo``
(a top-level ``models`` would collide with user folders and with a PyPI package of that name).
"""

from setuptools import find_packages, setup

with open("README.md", encoding="utf-8") as readme:
    LONG_DESCRIPTION = readme.read()

TFP = "tensorflow-probability[tf]>=0.24"  # [tf] brings tf-keras (Keras 2), which tfp imports
EXTRAS = {
    # BijectorBlock wraps TFP bijectors; the zoo's Glow uses TFP distributions.
    "tfp": [TFP],
    # The model zoo: Glow (TFP), scikit-learn's bundled digits, sample grids.
    "zoo": [TFP, "scikit-learn>=1.0", "matplotlib>=3.5"],
    # memgrad-profile's plot and progress bar.
    "cli": ["matplotlib>=3.5", "tqdm>=4.0"],
}
EXTRAS["all"] = sorted({req for reqs in EXTRAS.values() for req in reqs})
# keras-hub: the fine-tuning tests build its BERT backbone (random init); memgrad never imports it.
EXTRAS["test"] = EXTRAS["all"] + ["pytest>=7", "hypothesis>=6", "keras-hub>=0.20"]

setup(
    name="memgrad",
    version="0.2.0",
    description=(
        "Train deeper and wider TensorFlow 2 models in less memory: gradient "
        "checkpointing, reversible blocks, selective differentiation and a memory profiler."
    ),
    long_description=LONG_DESCRIPTION,
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.9",  # TensorFlow 2.16 (the oldest supported) runs on 3.9
    packages=find_packages(include=["memgrad", "memgrad.*"]) + ["memgrad_zoo"],
    py_modules=["memgrad_profile"],  # the command's launcher (sets TensorFlow's environment first)
    package_dir={"memgrad_zoo": "models"},
    install_requires=[
        "tensorflow>=2.16",
        "keras>=3.0",
        "networkx>=3.0",
        "numpy",
    ],
    extras_require=EXTRAS,
    entry_points={
        "console_scripts": [
            "memgrad-profile=memgrad_profile:main",
            "memgrad-zoo=memgrad_zoo.__main__:main",
        ],
    },
    classifiers=[
        "License :: OSI Approved :: Apache Software License",
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
