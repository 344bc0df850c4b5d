#!/usr/bin/env bash
# The README's learner command, run as written: `make learn` must make the learner's copies
# (no `solution` cells, no outputs) in learners/ and start JupyterLab on them. JupyterLab serves
# until stopped, so this waits for its address (at most 120 s), then stops the make it started.
# Extra arguments go to make (tests/test_readme_commands.py passes `-o setup PY=...`: the
# environment is installed already there, and the test must not re-install it). LEARNERS names
# the folder (default learners/, as `make learn` has it; the test uses a temporary one).
set -euo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
# In CI: `make learn`, nothing added. Under the test: `make learn LEARNERS=... -o setup PY=...`.
setsid make learn ${LEARNERS:+LEARNERS="$LEARNERS"} "$@" >"$log" 2>&1 &
export LEARNERS="${LEARNERS:-learners}"
pid=$!
for _ in $(seq 1 120); do
  grep -q "http://127.0.0.1" "$log" && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 1
done
kill -- "-$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
if ! grep -q "http://127.0.0.1" "$log"; then
  echo "make learn: JupyterLab did not start; its output:" >&2; cat "$log" >&2; exit 1
fi
grep -q "jupyter lab $LEARNERS/" "$log" || { echo "make learn did not open $LEARNERS/" >&2; cat "$log" >&2; exit 1; }
"${PY_CHECK:-python3}" - <<'PY'
import json, os, pathlib
copies = sorted(pathlib.Path(os.environ["LEARNERS"]).glob("[0-9][0-9]_*.ipynb"))
originals = sorted(p.name for p in pathlib.Path("notebooks").glob("[0-9][0-9]_*.ipynb"))
assert [p.name for p in copies] == originals, f"learners/ holds {[p.name for p in copies]}"
for path in copies:
    cells = json.loads(path.read_text())["cells"]
    assert not any("solution" in c["metadata"].get("tags", []) for c in cells), f"{path}: a solution cell"
    assert not any(c.get("outputs") for c in cells), f"{path}: outputs"
print(f"make learn: {len(copies)} learner copies, no solutions, no outputs; JupyterLab started on {os.environ['LEARNERS']}/")
PY
rm -f "$log"
