"""Packaging beyond pyproject.toml: the Hydra configs live in the top-level conf/ (the one copy
in git) and ship inside the package as slime_hydra/conf, so that a wheel install composes them as
a checkout does (slime_hydra/__main__.py looks there first, then in the checkout's conf/)."""

from setuptools import find_namespace_packages, find_packages, setup

CONF = ["slime_hydra.conf", *(f"slime_hydra.conf.{p}" for p in find_namespace_packages("conf"))]
"""conf/ and each of its group dirs, as the packages slime_hydra.conf.* of the wheel."""

setup(
    packages=[*find_packages(include=["slime_hydra*"]), *CONF],
    package_dir={"slime_hydra.conf": "conf"},
    package_data={package: ["*.yaml"] for package in CONF},
)
