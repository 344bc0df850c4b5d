# The two commands of the README. Both install what is missing first: scripts/install.py, which
# needs no make (`python scripts/install.py learn` does the same on Windows or a Mac without make).
PY := $(if $(VIRTUAL_ENV)$(CONDA_PREFIX),python,.venv/bin/python)
# The Python the set-up runs with and makes .venv from: `make learn PYTHON=python3.12` for another.
PYTHON ?= $(if $(VIRTUAL_ENV)$(CONDA_PREFIX),python,python3)

.PHONY: learn lab course-facts test test-room test-presets setup browser benchmark gpu-check preflight learner-copies run-all lock wheelhouse drift room room-stop room-reset room-update room-cert

# What each target installs (requirements/SET.txt): learn and lab the learner's set (the package,
# JupyterLab, torchao); room adds JupyterHub, its proxy and idle culler; test (and setup, the default) adds the test stack too.
SET ?= test
learn lab: SET = learn
room: SET = room
setup:
	@$(PYTHON) scripts/install.py $(SET)

# The versions: requirements/lock.txt (what CI tested; one universal lock, Python 3.11-3.13, Linux,
# macOS, Windows) and a file per set, all generated. `make lock` re-resolves them (and environment.yml)
# at the newest releases pyproject admits (with uv, which it installs); `make drift` first shows what
# those would break; `make wheelhouse` puts every locked wheel in wheelhouse/ for a room without the
# index (then WORKBENCH_WHEELHOUSE=wheelhouse make learn installs offline; SET=learn: a learner's only).
lock: setup
	$(PY) scripts/lock.py

drift: setup
	$(PY) scripts/drift.py

wheelhouse:
	$(PYTHON) scripts/install.py wheelhouse $(or $(WHEELHOUSE),wheelhouse) --wheelhouse-set $(SET)

# Chromium (apt, needs root) for the real-browser dashboard test; where it cannot be
# installed the browser test skips and says why.
browser: setup
	@bash .ci/install-browser.sh || echo "note: Chromium could not be installed; the browser test will skip"

# As root (containers, cloud boxes) jupyter refuses to start without --allow-root.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root,)

# A learner alone, one command: installs what is missing, makes the learner's copies of the
# notebooks (no outputs, no answers) in learners/ where they are not there yet, and opens
# JupyterLab on them. Copies that exist are kept: they hold the learner's answers.
LEARNERS ?= learners
learn: setup
	$(PY) scripts/learner_copies.py --missing --out $(LEARNERS)
	$(PY) -m jupyter lab $(LEARNERS)/ $(ALLOW_ROOT)

# The teacher's notebooks, outputs and solutions in.
lab: setup
	$(PY) -m jupyter lab notebooks/ $(ALLOW_ROOT)

# Single-threaded BLAS and offline hubs: what CI runs; timings comparable run to run. Two passes
# (scripts/run_tests.py, which needs no make): TEST_WORKERS pytest-xdist workers (default 2), a file
# to a worker so a notebook's cells share one kernel; then the tests marked `serial`
# (tests/conftest.py: timings that need the cores) alone.
test: setup browser
	$(PY) scripts/run_tests.py $(PYTEST_ARGS)

# The room on one machine in four browsers (tests/browser/test_room.py, as root; it skips otherwise):
# `make room` with the index and npm unreachable, a teacher and three learners, the admin's restart,
# an updated notebook, the idle culler. ~4 minutes alone, so not in `make test`; CI runs both.
test-room: setup browser
	$(PY) scripts/run_tests.py --room $(PYTEST_ARGS)

benchmark: setup
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(PY) benchmarks/overhead.py

# A workshop machine in under 30 s: packages, data, hardware (what it emulates), one run.
preflight: setup
	OMP_NUM_THREADS=1 $(PY) -m workbench.preflight

# Run All in a real JupyterLab (headless Chromium), notebook by notebook, as a learner does:
# `make run-all PRESET=cpu` (default cpu-quick); screenshots and summary.json in test-artifacts/run-all/,
# the times in benchmarks/results/lab-PRESET.json (README's and WORKSHOP's tables: `make course-facts`).
run-all: setup browser
	$(PY) scripts/lab_run_all.py --preset $(or $(PRESET),cpu-quick) --record benchmarks/results/lab-$(or $(PRESET),cpu-quick).json

# README's times table, WORKSHOP's three-hour path and docs/SUMMARY.md, from benchmarks/results/,
# the notebooks' words and their executed `claims` cells (stale ones fail tests/test_course_facts.py).
course-facts:
	$(PY) scripts/course_facts.py
	$(PY) scripts/summary.py

# The learners' copies (no outputs, no `solution` cells) in learners/: what a teacher hands out.
# Refuses to replace a copy that exists: `make learner-copies LEARNER_COPIES_ARGS=--force`.
learner-copies: setup
	$(PY) scripts/learner_copies.py $(LEARNER_COPIES_ARGS)

# CI's second pass: every course notebook with the `cpu` preset's shapes, and the `gpu` preset's for
# those a CPU runs at those sizes in seconds (the GPT notebooks' and 05's MiniLM at gpu shapes need a
# GPU: `make gpu-check`), steps and evaluation capped (the shapes are not). The `cpu` half starts
# every process with the `spawn` start method, macOS's and Windows' default (--start-method spawn:
# the kernels, their DataLoader workers and launched ranks; accelerate's notebook_launcher forks
# whatever the default, see README): a notebook that hard-codes one preset's shapes, or starts a
# process spawn cannot start, fails here. The optional 10 and 11, which start gloo processes on the
# CPU at every preset, run under nbval in `make test` and under `cpu` in the Run All records
# (benchmarks/results/cpu-avx2.json, lab-cpu.json). This was two passes, the spawn one at cpu-quick,
# with one core kept busy throughout: 1239 s on the 2-core AVX2-only EPYC, where CI's whole budget is
# 20 minutes (the busy core is now .ci/series', docs/NOTEBOOK_CI.md section 3).
COURSE_NOTEBOOKS := $(basename $(notdir $(filter-out notebooks/10_% notebooks/11_%,$(wildcard notebooks/[0-9][0-9]_*.ipynb))))
GPU_SHAPES_ON_CPU := 00_tour 04_input_pipelines 06_multi_gpu
# Two notebooks at a time, longest first.
test-presets: setup
	$(PY) benchmarks/notebook_times.py --preset cpu --jobs 2 --timeout 600 --notebooks $(COURSE_NOTEBOOKS) \
	  --compare benchmarks/results/cpu-avx2.json --start-method spawn \
	  --env WORKBENCH_MAX_STEPS=2 --env WORKBENCH_MAX_EVAL_SAMPLES=64 --out test-artifacts/presets-cpu.json
	$(PY) benchmarks/notebook_times.py --preset gpu --jobs 2 --timeout 600 --notebooks $(GPU_SHAPES_ON_CPU) \
	  --env WORKBENCH_MAX_STEPS=2 --env WORKBENCH_MAX_EVAL_SAMPLES=64 --out test-artifacts/presets-gpu.json

# Every notebook under the gpu preset on this machine's GPU, executed copies and a summary of the
# GPU claims in docs/gpu-reference/ (scripts/gpu_check.py: the best recipe's MFU first, then the notebooks
# in two lanes; it stops starting anything after 560 s).
gpu-check: setup
	$(PY) scripts/gpu_check.py --out docs/gpu-reference

# One machine serves the room (as root; docs/WORKSHOP.md "One machine for the room"): an account,
# a copy of the notebooks and a CPU and memory limit for each of SEATS learners and the teacher (the
# hub's admin), JupyterHub in the background on port 8000 with the room's store and the idle culler
# (scripts/room_hub.py start --help: --memory, --cores, --preset, --port, --https, --cull-idle).
# Names and passwords: /var/lib/workbench-room/roster.txt (root's only). Nothing from npm or the index.
SEATS ?= 8
room: setup
	$(PY) scripts/room_hub.py start --learners $(SEATS) $(ROOM_ARGS)

# Stop the hub, every learner's server and kernel; accounts and work are kept (make room starts it again).
room-stop:
	$(PY) scripts/room_hub.py stop

# Stop, then delete the learners' accounts with their work, and the room's files.
room-reset:
	$(PY) scripts/room_hub.py reset

# The notebooks as they are now to every learner: a copy they have not changed is replaced, one they
# changed is kept and the new version put beside it ("NN_name (update N).ipynb").
room-update:
	$(PY) scripts/room_hub.py update

# A certificate for the room's HTTPS (HOST: the name learners type), then make room ROOM_ARGS=--https.
room-cert:
	$(PY) scripts/room_hub.py cert $(if $(HOST),--host $(HOST),)
