# Two commands set everything up on a fresh machine:
#   make lab   - create .venv if missing, install, and open JupyterLab on notebooks/
#   make test  - the same install, then the whole test suite (unit tests + notebook checkoffs)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LAB_ARGS ?=
PYTEST_ARGS ?=
# JupyterLab refuses to start as root unless told; containers and Colab-like boxes run as root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: lab test install clean-venv

install: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first, pinned, only when none is importable: a plain `torch` requirement would pull
# several GB of CUDA wheels, and a student's own CUDA build must never be replaced.
$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

lab: $(STAMP)
	$(VENV)/bin/jupyter lab $(ROOT_FLAG) --notebook-dir=notebooks $(LAB_ARGS)

test: $(STAMP)
	$(PY) -m pytest tests $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
