# covenant: two commands matter.
#   make demo   install into .venv and run the main job
#   make test   install into .venv (with test tools) and run the whole test suite
# The venv is built from an interpreter agent uids can execute: a daemon running as
# root starts agents as unprivileged uids (docs/security.md), and a venv made from a
# pyenv under a 0700 /root would be unreachable for them. /usr/bin/python3 when it is
# 3.11 or newer, else python3 on PATH; `make PYTHON=...` overrides.
SYSTEM_PYTHON := $(shell /usr/bin/python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && echo /usr/bin/python3)
PYTHON ?= $(or $(SYSTEM_PYTHON),python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
RUST_EXAMPLE := agents.d/search-rs

.PHONY: demo demo-real test install examples bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

# The rust-bin example needs cargo; without it that one agent is reported as not built.
examples:
	@if command -v cargo >/dev/null 2>&1; then \
		cargo build --quiet --release --manifest-path $(RUST_EXAMPLE)/Cargo.toml; \
	else echo "cargo not found: skipping $(RUST_EXAMPLE) (its manifest will report the missing binary)"; fi

demo: install examples
	COVENANT=$(VENV)/bin/covenant scripts/demo.sh

# The same demo against a real small model (SmolLM2-135M via llama-cpp-python's server, compiled
# on first use: ~4 min on 2 cores). See docs/providers.md.
demo-real: install examples
	scripts/real_model.sh install
	COVENANT_DEMO_MODEL=real COVENANT=$(VENV)/bin/covenant scripts/demo.sh

# The suite's tests wait on real processes far more than they compute: four workers keep two cores
# busy. Tests that share something host-wide carry an xdist_group mark and run on one worker
# (--dist loadgroup); every home gets agent uids of its own (tests/conftest.py, agent_uid_range).
TEST_WORKERS ?= 4

test: install examples
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

clean:
	rm -rf $(VENV) build *.egg-info
