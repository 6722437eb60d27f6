# Two entry points: `make demo` (the main job) and `make test` (the whole suite).
# Both create or reuse the project-local virtual environment in .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test typecheck bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# The CPU wheel first, so that the `torch>=...` requirement below is already met and
	# no multi-GB CUDA build is pulled onto a CPU machine. A machine with nvidia-smi keeps
	# whatever CUDA torch pip chooses.
	if command -v nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install -q torch; \
	else $(PY) -m pip install -q torch==2.13.0 || $(PY) -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu; fi
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m orchestrator demo

# Azurite (the Azure Blob emulator, from npm) for the storage tests; without npm those tests skip
# with a reason. Installed under .venv so `make clean` removes it with the rest.
AZURITE := $(VENV)/node/node_modules/.bin/azurite-blob
$(AZURITE): $(STAMP)
	if command -v npm >/dev/null 2>&1; then npm install --silent --no-audit --no-fund --prefix $(VENV)/node azurite@3 || echo "azurite not installed: the Azure Blob tests will skip"; \
	else echo "npm not found: the Azure Blob tests will skip"; fi

# Two workers, each test file on one of them (its module fixtures and servers stay together): most
# of the slow tests wait on Ray clusters and subprocesses, so two at once take ~2/3 of the time.
test: $(STAMP) $(AZURITE)
	$(PY) -m mypy orchestrator cloud actors
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=25

bench: $(STAMP)
	$(PY) benchmarks/planners.py

clean:
	rm -rf $(VENV) build *.egg-info
