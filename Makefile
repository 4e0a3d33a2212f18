# The two commands of the README: `make conformance` and `make test`.
# Both create .venv if missing and install the package with the pinned
# dependencies from constraints.txt (the one constraints file used everywhere).

PYTHON ?= python3.11
# Python's default: bytecode is written when a module is first imported, so each of the many
# interpreters a run starts (suite runs, scenarios, spawn workers) does not compile torch again.
# Some environments turn that off (this machine's does); the targets below turn it back on.
unexport PYTHONDONTWRITEBYTECODE
#: what every suite run, scenario and worker imports: compiled when the venv is made
WARM_IMPORTS := $(shell grep -v '^\#' .ci/warm-imports)
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(PY) -m pip
STAMP   = $(VENV)/.installed

.PHONY: venv lint check test parity-torch wheel-check flake-rate test-under-load conformance conformance-quick docs bench bench-epochs bench-soak bench-api-soak bench-suite tox results clean

$(PY):
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found (set PYTHON=...)"; exit 1; }
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml constraints.txt
	$(PIP) install --quiet --upgrade "pip>=23.1"
	$(PIP) install --quiet --no-compile -c constraints.txt -e '.[dev,third-party]'
	@# what every run imports, compiled once (8 s here); the rest as it is first imported. pip's own
	@# compile (each file in turn, ~90 s) or compileall (40 s on 2 cores) compiles all of site-packages,
	@# two thirds of whose files nothing here imports (a cloud SDK of mosaicml-streaming's alone is 18k)
	$(PY) -c "$(WARM_IMPORTS)"
	@touch $(STAMP)

venv: $(STAMP)

RUFF  = $(VENV)/bin/ruff
STAGE = bash .ci/stage
#: xdist workers for the self-tests that do not measure speed (they mostly wait on boots and bounds)
JOBS ?= 4
#: a speed self-test that was not judged (the machine was busy) fails the stage: it proved nothing
SPEED_SKIPS ?= --skips-fail

#: the layers: import-linter's contracts in pyproject.toml (docs/development.md, "Layers")
LAYERS = $(VENV)/bin/lint-imports --no-cache

lint: $(STAMP)
	$(RUFF) check .
	$(LAYERS)

# The inner loop: lint and the self-tests that run no suite.
check: $(STAMP)
	$(STAGE) lint $(RUFF) check .
	$(STAGE) layers $(LAYERS)
	$(STAGE) unit $(PY) -m pytest -p no:cacheprovider -q -n 2 -m "not suite and not slow and not speed" tests

# What CI runs, in timed stages; each runs, and any failure fails the target:
# lint and layers; every self-test but the speed measurements, side by side (a module, or a
# class, stays on one xdist worker: a batch of broken loaders is one class), and beside them
# the wheel check (mostly one core's pip and build; its output is printed when it ends); then
# the speed measurements alone, where a skip (the suite refused to judge a busy
# machine) fails the run.
test: $(STAMP)
	@rc=0; wheel_log=$$(mktemp); \
	$(STAGE) lint $(RUFF) check . || rc=1; \
	$(STAGE) layers $(LAYERS) || rc=1; \
	{ $(STAGE) wheel bash .ci/wheel-check $(WHEEL_PROFILE) > $$wheel_log 2>&1 & } ; wheel=$$!; \
	$(STAGE) self-tests $(PY) -m pytest -p no:cacheprovider --durations=30 -n $(JOBS) --dist loadscope \
	    -m "not speed" tests || rc=1; \
	wait $$wheel || rc=1; cat $$wheel_log; rm -f $$wheel_log; \
	$(STAGE) speed $(PY) -m pytest -p no:cacheprovider --durations=10 -m speed $(SPEED_SKIPS) tests || rc=1; \
	exit $$rc

# The differential judge's truth is torch: torch's DataLoader against itself over 200 drawn points per
# context shows no difference (the self-tests judge 40 under fork); spawn's points against the suite's
# forkserver truth, each booting its workers (about 12 s of CPU a point here).
parity-torch: $(STAMP)
	WORKERSTART_TORCH_POINTS=200 WORKERSTART_TORCH_METHODS=fork,forkserver,spawn $(PY) -m pytest -p no:cacheprovider -q -n 3 \
	    tests/test_parity.py -k torchs_own_dataloader

# What a user gets from the README's install: the built wheel alone in a fresh venv, from an
# empty directory (.ci/wheel-check). CI runs the quick profile; before a release: WHEEL_PROFILE=full.
WHEEL_PROFILE ?= quick
wheel-check: $(STAMP)
	bash .ci/wheel-check $(WHEEL_PROFILE)

# The flake rate of the self-tests: every self-test but the speed ones,
# FLAKE_RUNS times under -n 2, each in another random order (pytest-randomly, seeds 1..N),
# one line per run with its seed, outcome counts and the failed tests, in FLAKE_LOG.
# pytest-randomly lives outside the venv (.flake-plugins, on PYTHONPATH), and tests/conftest.py takes it
# off the PYTHONPATH of what the self-tests start: the suites they run keep their checks' order.
FLAKE_RUNS ?= 5
FLAKE_LOG  ?= flake-rate.log
FLAKE_ARGS ?= -m "not speed" tests
flake-rate: $(STAMP)
	$(PIP) install --quiet --target .flake-plugins --no-deps "pytest-randomly==5.1.0"
	@: > $(FLAKE_LOG); for seed in $$(seq $(FLAKE_RUNS)); do \
	  start=$$(date +%s); \
	  PYTHONPATH=$(CURDIR)/.flake-plugins PYTEST_ADDOPTS="-p no:randomly" $(PY) -m pytest -p no:cacheprovider \
	    -p randomly --randomly-seed=$$seed -q -n 2 --dist loadscope -rfE $(FLAKE_ARGS) > $(FLAKE_LOG).$$seed 2>&1; \
	  rc=$$?; \
	  echo "seed $$seed: exit $$rc, $$(( $$(date +%s) - start )) s: $$(tail -1 $(FLAKE_LOG).$$seed)" | tee -a $(FLAKE_LOG); \
	  grep -E "^(FAILED|ERROR) " $(FLAKE_LOG).$$seed | tee -a $(FLAKE_LOG); \
	done

# `make test` and `make conformance-quick` while LOAD CPU-bound processes run
# beside them (default 2: on a 2-core machine, half the CPU for the suite). The speed
# self-tests are then skipped, not failed: beside the hogs the speed checks must refuse
# to judge, and test_speed_is_not_judged_on_a_busy_machine checks that they do.
LOAD ?= 2
test-under-load: $(STAMP)
	@bash -c 'pids=""; for i in $$(seq $(LOAD)); do $(PY) -c "while True: pass" & pids="$$pids $$!"; done; \
	  trap "kill $$pids" EXIT; echo "test-under-load: $(LOAD) CPU hogs:$$pids"; \
	  $(MAKE) --no-print-directory test SPEED_SKIPS= && $(MAKE) --no-print-directory conformance-quick'

conformance: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider --workerstart --workerstart-profile=full

conformance-quick: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider --workerstart --workerstart-profile=quick

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The committed benchmark (docs/bench/): dataset, then the three loaders, then
# the worker-count series with p=N and forkserver preload, then the figures.
BENCH = $(PY) -m pytest_workerstart.bench
BENCH_LABEL ?= 2-core VM
bench: $(STAMP)
	$(BENCH) --make-dataset
	$(BENCH) --loader reference torch torchdata --context spawn forkserver --num-workers 1 2 4 8 \
	    --parallelism 1 cores --trials 3 --max-batches 40 --label "$(BENCH_LABEL)" --json docs/bench/loaders.json
	$(BENCH) --loader reference --context spawn forkserver+preload --num-workers 1 8 16 \
	    --parallelism 1 cores N --trials 3 --max-batches 40 --label "$(BENCH_LABEL)" --json docs/bench/scaling.json
	$(BENCH) plot docs/bench/loaders.json -o docs/bench/loaders.png
	$(BENCH) plot docs/bench/scaling.json -o docs/bench/scaling.png --workers 8
	$(BENCH) table docs/bench/loaders.json docs/bench/scaling.json > docs/bench/results.md
	$(BENCH) targets docs/bench/loaders.json > docs/bench/reference.md
	$(MAKE) --no-print-directory bench-epochs

# Time to batch k over two iterators (persistent_workers=False): the reference on its
# own forkserver against torch (issue #16's targets), about 15 minutes here.
EPOCH_CONFIGS = torch/spawn/w1/p1 torch/spawn/w8/p1 torch/forkserver/w8/p1 reference/spawn/w8/pcores \
	reference/forkserver/w8/p1 reference/forkserver/w8/pcores reference/forkserver/w16/pcores
bench-epochs: $(STAMP)
	$(BENCH) --make-dataset
	$(BENCH) --config $(EPOCH_CONFIGS) --epochs 2 --trials 3 --max-batches 40 --label "$(BENCH_LABEL)" \
	    --json docs/bench/epochs.json
	$(BENCH) arrivals docs/bench/epochs.json -o docs/bench/arrivals.png
	$(BENCH) epochs docs/bench/epochs.json > docs/bench/epochs.md

# The loaders' soak (docs/bench/soak.md): 1,000 iterator lifecycles under forkserver and 50 under
# spawn, then 100 epochs of one persistent loader, the reference and torch, each in a fresh
# driver; the driver's fds, threads, children, zombies, /dev/shm entries and PSS every 50 cycles.
SOAK_PLAN ?= forkserver:1000 spawn:50
bench-soak: $(STAMP)
	$(BENCH) soak --loader reference torch --plan $(SOAK_PLAN) --json docs/bench/soak.json
	$(BENCH) soak-plot docs/bench/soak.json -o docs/bench/soak.png
	$(BENCH) soak-table docs/bench/soak.json > docs/bench/soak.md
	$(MAKE) --no-print-directory bench-api-soak

# The suite's own soak (docs/bench/api-soak.md): check_loader on the reference 20 times in one
# interpreter, quick profile, forkserver: the same verdict each time, nothing left in the caller.
bench-api-soak: $(STAMP)
	$(BENCH) api-soak --runs 20 --json docs/bench/api-soak.json > docs/bench/api-soak.md

# The suite's own time to verdict (docs/bench/suite.md): one `pytest --workerstart` run per
# loader and profile, timed from outside, with where each run's time went.
# The full profile of torch and torchdata takes 6-8 min each here:
# `make bench-suite SUITE_FULL_LOADERS="reference torch torchdata"`. SUITE_VERDICTS=DIR keeps
# each full run's verdict file (DIR/LOADER-full.json), e.g. to publish them in docs/results.
SUITE_LOADERS      ?= reference torch torchdata
SUITE_FULL_LOADERS ?= reference
SUITE_VERDICTS     ?=
bench-suite: $(STAMP)
	$(BENCH) suite --loader $(SUITE_LOADERS) --profile quick --label "$(BENCH_LABEL)" \
	    --json docs/bench/suite-quick.json > /dev/null
	$(BENCH) suite --loader $(SUITE_FULL_LOADERS) --profile full --label "$(BENCH_LABEL)" \
	    --json docs/bench/suite-full.json $(if $(SUITE_VERDICTS),--verdicts $(SUITE_VERDICTS)) > /dev/null
	$(BENCH) suite-table docs/bench/suite-quick.json docs/bench/suite-full.json > docs/bench/suite.md

# tox (virtualenv) does not resolve pyenv shims: put each pyenv version's bin/ on PATH.
ENVS ?= py312-spawn,py313-forkserver
PYENV_BINS = $(subst $(eval) ,:,$(wildcard $(shell pyenv root 2>/dev/null)/versions/3.1[0-3].*/bin))
tox: $(STAMP)
	PATH="$(PYENV_BINS):$$PATH" $(VENV)/bin/tox -e $(ENVS)

# Re-record the published verdicts (docs/results/*.json), each loader in a tox environment of its
# own (tox.ini, results-LOADER: its extra's exact pin beside the pinned torch), one at a time,
# each environment removed after its run (each holds torch: ~6 GB). The torch verdict becomes the
# shipped baseline before the third-party loaders are judged against it. Then what changed per
# loader since the last recording (docs/results/changes.txt) and the tables. A full run of every
# loader takes a few hours here: RESULTS="accelerate webdataset" re-records those alone.
RESULTS ?= reference torch torchdata monai litdata mosaic accelerate webdataset
results: $(STAMP)
	@set -e; before=$$(mktemp -d); cp docs/results/*.json $$before/; \
	for r in $(RESULTS); do \
	  PATH="$(PYENV_BINS):$$PATH" $(VENV)/bin/tox -e results-$$r; rm -rf .tox/results-$$r; \
	  if [ $$r = torch ]; then cp docs/results/torch.json pytest_workerstart/baselines/torch.json; fi; \
	done; \
	$(PY) -m pytest_workerstart.results_changes $$before docs/results | tee docs/results/changes.txt; \
	$(PY) -m pytest_workerstart.results_table --write docs/results

clean:
	rm -rf $(VENV) build dist site *.egg-info .tox
