# The two commands: `make test` and `make reproduce`. Each creates or updates .venv itself, with the versions pinned
# in constraints.txt (the lock). `make test-newest` / `make test-lowest` run the suite at either end of the ranges in
# pyproject.toml, each in a fresh environment; `make lock` rewrites constraints.txt from the newest releases once the
# suite passes on them. tools/envs.py does the installing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LOCK := constraints.txt
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=
export TORCH_SPEC
OFFLINE := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1

.PHONY: test reproduce reproduce-quick reproduce-paper venv bench gpu-check test-cuda clean system-deps test-newest test-lowest lock lint docs

venv: $(STAMP)

$(STAMP): pyproject.toml $(LOCK) tools/envs.py
	$(PYTHON) tools/envs.py create $(VENV) --versions locked
	touch $(STAMP)

# System set-up, kept out of `make test` (a test command does not change the machine): installs bubblewrap, the
# sandbox's operating-system layer for generated code (hf_mdm/harness/bubblewrap.py), and a C++ compiler, which
# torch.compile's inductor backend needs on the CPU (compile_forward), with apt-get or dnf when run as root, and
# otherwise says what to run. .ci/run calls it before `make test`. Without bubblewrap the sandbox refuses to run
# generated code unless HF_MDM_ALLOW_UNISOLATED_EXECUTION=1, and the tests that need it are skipped with the reason.
system-deps:
	@missing=""; command -v bwrap >/dev/null 2>&1 || missing="bubblewrap"; \
	command -v c++ >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1 || missing="$$missing c++"; \
	if [ -z "$$missing" ]; then echo "bubblewrap and a C++ compiler are installed: $$(command -v bwrap)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  apt-get update -qq && apt-get install -y -qq bubblewrap g++; \
	elif [ "$$(id -u)" = 0 ] && command -v dnf >/dev/null 2>&1; then \
	  dnf install -y bubblewrap gcc-c++; \
	else \
	  echo "missing:$$missing: run 'sudo apt-get install bubblewrap g++' (Debian/Ubuntu) or 'sudo dnf install bubblewrap gcc-c++' (Fedora)"; \
	  exit 1; \
	fi

test: $(STAMP) lint
	$(OFFLINE) $(PY) -m pytest -n 2 -q $(PYTEST_ARGS)

# The formatter and the linter (configured in pyproject.toml), run by `make test`.
lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

# The experiments at three sizes, the `first_look:`, `quick:` and `full:` scales of evaluation/configs
# (hf_mdm/experiments/scales.py holds each experiment's measured CPU minutes; every line of progress says its own).
# `make reproduce`: the first look, every experiment and kind of finding in about 12 minutes on 2 CPU cores, into
# results/first_look. `make reproduce-quick`: the committed results/REPORT.md, about an hour on 2 CPU cores.
reproduce: $(STAMP)
	$(OFFLINE) $(VENV)/bin/hf-mdm reproduce

reproduce-quick: $(STAMP)
	$(OFFLINE) $(VENV)/bin/hf-mdm reproduce --scale quick

# The paper's scale: the `full:` scales of evaluation/configs (L = 256..1024, 2,000 samples per cell, models trained
# on 1,000,000 sequences) into results/full; results/REPORT.md links its report once present. Training alone is
# estimated in REPORT.md's "Paper scale" section (hf_mdm.report.paper_scale_estimate): days on a GPU, years on 2 CPU
# cores. Run it where a GPU is; resumable (every finished cell and model is kept).
reproduce-paper: $(STAMP)
	$(OFFLINE) $(VENV)/bin/hf-mdm reproduce --scale full

# The suite on the newest releases the ranges admit, and on the lower bounds of the ranges (fresh environments).
test-newest:
	$(PYTHON) tools/envs.py create .venv-newest --versions newest --fresh
	$(OFFLINE) .venv-newest/bin/python -m pytest -n 2 -q $(PYTEST_ARGS)
	@$(PYTHON) tools/envs.py versions .venv-newest

test-lowest:
	$(PYTHON) tools/envs.py create .venv-lowest --versions lowest --fresh
	$(OFFLINE) .venv-lowest/bin/python -m pytest -n 2 -q $(PYTEST_ARGS)
	@$(PYTHON) tools/envs.py versions .venv-lowest

# Rewrites the lock from the newest releases, only after the whole suite passed on them.
lock: test-newest
	$(PYTHON) tools/envs.py lock .venv-newest

# One table (evaluation/bench.py): each sampler's time outside model.forward, the caches' speed-ups against their
# ideal from positions computed, hf_mdm's forward against a transformers Llama's, each sampler's host syncs per
# forward, the compiled model call against the eager one (tokens equal), with issue 22's targets and PASS/FAIL;
# 1 thread, interleaved rounds. About 20 minutes on 2 CPU cores; BENCH_ARGS="--batches 1" for 2. Then batch invariance
# (evaluation/bench_invariance.py): rows differing from themselves alone by default and with batch_invariant=True,
# and its cost, written to evaluation/BATCH_INVARIANCE.md (a few minutes); the LM head only at the still-masked
# positions at LLaDA's and Qwen2.5's vocabularies (evaluation/bench_lm_head.py -> evaluation/LM_HEAD.md); int8 and int4
# weights against bfloat16 for each family: memory, token agreement, ms per forward (evaluation/bench_quant.py ->
# evaluation/QUANTIZATION.md, under a minute; needs the quant extra); hf_mdm beside
# diffusers' LLaDA2Pipeline and transformers' DiffusionGemma generate, same tokens (evaluation/bench_peers.py ->
# evaluation/PEERS.md, about 11 minutes: the pipeline at 256 + 512 tokens, batch 8); SFT memory and time against AR, with and without LoRA and checkpointing
# (evaluation/bench_sft_memory.py -> evaluation/SFT_MEMORY.md); hf-mdm serve against generate called directly:
# throughput at 16 clients, one-request latency, p50/p99 and first-chunk times (evaluation/bench_serve.py ->
# evaluation/SERVE.md, loopback only); a GRPO step's time and memory against TRL's on an AR model of the same size
# (evaluation/bench_grpo.py -> evaluation/GRPO.md); the GRPO log-likelihood estimators against exact rollout
# likelihoods (evaluation/rl_estimators.py -> evaluation/RL_ESTIMATORS.md).
BENCH_ARGS ?=
bench: $(STAMP)
	$(OFFLINE) $(PY) evaluation/bench.py $(BENCH_ARGS)
	$(OFFLINE) $(PY) evaluation/bench_invariance.py --output evaluation/BATCH_INVARIANCE.md
	$(OFFLINE) $(PY) evaluation/bench_lm_head.py --output evaluation/LM_HEAD.md
	$(OFFLINE) $(PY) evaluation/bench_quant.py --output evaluation/QUANTIZATION.md
	$(OFFLINE) $(PY) evaluation/bench_peers.py --output evaluation/PEERS.md
	$(OFFLINE) $(PY) evaluation/bench_sft_memory.py --output evaluation/SFT_MEMORY.md
	$(OFFLINE) $(PY) evaluation/bench_serve.py --output evaluation/SERVE.md
	$(OFFLINE) $(PY) evaluation/bench_grpo.py --output evaluation/GRPO.md
	$(OFFLINE) $(PY) evaluation/rl_estimators.py --output evaluation/RL_ESTIMATORS.md

# Everything measured on a GPU in one unattended command (hf_mdm.gpu_check): the CUDA tests, then the real-shape
# table (LLaDA-8B, Dream-7B, LLaDA2.0-mini, Qwen2.5-7B, Llama-3-8B; random weights), written to results/gpu/.
# Meant to end in about 8 minutes (rows past --budget-s are skipped; first runs: results/gpu/README.md); GPU_CHECK_ARGS="--quick" for batch 1 only.
GPU_CHECK_ARGS ?=
gpu-check: $(STAMP)
	$(OFFLINE) $(PY) -m hf_mdm.gpu_check $(GPU_CHECK_ARGS)

# The CUDA tests alone (tests/gpu_check/test_cuda.py, about 30 s to 90 s on one GPU): make gpu-check runs them last,
# when its 8-minute budget reaches them, which its default plan of all five models does not.
test-cuda: $(STAMP)
	$(OFFLINE) $(PY) -m pytest -m cuda -q -p no:cacheprovider tests/gpu_check/test_cuda.py

# The documentation site (mkdocs.yml, docs/: a page per capability, the API reference from the docstrings, the
# results' figures and tables) built into build/site; --strict fails on a broken link or a page missing from nav.
docs: $(STAMP)
	$(OFFLINE) NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) .venv-newest .venv-lowest build *.egg-info
