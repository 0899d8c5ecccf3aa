# The README's commands. Each target creates .venv on first use (and again when
# pyproject.toml changes), so a fresh clone needs nothing but Python 3.12 and make.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run demo test lint bench clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else "llmitm needs Python >= 3.12 (found " + sys.version.split()[0] + ")")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@

# The proxy with the embedded defaults (or CONFIG=llmitm.toml): 127.0.0.1:8080, regular mode.
run: $(STAMP)
	$(BIN)/llmitm run $(if $(CONFIG),--config $(CONFIG))

demo: $(STAMP)
	$(BIN)/llmitm translate --to chat examples/azure-responses-stream.sse

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(STAMP)
	$(BIN)/python scripts/bench_translate.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
