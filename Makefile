# tfxl developer targets. Everything installs itself into .venv from the package registry.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# No TF_CPP_MIN_LOG_LEVEL here: the tools are quiet by themselves (tfxl/cli/quiet.py) and an
# exported level would replace their default of 3; tests/conftest.py sets its own.

.PHONY: test test-expensive test-all test-jax test-torch lint demo demo-classify install clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# uv (from PyPI, into the venv) installs what pip would, from PyPI, in parallel (a fresh
# clone on 2 cores: 30 s against pip's 109 s). Like pip, it compiles every module to bytecode
# (--compile-bytecode, ~15 s more): without .pyc files, and with PYTHONDONTWRITEBYTECODE set as on
# this project's machines, every process that imports TensorFlow compiles its modules again
# (9 s instead of 3.3 s), and the suite starts some fifty: a fresh clone's `.ci/run` took
# 9 min 18 s with them, 11 min 12 s without (the same tests, the same host).
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

# The suite is split by measured cost (BUILD.md "Tests"): `make test` is every test but those
# listed in tests/expensive_tests.txt (for the JAX pass, tests/expensive_tests_jax.txt), whose
# call took over 3 s in a whole run (two workers preempted and resumed, the README workflow on
# gs://, kill -9 during a save, the tools as processes, ...), on all three backends;
# `make test-expensive` is those; .ci/run runs both, so CI runs every test. Files go to two
# workers whole, largest measured cost first (tests/marker_check.py), so both finish together.
PYTEST_TF := $(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder -q --durations=20

# The modules marked every_backend again on JAX (tests/conftest.py selects them, and sets XLA's
# flags for JAX's per-op compiles: tests/backends.py). JAX compiles every eager op of a new
# shape, so its costly tests are not TensorFlow's: they have their own list, measured on JAX.
PYTEST_JAX := KERAS_BACKEND=jax JAX_PLATFORMS=cpu $(PY) -m pytest -n 2 --dist loadfile -q \
	-o expensive_list=tests/expensive_tests_jax.txt

test: $(STAMP)     ## the suite on TensorFlow, JAX and PyTorch, without the expensive tests
	$(PYTEST_TF) -m "not expensive" $(PYTEST_ARGS) tests
	$(MAKE) test-jax
	$(MAKE) test-torch

test-expensive: $(STAMP) ## the tests measured over 3 s (tests/expensive_tests*.txt), on TensorFlow and JAX
	$(PYTEST_TF) -m expensive $(PYTEST_ARGS) tests
	$(PYTEST_JAX) -m expensive $(PYTEST_ARGS) tests

# The same tests as `make test` and `make test-expensive` together (.ci/run runs those two), with
# the TensorFlow pass and the JAX pass each in one run: what `PYTEST_ARGS=--update-expensive`
# needs to measure every test as the lists' seconds were measured.
test-all: $(STAMP) ## every test, the TensorFlow ones and the JAX ones each in one run (--update-expensive's)
	$(PYTEST_TF) $(PYTEST_ARGS) tests
	$(PYTEST_JAX) $(PYTEST_ARGS) tests
	$(MAKE) test-torch

test-jax: $(STAMP) ## the every_backend tests under KERAS_BACKEND=jax, without its expensive ones
	$(PYTEST_JAX) -m "not expensive" $(PYTEST_ARGS) tests

# The same modules on PyTorch (eager: nothing to compile). One intra-op thread per worker: two
# workers share the cores, and the tests' ops are small.
test-torch: $(STAMP) ## the every_backend tests under KERAS_BACKEND=torch
	KERAS_BACKEND=torch OMP_NUM_THREADS=1 \
	$(PY) -m pytest -n 2 --dist loadfile -q -o expensive_seconds=inf $(PYTEST_ARGS) tests

lint: $(STAMP)     ## ruff, configured in pyproject.toml
	$(PY) -m ruff check tfxl train tpu tests benchmarks

demo: $(STAMP)     ## the main job on the embedded default corpus (its plots: the `plots` extra, in `test`)
	$(PY) -m tfxl.train.demo

demo-classify: $(STAMP)  ## issue #18's classifier on stdlib packages: memory vs none vs truncation, plot
	$(PY) -m tfxl.train.classify_demo

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
