# The two commands: `make test` and `make reproduce`. Each creates or updates .venv itself.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: test reproduce venv bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first: on machines with a local CPU wheel this picks it; the package's own range then installs nothing more
	$(PY) -m pip install --quiet "$(TORCH_SPEC)" || $(PY) -m pip install --quiet "torch>=2.4,<3"
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

test: $(STAMP)
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) -m pytest -n 2 -q $(PYTEST_ARGS)

reproduce: $(STAMP)
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(VENV)/bin/hf-mdm reproduce

bench: $(STAMP)
	$(PY) evaluation/bench_sampler.py

clean:
	rm -rf $(VENV) build *.egg-info
