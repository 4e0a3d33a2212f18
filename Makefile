# The two commands of the README: `make conformance` and `make test`.
# Both create .venv if missing and install the package with the pinned
# dependencies from constraints.txt (the one constraints file used everywhere).

PYTHON ?= python3.11
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(PY) -m pip
STAMP   = $(VENV)/.installed

.PHONY: venv test conformance conformance-quick docs bench clean

$(PY):
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found (set PYTHON=...)"; exit 1; }
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml constraints.txt
	$(PIP) install --quiet --upgrade "pip>=23.1"
	$(PIP) install --quiet -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider tests

conformance: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider --workerstart --workerstart-profile=full

conformance-quick: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider --workerstart --workerstart-profile=quick

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) build dist site *.egg-info .tox
