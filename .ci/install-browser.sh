#!/usr/bin/env bash
# Install what the real-browser widget tests need, once (tests/browser/):
#  - Debian's Chromium and a font, from apt (no browser is downloaded from elsewhere);
#  - Python playwright from PyPI to drive it. Never `playwright install`: the tests
#    point playwright at /usr/lib/chromium/chromium.
# Idempotent: each step is skipped when what it installs is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -n "${VIRTUAL_ENV:-}" || -n "${CONDA_PREFIX:-}" ]]; then
  py=python
else
  py=.venv/bin/python
fi

installed=$(dpkg-query -W -f='${Status}\n' chromium fonts-dejavu-core 2>/dev/null \
            | grep -c "install ok installed" || true)
if [[ "$installed" != 2 ]]; then
  command -v apt-get >/dev/null || { echo "no apt-get: install Chromium by hand" >&2; exit 1; }
  sudo=""
  if [[ "$(id -u)" != 0 ]]; then
    command -v sudo >/dev/null || { echo "need root (or sudo) to apt-get install chromium" >&2; exit 1; }
    sudo=sudo
  fi
  echo "installing chromium and fonts-dejavu-core (apt) ..."
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium fonts-dejavu-core
fi

if ! "$py" -c "import playwright.sync_api" 2>/dev/null; then
  echo "installing playwright (pip) ..."
  "$py" -m pip --disable-pip-version-check -q install "playwright>=1.40"
fi

/usr/lib/chromium/chromium --version
"$py" -c "import importlib.metadata as m; print('playwright', m.version('playwright'))"
