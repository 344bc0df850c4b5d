"""The wheel's contents, beside pyproject.toml's metadata: the `workbench` package, its shipped data
files, and the course's notebooks (notebooks/ in this repository) as the package `workbench.notebooks`,
so an installed wheel can copy them out (`workbench-notebooks DEST`: workbench/base/course_files.py).
pyproject.toml's [tool.setuptools] cannot map a folder outside the package into it; this can."""

from setuptools import find_packages, setup

setup(
    # Folders of data files are listed as packages too (setuptools warns about any it finds unlisted).
    packages=[*find_packages(include=["workbench*"]), "workbench.core.data.shipped", "workbench.notebooks",
              "workbench.notebooks.teacher"],
    package_dir={"workbench.notebooks": "notebooks", "workbench.notebooks.teacher": "notebooks/teacher"},
    package_data={"workbench.notebooks": ["*.ipynb"], "workbench.notebooks.teacher": ["*.ipynb"],
                  "workbench.core.data.shipped": ["*"]},
)
