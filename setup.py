"""What installs, and from where: memgrad's packages, the zoo and the command's launcher.

Everything else (name, version, dependencies, extras, commands) is in pyproject.toml. This
file remains because the zoo in ``models/`` installs under another name, ``memgrad_zoo`` (a
top-level ``models`` would collide with user folders and with a PyPI package of that name),
next to the discovered ``memgrad`` packages: pyproject.toml's keys take either discovery or a
fixed list, not both.
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["memgrad", "memgrad.*"]) + ["memgrad_zoo"],
    package_dir={"memgrad_zoo": "models"},
    # The command's launcher: sets TensorFlow's environment before memgrad imports TensorFlow.
    py_modules=["memgrad_profile"],
)
