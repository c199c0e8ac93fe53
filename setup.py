"""Installs memgrad: memory-saving training for TensorFlow 2."""

from setuptools import find_packages, setup

with open("README.md", encoding="utf-8") as readme:
    LONG_DESCRIPTION = readme.read()

setup(
    name="memgrad",
    version="0.1.0",
    description=(
        "Train deeper and wider TensorFlow 2 models in less memory: gradient "
        "checkpointing, reversible blocks, selective differentiation and a memory profiler."
    ),
    long_description=LONG_DESCRIPTION,
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.9",
    packages=find_packages(include=["memgrad", "memgrad.*", "models", "models.*"]),
    install_requires=[
        "tensorflow>=2.16",
        "keras>=3.0",
        "tensorflow-probability[tf]>=0.24",  # [tf] brings tf-keras, which tfp imports
        "networkx>=3.0",
        "toposort>=1.10",
        "numpy",
        "scikit-learn>=1.0",  # ships the 8x8 digits the model zoo trains on offline
        "matplotlib>=3.5",  # sample grids and plots
        "tqdm>=4.0",  # memgrad-profile's progress bar
    ],
    extras_require={
        "test": ["pytest>=7", "hypothesis>=6"],
    },
    entry_points={
        "console_scripts": ["memgrad-profile=memgrad.cli:main"],
    },
    classifiers=[
        "License :: OSI Approved :: Apache Software License",
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
