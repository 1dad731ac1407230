# tfxl developer targets. Everything installs itself into .venv from the package registry.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# No TF_CPP_MIN_LOG_LEVEL here: the tools are quiet by themselves (tfxl/cli/quiet.py) and an
# exported level would replace their default of 3; tests/conftest.py sets its own.

.PHONY: test test-large test-expensive test-jax test-torch lint demo demo-classify demo-context install clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# uv (from PyPI, into the venv) installs what pip would, from PyPI, in parallel, which is several
# times faster on a fresh clone. Like pip, it compiles every module to bytecode
# (--compile-bytecode): without .pyc files, and with PYTHONDONTWRITEBYTECODE set, every process
# that imports TensorFlow compiles its modules again, and the suite starts dozens of them.
# uv reads its own settings, not pip's: the wheel folder pip is configured with (PIP_FIND_LINKS,
# else pip.conf's find-links) is passed on, so that torch==2.13.0 resolves to its CPU wheel where
# one is there (else PyPI's CUDA build: the same tests, several GB more to download).
ifeq ($(origin UV_FIND_LINKS),undefined)
UV_FIND_LINKS := $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
endif
export UV_FIND_LINKS
$(STAMP): $(PY) setup.cfg pyproject.toml
	$(PY) -m pip install --quiet 'uv>=0.9'
	$(PY) -m uv pip install --quiet --compile-bytecode --python $(PY) -e '.[test]'
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install tfxl with its test extra

# The demos run on TensorFlow only: their own install is tfxl with the plots extra (no torch, jax
# or test tools, which make the test extra's .venv some 4 GB). A .venv that `make install` made
# (it has the test extra, plots included) is used as it is.
DEMO_STAMP := $(VENV)/.installed-demo
DEMO_INSTALL := $(if $(wildcard $(STAMP)),$(STAMP),$(DEMO_STAMP))
$(DEMO_STAMP): $(PY) setup.cfg pyproject.toml
	$(PY) -m pip install --quiet 'uv>=0.9'
	$(PY) -m uv pip install --quiet --compile-bytecode --python $(PY) -e '.[plots]'
	touch $(DEMO_STAMP)

# `make test` is every test not marked `large` (@pytest.mark.large: an end-to-end run such as two
# workers preempted and resumed, kill -9 during a save, the tools as processes; or a first XLA
# compile of a kind on JAX), on all three backends; `make test-large` is the large ones; .ci/run
# runs both, so CI runs every test. Whole files go to two workers (each file stays in one process:
# the multi-device tests and the module fixtures need it).
PYTEST := $(PY) -m pytest -n 2 --dist loadfile -q
PYTEST_TF := $(PYTEST) --durations=20

# The modules marked every_backend again on JAX (tests/conftest.py selects them, and sets XLA's
# flags for JAX's per-op compiles: tests/backends.py).
PYTEST_JAX := KERAS_BACKEND=jax JAX_PLATFORMS=cpu $(PYTEST)

test: $(STAMP)     ## the suite on TensorFlow, JAX and PyTorch, without the tests marked large
	$(PYTEST_TF) -m "not large" $(PYTEST_ARGS) tests
	$(MAKE) test-jax
	$(MAKE) test-torch

# The memory_peak tests run alone, after the rest: a process's peak is measured with the
# machine to itself, as a benchmark's is.
test-large: $(STAMP) ## the tests marked large, on TensorFlow and JAX
	$(PYTEST_TF) -m "large and not memory_peak" $(PYTEST_ARGS) tests
	$(PY) -m pytest -q -m "large and memory_peak" $(PYTEST_ARGS) tests
	$(PYTEST_JAX) -m large $(PYTEST_ARGS) tests

test-expensive: test-large  ## another name for test-large

test-jax: $(STAMP) ## the every_backend tests under KERAS_BACKEND=jax, without the large ones
	$(PYTEST_JAX) -m "not large" $(PYTEST_ARGS) tests

# The same modules on PyTorch, the large ones included: eager, nothing to compile, so the whole
# pass is short. One intra-op thread per worker: two workers share the cores, and the tests' ops are small.
test-torch: $(STAMP) ## the every_backend tests under KERAS_BACKEND=torch
	KERAS_BACKEND=torch OMP_NUM_THREADS=1 $(PYTEST) $(PYTEST_ARGS) tests

lint: $(STAMP)     ## ruff, configured in pyproject.toml
	$(PY) -m ruff check tfxl train tpu tests benchmarks

demo: $(DEMO_INSTALL)  ## the main job on the embedded default corpus (its plots: the `plots` extra)
	$(PY) -m tfxl.train.demo

demo-classify: $(DEMO_INSTALL)  ## the document classifier on stdlib packages: memory vs none vs truncation, plot
	$(PY) -m benchmarks.classify_demo

demo-context: $(DEMO_INSTALL)  ## Transformer-XL, a vanilla Transformer and an LSTM trained tiny: RECL table, plot
	$(PY) -m benchmarks.context_demo

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
