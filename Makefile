# tfxl developer targets. Everything installs itself into .venv from the package registry.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# No TF_CPP_MIN_LOG_LEVEL here: the tools are quiet by themselves (tfxl/cli.py) and an exported
# level would replace their default of 3; tests/conftest.py sets its own.

.PHONY: test demo install bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) setup.cfg pyproject.toml
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install tfxl with its test extra

test: $(STAMP)     ## run the whole test suite
	$(PY) -m pytest -n 2 --dist loadfile -q tests

$(VENV)/.plots: $(STAMP)
	$(PY) -m pip install --quiet -e '.[plots]'
	touch $@

demo: $(VENV)/.plots  ## the main job on the embedded default corpus (plots: the `plots` extra)
	$(PY) -m train.demo

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
