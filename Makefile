# Two commands set everything up on a fresh machine (Python 3.11):
#   make test   - create .venv, install pinned requirements, run the test suite
#   make book   - same install, then build the book, executing every notebook
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test book check-book install clean

$(BIN)/python:
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (Python 3.11 is required; set PYTHON=...)"; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): requirements.txt pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (hyv_lib)" >/dev/null
	touch $(STAMP)

install: $(STAMP)

# Tests and the book run JAX on the CPU. libtpu is installed for the TPU compiler (python -m hyv_lib compile), and
# JAX would otherwise probe for a TPU at start-up; JAX_PLATFORMS=cpu skips that (TPU compiles still work).
export JAX_PLATFORMS ?= cpu

# pytest exits 5 when it collects no tests: say so and fail, rather than pass on nothing.
# lint-imports (import-linter) first: the layers contract and "no cycles" of pyproject.toml, function-local imports counted.
test: $(STAMP)
	$(BIN)/lint-imports --no-cache
	@$(BIN)/python -m pytest tests -q || { rc=$$?; [ $$rc -eq 5 ] && echo "error: pytest collected no tests"; exit $$rc; }

book: $(STAMP)
	rm -rf _build  # doctrees too: otherwise Sphinx skips (and does not execute) unchanged notebooks
	rm -f _static/videos/*.mp4  # the chapters write this build's videos here (linked from the pages)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/jupyter-book build . -W --keep-going

# Debian's Chromium by default; on GitHub's Ubuntu runners: make check-book CHROMIUM=google-chrome
CHROMIUM ?= /usr/bin/chromium
check-book: $(STAMP)
	$(BIN)/python tools/check_book.py _build/html --chromium $(CHROMIUM)

clean:
	rm -rf _build .pytest_cache
