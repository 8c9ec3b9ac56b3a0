# The two commands: `make test` and `make reproduce`. Each creates or updates .venv itself.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: test reproduce venv bench clean sandbox

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first: on machines with a local CPU wheel this picks it; the package's own range then installs nothing more
	$(PY) -m pip install --quiet "$(TORCH_SPEC)" || $(PY) -m pip install --quiet "torch>=2.4,<3"
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

# bubblewrap: the sandbox's operating-system layer for generated code (hf_mdm/harness/bubblewrap.py). Installed with
# apt-get where that works (root on Debian/Ubuntu), so that the tests exercise it; elsewhere a note, and the tests
# that need it are skipped with the reason.
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && apt-get install -y -qq bubblewrap) >/dev/null 2>&1 \
	      || echo "note: could not install bubblewrap with apt-get; generated code runs without OS isolation and its tests are skipped"; \
	  else \
	    echo "note: bubblewrap (bwrap) is not installed and this is not a root Debian machine: install it (apt-get/dnf install bubblewrap) for the sandbox's OS isolation; its tests are skipped"; \
	  fi; }

test: $(STAMP) sandbox
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) -m pytest -n 2 -q $(PYTEST_ARGS)

reproduce: $(STAMP)
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(VENV)/bin/hf-mdm reproduce

bench: $(STAMP)
	$(PY) evaluation/bench_sampler.py

clean:
	rm -rf $(VENV) build *.egg-info
