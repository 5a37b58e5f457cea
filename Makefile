# The README's two commands: `make run` (main job) and `make test` (whole suite).
# Both create the virtual environment on first use, so a fresh clone needs nothing else.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
RANKS  ?= 2
STAMP  := $(VENV)/.installed

.PHONY: run test test-main test-slow test-fast venv clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test,mpich,pyg,emulate]'
	$(BIN)/python -c 'from sparse_dist import dropout_kernel; dropout_kernel.warm_up()'  # numba's cache, once
	$(BIN)/python -c 'import numpy, scipy.sparse; from sparse_dist import sampling_compiled as s; \
	  [s.warm_up(scipy.sparse.csr_matrix((1, 1), dtype=t)) for t in (numpy.float32, numpy.float64)]'  # the sampler's
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	test -f data_prepared/cora/meta.json || $(BIN)/sparse-dist prepare planetoid --out data_prepared/cora --parts 4
	$(BIN)/mpiexec -n $(RANKS) $(BIN)/sparse-dist train --data data_prepared/cora --out results/cora-gcn.jsonl

# The whole suite on one pytest worker per core, at most four (pytest-xdist): each worker launches its own
# mpiexec jobs, so two workers on two cores oversubscribe them while both run multi-rank cases. Every Python
# process a test launches is forked from a zygote that imported torch once (tests/support/preload;
# SPARSE_DIST_TEST_PRELOAD=off starts each one afresh). `.ci/run` calls this target.
PYTEST := PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m pytest -q -n auto --maxprocesses 4
test: $(STAMP)
	$(BIN)/python -m compileall -q sparse_dist algorithms runners tests > /dev/null  # every mpiexec rank imports them
	$(PYTEST) tests

# The suite's two parts alone: the main lane (`not slow`) and the end-to-end lane (pytest marker `slow`: sweep,
# emulate, Slurm templates, a kill at every commit point, multi-rank cases again at one more rank count).
test-main: $(STAMP)
	$(BIN)/python -m compileall -q sparse_dist algorithms runners tests > /dev/null
	$(PYTEST) -m "not slow" tests

test-slow: $(STAMP)
	$(BIN)/python -m compileall -q sparse_dist algorithms runners tests > /dev/null
	$(PYTEST) -m slow tests

# The unit lane: in-process tests only (tests/unit, no mpiexec), seconds.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

clean:
	rm -rf $(VENV) build *.egg-info
