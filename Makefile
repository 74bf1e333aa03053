# Two entry points (see README): `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch is pinned to the CPU wheel that lies on this machine type's disk. A looser spec
# would make pip download a multi-GB CUDA build, so it is installed first, on its own.
TORCH  := torch==2.13.0

.PHONY: demo demo-high-lr test setup setup-dev chromium docs docs-build clean

$(VENV)/.setup-base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.setup-dev: $(VENV)/.setup-base
	$(BIN)/python -m pip install -q -e ".[dev,gpu]"
	touch $@

setup: $(VENV)/.setup-base
setup-dev: $(VENV)/.setup-dev

# Seed A's Break 19: control (clip 1.0) and break (no clip) on the same batches, trained as
# two parallel 1-thread processes, then the comparison report in out/phase-19/.
demo: $(VENV)/.setup-base
	@$(BIN)/spikecheck train experiments/19-control --quiet & control=$$!; \
	 $(BIN)/spikecheck train experiments/19-break-no-clip --quiet & broken=$$!; \
	 wait $$control && wait $$broken
	$(BIN)/spikecheck compare experiments/19-control experiments/19-break-no-clip --out out/phase-19
	$(BIN)/spikecheck diagnose experiments/19-break-no-clip

# The instability that kills: lr 0.1 without and with qk-layernorm (same batches), then the
# comparison (loss, grad norm and logits panels) in out/high-lr/ and the break's diagnosis.
demo-high-lr: $(VENV)/.setup-base
	@$(BIN)/spikecheck train experiments/high-lr-qk-layernorm --quiet & defended=$$!; \
	 $(BIN)/spikecheck train experiments/high-lr-break --quiet & broken=$$!; \
	 wait $$defended && wait $$broken
	$(BIN)/spikecheck compare experiments/high-lr-qk-layernorm experiments/high-lr-break --out out/high-lr
	$(BIN)/spikecheck diagnose experiments/high-lr-break

# The report page's browser tests (tests/test_report_page.py) open it in headless Chromium: Debian's
# chromium is installed with apt-get where make runs as root with apt (CI does); elsewhere those
# tests skip and say why. Instant when a browser is already on PATH.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	 if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	   echo "make: installing chromium with apt-get (the report page's browser tests)"; \
	   { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	     echo "make: apt-get could not install chromium: the browser tests will skip (and fail under CI)"; \
	 else \
	   echo "make: no chromium on PATH and no root apt-get: the browser tests will skip (apt-get install chromium)"; \
	 fi

test: $(VENV)/.setup-dev chromium
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest --spikecheck -n auto --dist loadscope --no-loadscope-reorder

# The documentation site (mkdocs.yml, pages in docs/; the reference pages are generated from the code by
# docs/hooks.py). `make docs` serves it on http://127.0.0.1:8000 and rebuilds on every edit; `make docs-build`
# writes site/ (open site/index.html from the disk: it loads nothing from the network). `make test` builds it
# with --strict too (tests/test_docs_site.py).
docs: $(VENV)/.setup-dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

docs-build: $(VENV)/.setup-dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf out experiments/*/run .pytest_cache site

# The sdist and the wheel in dist/, checked by twine (docs/releasing.md). The wheel is built from
# the sdist (python -m build's default), so what the sdist lacks the wheel lacks too.
.PHONY: dist
dist: $(VENV)/.setup-dev
	rm -rf dist
	$(BIN)/python -m build --no-isolation --outdir dist .
	$(BIN)/python -m twine check --strict dist/*
