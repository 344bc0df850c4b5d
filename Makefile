# The two commands of the README. Both install what is missing first (scripts/setup.sh).
PY := $(if $(VIRTUAL_ENV)$(CONDA_PREFIX),python,.venv/bin/python)

.PHONY: lab test setup browser benchmark preflight learner-copies

setup:
	@bash scripts/setup.sh lab,test,quantization

# Chromium (apt, needs root) for the real-browser dashboard test; where it cannot be
# installed the browser test skips and says why.
browser: setup
	@bash .ci/install-browser.sh || echo "note: Chromium could not be installed; the browser test will skip"

# As root (containers, cloud boxes) jupyter refuses to start without --allow-root.
lab: setup
	$(PY) -m jupyter lab notebooks/ $(if $(filter 0,$(shell id -u)),--allow-root,)

# Single-threaded BLAS and offline hubs: what CI runs; timings comparable run to run.
test: setup browser
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
	WORKBENCH_PRESET=$(or $(WORKBENCH_PRESET),cpu-quick) \
	$(PY) -m pytest $(PYTEST_ARGS)

benchmark: setup
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(PY) benchmarks/overhead.py

# A workshop machine in under 30 s: packages, data, hardware (what it emulates), one run.
preflight: setup
	OMP_NUM_THREADS=1 $(PY) -m workbench.preflight

# The learners' copies (no outputs, no `solution` cells) in learners/: what a teacher hands out.
learner-copies:
	python3 scripts/learner_copies.py
