#!/usr/bin/env bash
# Opt-in check of docs/HOSTED.md's first cell (Colab / Kaggle), as written, in a fresh virtualenv:
#
#   bash scripts/check_hosted_install.sh /tmp/hosted-venv 2.14.1
#
# 1. creates VENV if it is not there and installs torch==TORCH_VERSION first, as a hosted runtime
#    has it (never an unpinned torch: that would resolve a several-GB CUDA build);
# 2. runs the cell's code block exactly as docs/HOSTED.md has it, with WORKBENCH_SOURCE pointing at
#    this checkout (file://) and WORKBENCH_PRESET=cpu-quick (the cell keeps a preset that is set);
# 3. checks that torch's version is the one installed in 1, that `python -m workbench --help` runs,
#    and that a 3-step wb.run of the MLP trains.
# Not in CI (.ci/run): it takes minutes and a venv of 6.4 GB. Measured on the 2-core dev machine shared
# with other jobs (load average 6-8), torch 2.14.1 from the local wheel store: a fresh venv 10 min 21 s in
# all (the cell 3 min 51 s of it); torch alone, by hand, 3 min 11 s; with everything already there 4 min 45 s.
set -euo pipefail
venv="${1:?usage: check_hosted_install.sh VENV TORCH_VERSION, e.g. /tmp/hosted-venv 2.14.1}"
torch_version="${2:?usage: check_hosted_install.sh VENV TORCH_VERSION, e.g. /tmp/hosted-venv 2.14.1}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
py="$venv/bin/python"

[[ -x "$py" ]] || python3 -m venv "$venv"
"$py" -m pip install -q --disable-pip-version-check "torch==$torch_version"
before="$("$py" -c 'import torch; print(torch.__version__)')"

# The code block that follows the hosted-cell marker in docs/HOSTED.md, byte for byte.
cell="$(mktemp --suffix=.py)"
trap 'rm -f "$cell"' EXIT
awk '/<!-- hosted-cell/ {found=1; next} found && /^```python/ {inside=1; next} inside && /^```/ {exit} inside' \
  "$repo/docs/HOSTED.md" > "$cell"
[[ -s "$cell" ]] || { echo "docs/HOSTED.md: no python block after the hosted-cell marker"; exit 1; }

cd "$(mktemp -d)"   # not the checkout: `import workbench` must find the installed copy
time WORKBENCH_SOURCE="file://$repo" WORKBENCH_PRESET=cpu-quick "$py" "$cell"
after="$("$py" -c 'import torch; print(torch.__version__)')"
[[ "$before" == "$after" ]] || { echo "the cell changed torch: $before -> $after"; exit 1; }
"$py" -m workbench --help > /dev/null
WORKBENCH_PRESET=cpu-quick WORKBENCH_MAX_STEPS=3 "$py" - <<'PY'
import sys

import workbench as wb

assert wb.__file__.startswith(sys.prefix), f"workbench imported from {wb.__file__}, not this venv"
result = wb.run(wb.RunConfig(model="mlp"), name="hosted smoke")
assert result.status == "ok" and result.steps_done == 3, (result.status, result.steps_done)
print(f"3-step MLP run: loss {result.final_loss:.4f}, from {wb.__file__}")
PY
echo "hosted install OK: torch $after kept, workbench from $repo"
