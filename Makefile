# Two commands matter on a fresh Debian machine: `make demo` and `make test`.
# Both set everything up first (Open MPI from Debian, a .venv with mpi4py built
# against that Open MPI, mpitensor itself), so they work with nothing installed.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
NPS ?= 1 2 3 4

export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export OMPI_MCA_rmaps_base_oversubscribe := 1
export OPENBLAS_NUM_THREADS := 1

.PHONY: install system-deps demo docs test test-c test-python test-plain test-examples clean

# mpi4py is built from source so that it links the same libmpi as mpitensor._C
# (a test checks this); a binary wheel could bring its own MPI.
$(VENV)/.deps: pyproject.toml Makefile | system-deps
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q --no-binary=mpi4py "mpi4py>=4.0,<5" "numpy>=1.26" \
	  "scikit-build-core>=0.10" cmake ninja \
	  "pytest>=8" "pytest-timeout>=2.3" "hypothesis>=6" tabulate rich matplotlib \
	  "ipyparallel>=8.6" "nbclient>=0.10" "ipykernel>=6.29"
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

system-deps:
	@if ! command -v mpicc >/dev/null || ! command -v mpiexec >/dev/null; then \
	  echo "Installing Open MPI from Debian"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq libopenmpi-dev openmpi-bin; \
	fi
	@$(PYTHON) -c "import venv, ensurepip" 2>/dev/null || { \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq python3-venv; }

# Editable install: Python files are used in place; C changes rebuild
# incrementally in build/ on the next `make install`.
install: $(VENV)/.deps
	$(PIP) install -q --no-build-isolation -e .
	$(PY) -c "import mpitensor"

demo: install
	mpiexec --oversubscribe -n 4 $(PY) examples/quickstart.py

test: install
	@start=$$(date +%s); status=0; \
	$(MAKE) --no-print-directory test-c || status=1; \
	$(MAKE) --no-print-directory test-python || status=1; \
	$(MAKE) --no-print-directory test-plain || status=1; \
	$(MAKE) --no-print-directory test-examples || status=1; \
	echo "make test: $$(( $$(date +%s) - start ))s, $$( [ $$status = 0 ] && echo passed || echo FAILED )"; \
	exit $$status

test-c: $(VENV)/.deps
	$(VENV)/bin/cmake -S . -B build/ctest \
	  -DMPITENSOR_BUILD_TESTS=ON -DMPITENSOR_BUILD_EXTENSION=OFF -DMPITENSOR_WERROR=ON >/dev/null
	$(VENV)/bin/cmake --build build/ctest -j2
	cd build/ctest && ../../$(VENV)/bin/ctest --output-on-failure -j2

test-python: install
	@status=0; for np in $(NPS); do tests/run_mpi_pytest.sh $$np || status=1; done; exit $$status

# Plain pytest, as users run it: the mpi-marked tests (each started under mpiexec by
# the pytest_mpitensor plugin), the plugin's own tests, and every notebook headless.
test-plain: install
	timeout -k 20 1200 $(PY) -m pytest -m mpi tests/python -q
	timeout -k 20 1200 $(PY) -m pytest tests/plugin tests/notebooks -q
	$(MAKE) --no-print-directory docs

# docs/ as HTML in build/site (MkDocs, strict: a warning such as a broken link fails).
docs: $(VENV)/.deps
	$(PIP) install -q "mkdocs>=1.6"
	$(VENV)/bin/mkdocs build -q

# The examples run as one plain process and under mpiexec, as the README promises.
test-examples: install
	@set -e; for f in examples/*.py; do \
	  echo "=== $$f (python)"; timeout 120 $(PY) $$f > /dev/null; \
	  echo "=== $$f (mpiexec -n 4)"; timeout 120 mpiexec --oversubscribe -n 4 $(PY) $$f > /dev/null; \
	done; echo "examples: all ran"

clean:
	rm -rf build $(VENV)
