# Two commands on a fresh machine, both idempotent (a second run only does what changed):
#   make course   set up .venv, then execute every notebook headless (build/index.html)
#   make test     set up .venv, then run the test suite (what CI runs, via .ci/run)
#   make test-fast  the inner loop: the suite without the notebooks, browser and slow tests
# `make setup` alone builds the environment; `make clean` removes it and build/.

PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
BIN := $(VENV)/bin

# torch first, pinned: left to `pip install -e .`, the wide `torch>=2.1` requirement resolves
# to the newest PyPI build with several GB of CUDA libraries. On a machine without an NVIDIA
# GPU whose pip has no index of its own configured, take the CPU wheel from PyTorch's index;
# otherwise trust pip (a GPU machine gets the CUDA build; a configured mirror is used as is).
# Override with `make test TORCH_INDEX=URL` (or TORCH_INDEX= for plain pip).
PIP_HAS_INDEX := $(shell $(PYTHON) -m pip config list 2>/dev/null | grep -E 'index-url|find-links')
TORCH_INDEX ?= $(if $(shell command -v nvidia-smi)$(PIP_HAS_INDEX),,https://download.pytorch.org/whl/cpu)
TORCH_FROM := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX),)

.PHONY: setup graders course test test-fast test-gpu clean

setup: $(VENV)/.installed

# Rebuilt when the dependencies change; the stamp makes a second `make` a no-op.
# pip byte-compiles what it installs (12 of torch's 17 s here). Not skipped: where
# PYTHONDONTWRITEBYTECODE=1 is set (as on this project's machines), Python would compile
# torch's modules again in every rank, kernel and worker it starts (1 s more per import).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "torch==$(TORCH_VERSION)" $(TORCH_FROM)
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	@$(BIN)/python -c 'import sys, torch; print("python:", sys.executable, "torch:", torch.__version__)'
	@touch $@

# nbgrader and Otter-Grader (pyproject's `grading` extra) in a venv of their own, for the tests
# that run them on `ddp-lab assign`'s exports (tests/grading/test_assign*.py skip without it).
GRADERS ?= build/venv-graders
GRADING_EXTRA := $(BIN)/python -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["grading"]))'

graders: $(GRADERS)/.installed

$(GRADERS)/.installed: pyproject.toml | $(VENV)/.installed
	$(PYTHON) -m venv $(GRADERS)
	$(GRADERS)/bin/python -m pip install --quiet --upgrade pip
	$(GRADERS)/bin/python -m pip install --quiet $$($(GRADING_EXTRA))
	@touch $@

course: setup
	$(BIN)/ddp-lab notebooks

# Two pytest-xdist workers: most tests wait on processes, sockets and timeouts more than they
# compute. Each worker takes whole test files (the notebooks' file on one worker);
# tests/conftest.py keeps their leak checks apart (MachineLock).
WORKERS ?= 2
XDIST := -n $(WORKERS) --dist loadfile

test: setup graders
	$(BIN)/python -m pytest -q $(XDIST)

# The markers are registered in pyproject.toml (--strict-markers): a typo fails, not skips.
test-fast: setup
	$(BIN)/python -m pytest -q $(XDIST) -m "not notebooks and not browser and not slow"

# On a machine with CUDA: the launcher, backend="auto" and the GPU paths (tests/gpu/test_gpu.py).
test-gpu: setup
	$(BIN)/python -m pytest -m gpu tests/gpu -q -rP

clean:
	rm -rf $(VENV) build
