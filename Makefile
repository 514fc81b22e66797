# covenant: two commands matter.
#   make demo   install into .venv and run the main job (daemon, dispatches, audit verify)
#   make test   install into .venv (with test tools) and run the whole test suite
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: demo test install examples bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

examples: install
	$(PY) -m covenant.examples build

demo: install examples
	$(PY) -m covenant.demo

test: install examples
	$(PY) -m pytest -q

bench: install examples
	$(PY) -m bench.run_all

clean:
	rm -rf $(VENV) build *.egg-info
