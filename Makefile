# Two commands on a fresh machine: `make demo` and `make test`. Both install what is missing first.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
FMNIST := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
CHROMIUM := /usr/bin/chromium

# Every process: one compute thread, no Flower telemetry/update checks/runtime installs.
export OMP_NUM_THREADS ?= 1
export FLWR_TELEMETRY_ENABLED := 0
export FLWR_DISABLE_UPDATE_CHECK := 1
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION := 1

.PHONY: install demo lint test test-fast docs docs-serve protos clean

install: $(VENV)/.installed $(FMNIST)

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "fedbayes needs Python 3.11"' \
		|| { echo "Python 3.11 is required: set PYTHON=/path/to/python3.11"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

$(FMNIST):
	@if [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist; \
	else \
		echo "Fashion-MNIST is missing. As root run: apt-get install dataset-fashion-mnist"; \
		echo "(or point the runs at a torchvision FashionMNIST folder with --data-root)"; \
		exit 1; \
	fi

# The headless browser tests/integration/test_report.py checks `fedbayes report`'s page with; only the tests need it (without
# root it is not installed, and that test is skipped).
$(CHROMIUM):
	@if [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	else \
		echo "Chromium is missing: tests/integration/test_report.py skips its browser check (as root: apt-get install chromium)"; \
	fi

# Each demo is a new federation in its own runs/<time>-fedavg (an existing workdir is never reused unasked).
demo: install
	$(BIN)/fedbayes local --strategy fedavg --clients 3 --rounds 5 --dataset fmnist --split iid

# The static checks, configured in pyproject.toml: ruff's lint rules and formatting, mypy over the package (strict on
# bayes, protos and the round cores), and import-linter's contracts between the parts. `test` and `test-fast` run
# them first.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy -p fedbayes
	$(BIN)/lint-imports

# Everything, system tests included (as root they install and start what they need: Docker, namespaces), on every
# core: most tests wait on the processes they start, so two workers on two cores finish in a little over half the
# time (tests/conftest.py says what runs beside what). The 30 slowest tests are listed at the end (issue 33: the suite
# should take at most 15 minutes). The package is compiled first: where PYTHONDONTWRITEBYTECODE is set (as on the
# development machine) no process writes its bytecode, so each of the suite's ~200 processes that import fedbayes
# compiled it again (about 0.25 CPU-s each, ~1 of the suite's ~50 CPU-minutes); Python still reads bytecode compiled
# beforehand.
test: install $(CHROMIUM) lint
	$(BIN)/python -m compileall -q fedbayes fedbayes/*/
	$(BIN)/python -m pytest -q -n auto --dist loadgroup --durations=30 tests

# The in-process tiers (tests/unit, tests/component; tests/conftest.py says what each tier is), after
# make lint, on every core: about four minutes on two.
test-fast: install lint
	$(BIN)/python -m pytest -q -n auto --dist loadgroup tests/unit tests/component

# The documentation site (mkdocs.yml, docs/): the configuration reference regenerated from the declared keys, then a
# strict build into site/ (a broken link, a missing page or anchor fails it); docs-serve previews it on 127.0.0.1:8000.
docs: install
	$(BIN)/python docs/gen_config.py
	$(BIN)/mkdocs build --strict

docs-serve: install
	$(BIN)/python docs/gen_config.py
	$(BIN)/mkdocs serve

protos:
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. fedbayes/protos/common.proto fedbayes/protos/payloads.proto

clean:
	rm -rf runs .pytest_cache .mypy_cache .ruff_cache site
