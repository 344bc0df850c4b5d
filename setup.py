"""The wheel's contents, beside pyproject.toml's metadata: the `workbench` package, its shipped data
files, and the course's notebooks (notebooks/ in this repository) as the package `workbench.notebooks`,
so an installed wheel can copy them out (`workbench-notebooks DEST`: workbench/core/course_files.py).
pyproject.toml's [tool.setuptools] cannot map a folder outside the package into it; this can."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["workbench*"]), "workbench.notebooks"],
    package_dir={"workbench.notebooks": "notebooks"},
    package_data={"workbench.notebooks": ["*.ipynb", "teacher/*.ipynb"],
                  "workbench.core.data": ["shipped/*"]},
)
