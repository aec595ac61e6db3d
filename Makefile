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
FUZZ_SECONDS ?= 60
# Debian packages the build and the checks need; each is probed by its command
# (gdb: the stacks of a test's hung job, for the failure's message).
SYSTEM_TOOLS := mpicc:libopenmpi-dev mpiexec:openmpi-bin valgrind:valgrind \
  clang:clang clang-tidy:clang-tidy cppcheck:cppcheck gdb:gdb
# Debian libraries mpitensor loads at run time, each probed by its file in the
# loader's cache: ScaLAPACK for Open MPI (np.linalg.solve, eigh, ... on sharded
# matrices; csrc/linalg loads it by dlopen, so the build does not need it), and
# OpenBLAS, one thread, as the system's BLAS and LAPACK that ScaLAPACK calls (the
# reference BLAS it would otherwise get is several times slower).
SYSTEM_LIBS := libscalapack-openmpi.so:libscalapack-openmpi-dev \
  libopenblas.so.0:libopenblas0-serial

export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export OMPI_MCA_rmaps_base_oversubscribe := 1
export OPENBLAS_NUM_THREADS := 1
# Compiled bytecode, and pytest's rewritten test modules, are kept in build/ and
# read back by every later process: `make test` starts Python processes by the
# hundred, and each one compiling mpitensor and rewriting the suite's asserts again
# (as it does where PYTHONDONTWRITEBYTECODE is set) was most of the time every
# rank of every pass spent collecting.
export PYTHONPYCACHEPREFIX := $(abspath build/pycache)
unexport PYTHONDONTWRITEBYTECODE

.PHONY: ecosystem plan-ranking install c-build system-deps demo docs test test-c test-python test-python-4-rest test-plain test-pages test-examples \
  test-network test-multinode test-lint test-fuzz fuzz-seeds test-fuzz-ranks test-asan \
  test-array-api test-array-api-short array-api-suite bench bench-check calibrate \
  bench-multinode clean

# mpi4py is built from source so that it links the same libmpi as mpitensor._C
# (a test checks this); a binary wheel could bring its own MPI. mkl (the extra
# mpitensor[mkl], about 7 s to install from the mirror) is the BLAS the nn kernels
# load at import when it is there (docs/performance.md). ml_dtypes (the extra
# mpitensor[bfloat16]) is there so that the bfloat16 tests run rather than skip;
# h5py, zarr, xarray and h5netcdf (the extra mpitensor[io]) so that the HDF5, Zarr
# and netCDF tests do, and netCDF4 so that files are also read by the other
# netCDF-4 library; pytest-json-report and ndindex for the array API standard's
# suite (test-array-api); scikit-learn, SciPy and array-api-compat as the client
# libraries the tests judge DTensors by (tests/python/test_clients_*.py).
PY_DEPS := --no-binary=mpi4py "mpi4py>=4.0,<5" "numpy>=1.26" \
  "scikit-build-core>=0.11" cmake ninja threadpoolctl \
  mkl "pytest>=8" "pytest-timeout>=2.3" "hypothesis>=6.151" "psutil>=5" \
  tabulate rich matplotlib "ipyparallel>=8.6" "nbclient>=0.10" "ipykernel>=6.29" ml_dtypes \
  "h5py>=3.8" "zarr>=3.1" "xarray>=2025.1" "h5netcdf>=1.3" "pytest-json-report" "ndindex>=1.8" \
  "scikit-learn>=1.6" "scipy>=1.14" "array-api-compat>=1.11" netCDF4
%/.deps: pyproject.toml Makefile | system-deps
	$(PYTHON) -m venv $*
	$*/bin/python -m pip --disable-pip-version-check install -q --upgrade pip
	$*/bin/python -m pip --disable-pip-version-check install -q $(PY_DEPS)
	$*/bin/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

system-deps:
	@missing=; for t in $(SYSTEM_TOOLS); do \
	  command -v $${t%%:*} >/dev/null || missing="$$missing $${t#*:}"; done; \
	for t in $(SYSTEM_LIBS); do \
	  $$(command -v ldconfig || echo /sbin/ldconfig) -p | grep -q "$${t%%:*}" || \
	    missing="$$missing $${t#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  echo "Installing from Debian:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi
	@$(PYTHON) -c "import venv, ensurepip" 2>/dev/null || { \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq python3-venv; }

# Editable install: Python files are used in place; C changes rebuild
# incrementally in build/ on the next `make install`.
install: $(VENV)/.deps
ifndef INSTALLED
	$(PIP) install -q --no-build-isolation -e .
	$(PY) -c "import mpitensor"
endif

demo: install
	mpiexec --oversubscribe -n 4 $(PY) -m mpi4py examples/quickstart.py

# The parts run one after the other, each given INSTALLED=1 so that none installs
# again; the members of a part a+b+c run side by side (the others' reports shown
# after a's); TEST_IDLE runs through all of them at the kernel's idle priority, or
# first, as a part, where chrt --idle is refused. Which work shares a part, and why:
# docs/testing.md. The C is built first, as a step of its own (c-build); the parts
# then run with C_BUILT=1, so that no two build the same tree at once, and a failed
# build fails the run without stopping the Python passes.
TEST_IDLE := test-lint
TEST_PARTS := test-c+test-fuzz test-python-1 test-python-2 test-python-3 \
  test-python-4-rest test-plain+test-pages+test-examples test-multinode test-array-api-short
test: install
	@start=$$(date +%s); failed=; times=; export MT_FAILURES=$(abspath build/test-failures.txt); \
	mkdir -p build; rm -f "$$MT_FAILURES" build/$(TEST_IDLE).time; \
	$(MAKE) --no-print-directory INSTALLED=1 c-build || failed=" c-build"; \
	times=" c-build $$(( $$(date +%s) - start ))s,"; parts="$(TEST_PARTS)"; idle=; \
	if chrt --idle 0 true 2>/dev/null; then \
	  ( t=$$(date +%s); chrt --idle 0 $(MAKE) --no-print-directory INSTALLED=1 C_BUILT=1 \
	    $(TEST_IDLE) > build/$(TEST_IDLE).log 2>&1; rc=$$?; \
	    echo $$(( $$(date +%s) - t )) > build/$(TEST_IDLE).time; exit $$rc ) & idle=$$!; \
	else parts="$(TEST_IDLE) $$parts"; fi; \
	for part in $$parts; do t=$$(date +%s); first=$${part%%+*}; pids=; \
	  for other in $$(echo "$${part#$$first}" | tr '+' ' '); do \
	    $(MAKE) --no-print-directory INSTALLED=1 C_BUILT=1 $$other > build/$$other.log 2>&1 & \
	    pids="$$pids $$other:$$!"; done; \
	  $(MAKE) --no-print-directory INSTALLED=1 C_BUILT=1 $$first || failed="$$failed $$first"; \
	  for other in $$pids; do wait $${other#*:} || failed="$$failed $${other%:*}"; \
	    cat build/$${other%:*}.log; done; \
	  times="$$times $$part $$(( $$(date +%s) - t ))s,"; done; \
	if [ -n "$$idle" ]; then t=$$(date +%s); wait $$idle || failed="$$failed $(TEST_IDLE)"; \
	  cat build/$(TEST_IDLE).log; took=$$(cat build/$(TEST_IDLE).time 2>/dev/null); \
	  times="$$times $(TEST_IDLE) at idle priority $${took}s, waited for $$(( $$(date +%s) - t ))s,"; fi; \
	echo "make test, each part:$${times%,}"; \
	echo "make test: $$(( $$(date +%s) - start ))s, $$( [ -z "$$failed" ] && echo passed || echo "FAILED in:$$failed")"; \
	[ -f "$$MT_FAILURES" ] && cat "$$MT_FAILURES"; \
	[ -z "$$failed" ]

# One build of everything in C (the core, the extension, the C tests), warnings as
# errors, for the C tests and for test-lint, which reads its compile commands.
# C_BUILT=1 skips it (make test builds it once, before its parts).
c-build: $(VENV)/.deps
ifndef C_BUILT
	$(VENV)/bin/cmake -S . -B build/ctest -DMPITENSOR_BUILD_TESTS=ON \
	  -DMPITENSOR_BUILD_EXTENSION=ON -DMPITENSOR_WERROR=ON -DMPITENSOR_VALGRIND=ON \
	  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DPython_EXECUTABLE=$(abspath $(PY)) >/dev/null
	$(VENV)/bin/cmake --build build/ctest -j2
endif

test-c: c-build
	cd build/ctest && $(abspath tests/record_failures.sh) ctest \
	  $(abspath $(VENV))/bin/ctest --output-on-failure -j2

test-python: install
	@status=0; for np in $(NPS); do tests/run_mpi_pytest.sh $$np || status=1; done; exit $$status

# One pass of test-python, at the rank count the name ends with, as a part of its own.
test-python-%: install
	tests/run_mpi_pytest.sh $*

# make test's np 4 pass: all but the transport-facing files, which test-multinode
# runs at np 4 across simulated hosts (test-network over TCP where it cannot), so
# that each test still runs at four ranks, once.
test-python-4-rest: install
	tests/run_mpi_pytest.sh 4 $(addprefix --ignore=,$(TRANSPORT_TESTS))

# Plain pytest, as users run it: the mpi-marked tests (each started under mpiexec by
# the pytest_mpitensor plugin; only the files that mark any are collected, since the
# rest of the suite runs under mpiexec in test-python) and the plugin's own tests.
test-plain: install
	tests/record_failures.sh "plain pytest -m mpi" \
	  timeout -k 20 1200 $(PY) -m pytest -m mpi \
	  $$(grep -l -E 'mark\.mpi\b' tests/python/test_*.py) -q
	tests/record_failures.sh "plain pytest of the plugin" \
	  timeout -k 20 1200 $(PY) -m pytest tests/plugin -q

# What users read and run: every notebook headless, the programs on the pages of
# docs/ and the README, and the site built strict.
test-pages: install
	tests/record_failures.sh "plain pytest of notebooks and pages" \
	  timeout -k 20 1200 $(PY) -m pytest tests/notebooks tests/docs -q
	tests/record_failures.sh "mkdocs build --strict" $(MAKE) --no-print-directory docs

# docs/ as HTML in build/site (MkDocs, strict: a warning such as a broken link, a
# missing anchor or a page left out of the nav fails). Not -q: it hides the warnings
# that strict counts, so nothing would fail; the INFO lines are dropped instead.
docs: $(VENV)/.deps
	$(PIP) install -q "mkdocs>=1.6"
	set -o pipefail; $(VENV)/bin/mkdocs build --strict 2>&1 | { grep -v '^INFO' || true; }

# The examples run as one plain process and under mpiexec, as the README promises.
# train_gpt.py runs a few steps here: its default run trains for several hundred.
test-examples: install
	@set -e; for f in examples/*.py; do \
	  case $$f in *train_gpt.py) args="--steps 10";; *) args="";; esac; \
	  echo "=== $$f $$args (python)"; timeout 120 $(PY) $$f $$args > /dev/null; \
	  echo "=== $$f $$args (mpiexec -n 4)"; \
	  timeout 120 mpiexec --oversubscribe -n 4 $(PY) $$f $$args > /dev/null; \
	done; echo "examples: all ran"

# docs/ecosystem.md's tables from the client-library tests at np 2 (the outcomes
# the conftest writes to MT_TEST_REPORT, read by tests/clients_table.py).
ecosystem: install
	mkdir -p build; MT_TEST_REPORT=$(abspath build/clients.json) tests/run_mpi_pytest.sh 2 \
	  tests/python/test_clients_sklearn.py tests/python/test_clients_scipy.py \
	  tests/python/test_clients_xarray.py -q || true
	$(PY) tests/clients_table.py build/clients.json docs/ecosystem.md

# The array API standard's suite (data-apis/array-api-tests at 55fcc60, with the
# standard's text at 5f847a3) against mpitensor.array_api, every rank drawing the
# same examples (tests/array_api/run.sh; what it fails, each with its reason, is
# tests/array_api/xfails*.txt): the standard's newest version, 2025.12, at np 1 to 4,
# and the namespace's own, 2024.12, at np 1 (the two differ in a few result types
# and signatures, not in what runs distributed). `make test` runs a few examples per
# test; test-array-api runs ARRAY_API_EXAMPLES. The suite is ../shared/array-api-tests
# beside this checkout, or beside the local checkout it was cloned from (a fresh
# clone in a temporary folder), else cloned into build/.
ORIGIN_DIR := $(shell git config --get remote.origin.url 2>/dev/null)
ARRAY_API_TESTS ?= $(abspath $(firstword $(patsubst %/array_api_tests,%,$(wildcard \
  ../shared/array-api-tests/array_api_tests \
  $(if $(ORIGIN_DIR),$(ORIGIN_DIR)/../shared/array-api-tests/array_api_tests))) \
  build/array-api-tests))
ARRAY_API_EXAMPLES ?= 50
export ARRAY_API_TESTS
array-api-suite:
	@[ -d "$(ARRAY_API_TESTS)/array_api_tests" ] || { \
	  git clone -q https://github.com/data-apis/array-api-tests "$(ARRAY_API_TESTS)" && \
	  git -C "$(ARRAY_API_TESTS)" checkout -q 55fcc60 && \
	  git -C "$(ARRAY_API_TESTS)" submodule update -q --init; }

ARRAY_API_RUNS := 2025.12:1 2025.12:2 2025.12:3 2025.12:4 2024.12:1
test-array-api-short: install array-api-suite
	@status=0; for run in $(ARRAY_API_RUNS); do ARRAY_API_TESTS_VERSION=$${run%:*} \
	  tests/array_api/run.sh $${run#*:} 3 -q || status=1; done; exit $$status

test-array-api: install array-api-suite
	@status=0; for run in $(ARRAY_API_RUNS); do ARRAY_API_TESTS_VERSION=$${run%:*} \
	  MT_RUN_TIMEOUT=3600 MT_TEST_TIMEOUT=600 \
	  tests/array_api/run.sh $${run#*:} $(ARRAY_API_EXAMPLES) -q || status=1; done; exit $$status

# The transport-facing test files (tests/transport_files.txt), for the runs over
# TCP and across simulated hosts.
TRANSPORT_TESTS := $(shell grep -v '^\#' tests/transport_files.txt)

# The transport-facing tests at np 4 with Open MPI kept off shared memory: the ob1
# point-to-point layer over TCP on loopback, the path a multi-node job takes.
# `make test` runs it where test-multinode cannot simulate hosts, whose 2 x 2 run
# takes that path between hosts; either is its np 4 run of these files.
test-network: install
	OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo \
	  tests/run_mpi_pytest.sh 4 $(TRANSPORT_TESTS)

# Across hosts, simulated on this machine (tests/multinode/run.sh: four hosts, each
# its own network, PID, UTS, mount and IPC namespace, joined by a bridge): the
# transport-facing tests (tests/transport_files.txt) at np 4 on 2 hosts x 2 ranks, the node-layout tests on 1x4, 4x1, 3+1
# and round-robin ranks, the examples, and a train_gpt.py checkpoint saved on 2x2
# and resumed on 1x4 and 4x1 with the same losses. It needs root and namespaces;
# without them it says so and runs test-network instead.
test-multinode: install
	@tests/multinode/run.sh; rc=$$?; [ $$rc -eq 77 ] || exit $$rc; \
	echo "test-multinode: the transport tests over TCP on this host instead (test-network)"; \
	$(MAKE) --no-print-directory INSTALLED=1 test-network

# Warnings as errors over the core, the extension and the C tests (test-c's build,
# made here when test-c has not run); clang-tidy (.clang-tidy; the files in
# .clang-tidy-skip, each with its reason, excepted) and cppcheck
# (.cppcheck-suppressions) over csrc/. clang-tidy reads that build's compile commands
# with NDEBUG undefined, so that the analyzer sees the assert()s that state the
# invariants.
test-lint: c-build
	ls csrc/*/*.c | grep -v -x -F -f .clang-tidy-skip \
	  | xargs -P2 -n4 clang-tidy -p build/ctest --extra-arg=-UNDEBUG --quiet 2>/dev/null
	cppcheck -j2 --quiet --error-exitcode=1 --enable=warning,style,performance,portability \
	  --std=c11 --library=python --inline-suppr --suppressions-list=.cppcheck-suppressions \
	  -I csrc/include -I csrc/core -I csrc/comm -I csrc/io -I csrc/kernels csrc/
	@echo "lint: no warnings, clang-tidy and cppcheck clean"

# libFuzzer over layout and planning for FUZZ_SECONDS; the corpus in build/fuzz
# grows from run to run. A crash leaves its input as build/fuzz/crash-*.
# The whole core: it is pure C, and a list by hand went stale when planning gained files.
FUZZ_SRC := tests/fuzz/fuzz_plan.c $(wildcard csrc/core/*.c)
build/fuzz/fuzz_plan: $(FUZZ_SRC) $(wildcard csrc/core/*.h csrc/include/mpitensor/*.h \
  csrc/include/mpitensor/*/*.h) | system-deps
	mkdir -p build/fuzz/corpus
	clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
	  -Icsrc/include -Icsrc/core $(FUZZ_SRC) -lm -o $@

# The run starts from the committed seeds (tests/fuzz/seeds.hex, one input per line in
# hex, libFuzzer's merge of earlier corpora), so that CI's short run, on a fresh clone,
# reaches deep plans at once; `make fuzz-seeds` folds the local corpus into them.
SEED_HEX := tests/fuzz/seeds.hex
build/fuzz/seeds: $(SEED_HEX)
	rm -rf $@ && mkdir -p $@
	python3 -c 'import sys; lines = [l for l in open(sys.argv[1]).read().splitlines() if l and not l.startswith("#")]; [open(f"{sys.argv[2]}/{i}", "wb").write(bytes.fromhex(l)) for i, l in enumerate(lines)]' $< $@

fuzz-seeds: build/fuzz/fuzz_plan build/fuzz/seeds
	rm -rf build/fuzz/merged && mkdir -p build/fuzz/merged
	cd build/fuzz && ./fuzz_plan -merge=1 -max_len=64 merged seeds corpus > merge.log 2>&1
	python3 -c 'import os, sys; d = sys.argv[1]; head = [l for l in open(sys.argv[2]) if l.startswith("#")]; body = sorted(open(os.path.join(d, f), "rb").read().hex() for f in os.listdir(d)); open(sys.argv[2], "w").write("".join(head) + "\n".join(body) + "\n")' build/fuzz/merged $(SEED_HEX)

test-fuzz: build/fuzz/fuzz_plan build/fuzz/seeds
	@cd build/fuzz && ./fuzz_plan -max_total_time=$(FUZZ_SECONDS) -max_len=64 -timeout=60 \
	  -rss_limit_mb=4096 -print_final_stats=1 corpus seeds > last.log 2>&1 \
	  || { tail -40 last.log; echo "fuzz: FAILED (input saved in build/fuzz)"; exit 1; }
	@grep -E "^(Done|stat::(number_of_executed_units|average_exec_per_sec|new_units_added))" \
	  build/fuzz/last.log; echo "fuzz: no invariant broken in $(FUZZ_SECONDS)s"

# The one-rank fuzz at length (tests/python/test_one_rank_fuzz.py): every rank in
# turn passes the odd argument, on a 1-D and a (1, N) mesh; `make test` runs the
# last rank's turn on the 1-D mesh.
test-fuzz-ranks: install
	@status=0; for np in 2 3; do MT_FUZZ_LONG=1 tests/run_mpi_pytest.sh $$np \
	  tests/python/test_one_rank_fuzz.py -q || status=1; done; exit $$status

# ASan and UBSan over the C tests and over the Python suite at np 2. The Python
# side runs in its own venv, .venv-asan, whose editable mpitensor is built with
# MPITENSOR_SANITIZE=ON; the interpreter is not instrumented, so libasan is
# preloaded (with libstdc++, whose C++ exceptions, thrown by matplotlib's
# extensions, ASan's interceptor must find loaded). A failed huge allocation
# returns NULL as in a plain build, so the out-of-memory tests see MemoryError.
# Leak detection is on for the C unit tests and off where CPython and Open MPI
# run (both keep their allocations until exit by design); leaks there are
# caught by tests/python/test_leaks.py (RSS and live communicators) instead.
# The instrumented suite runs several times slower than a plain one, so the
# whole-run budget of run_mpi_pytest.sh, sized for a plain run, would end it
# midway: the run gets hours, and each test still its own 300 s.
ASAN_VENV := .venv-asan
ASAN_ENV := ASAN_OPTIONS=detect_leaks=0:abort_on_error=0:detect_stack_use_after_return=0:allocator_may_return_null=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 PYTHONMALLOC=malloc MT_SANITIZED=1
test-asan: $(VENV)/.deps $(ASAN_VENV)/.deps
	$(VENV)/bin/cmake -S . -B build/asan-ctest -DMPITENSOR_BUILD_TESTS=ON \
	  -DMPITENSOR_BUILD_EXTENSION=OFF -DMPITENSOR_SANITIZE=ON >/dev/null
	$(VENV)/bin/cmake --build build/asan-ctest -j2
	cd build/asan-ctest && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1 \
	  $(abspath $(VENV))/bin/ctest --output-on-failure -j2 -L unit
	cd build/asan-ctest && $(ASAN_ENV) $(abspath $(VENV))/bin/ctest --output-on-failure -j2 -L mpi
	$(ASAN_VENV)/bin/python -m pip --disable-pip-version-check install -q \
	  --no-build-isolation -e . -Ccmake.define.MPITENSOR_SANITIZE=ON \
	  -Cbuild-dir=build/asan-{wheel_tag}
	$(ASAN_ENV) LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libstdc++.so)" \
	  PYTHON=$(abspath $(ASAN_VENV))/bin/python MT_TEST_TIMEOUT=300 MT_RUN_TIMEOUT=14400 \
	  tests/run_mpi_pytest.sh 2

# The benchmarks at np 2 (and np 4 for redistribute), one BLAS thread per rank,
# JSON into benchmarks/results/CPU/, PNG plots into docs/img/perf/CPU/ and the tables of
# docs/performance.md rewritten from the JSON (commit the three together).
# The short set took 7.3 minutes on 2 cores busy with other jobs; BENCH_FULL=1 runs every
# benchmark with its own defaults (sizes up to 64 MiB per rank, 1 GiB checkpoints,
# 16k-token attention) and checkpoint and context parallelism at np 4 too, which
# takes several times longer. torch is timed alongside when it is importable in
# the venv (not beside the redistributions, whose raw MPI baselines gloo's polling
# threads would slow on 2 cores), and Heat (benchmarks/vs_heat.py, skipped without it) when it is
# importable. Every figure is a ratio against a baseline timed
# interleaved in the same run (see docs/performance.md).
BENCH_FULL ?=
MPIRUN := mpiexec --oversubscribe -n
ifeq ($(BENCH_FULL),)
BENCH_REDIST := --max-bytes 16MiB --reps 15 --reps-large 7 --no-plot
BENCH_DISPATCH := --reps 15 --reps-large 31 --reps-matmul 7 --miss-reps 15
BENCH_TP := --hidden 1024 2048 --reps 5
BENCH_CKPT := --sizes 64MiB,256MiB --reps 5
BENCH_CP := --seq 4096 --reps 3
BENCH_DEBUG := --reps 11
BENCH_TRAIN := --reps 3
BENCH_HEAT := --quick
BENCH_IO :=
BENCH_NP4 :=
BENCH_SKLEARN := --reps 3
else
BENCH_REDIST := --no-plot
BENCH_DISPATCH :=
BENCH_TP :=
BENCH_CKPT :=
BENCH_CP :=
BENCH_DEBUG :=
BENCH_TRAIN :=
BENCH_HEAT :=
BENCH_IO := --mib 64,256 --reps 5 --budget 1200
BENCH_NP4 := 4
BENCH_SKLEARN :=
endif
bench: install
	@set -e; mkdir -p benchmarks/results; \
	torch=$$($(PY) -c "import torch" 2>/dev/null && echo --torch || true); \
	start=$$(date +%s); echo "load average at start: $$(cut -d' ' -f1-3 /proc/loadavg)"; \
	$(MPIRUN) 2 $(PY) benchmarks/redistribute.py $(BENCH_REDIST); \
	$(MPIRUN) 4 $(PY) benchmarks/redistribute.py $(BENCH_REDIST); \
	$(MPIRUN) 2 $(PY) benchmarks/dispatch.py $(BENCH_DISPATCH) $$torch; \
	$(MPIRUN) 2 $(PY) benchmarks/tensor_parallel.py $(BENCH_TP) $$torch; \
	for np in 2 $(BENCH_NP4); do \
	  $(MPIRUN) $$np $(PY) benchmarks/checkpoint.py $(BENCH_CKPT); \
	  $(MPIRUN) $$np $(PY) benchmarks/context_parallel.py $(BENCH_CP); done; \
	$(MPIRUN) 2 $(PY) benchmarks/debug.py $(BENCH_DEBUG); \
	$(MPIRUN) 2 $(PY) benchmarks/transport.py; \
	$(MPIRUN) 2 $(PY) benchmarks/train.py $(BENCH_TRAIN) $$([ -n "$$torch" ] || echo --no-torch); \
	$(MPIRUN) 2 $(PY) benchmarks/vs_heat.py $(BENCH_HEAT); \
	$(MPIRUN) 2 $(PY) benchmarks/io.py $(BENCH_IO); \
	$(MPIRUN) 2 --bind-to none $(PY) benchmarks/sklearn_fit.py $(BENCH_SKLEARN); \
	echo "load average at end: $$(cut -d' ' -f1-3 /proc/loadavg)"; \
	$(PY) benchmarks/plot.py benchmarks/results --out docs/img/perf; \
	$(PY) benchmarks/tables.py; \
	echo "make bench: $$(( $$(date +%s) - start ))s"

# Whether the redistribution goals (benchmarks/redistribute.py, docs/benchmarks.md)
# hold on this machine:
# a short redistribute.py run at np 2 (the speed goals) and np 4 (a regression watch
# against the committed run) that prints PASS or FAIL per goal and fails when one does. Not part of `make test`: it times, so run it on a quiet machine.
BENCH_CHECK_NPS ?= 2 4
BENCH_CHECK := --sizes 1KiB,1MiB,4MiB --reps 15 --reps-large 9 --mem-bytes 40MiB --no-plot --goals
bench-check: install
	@mkdir -p benchmarks/results; status=0; for np in $(BENCH_CHECK_NPS); do \
	  $(MPIRUN) $$np $(PY) benchmarks/redistribute.py $(BENCH_CHECK) $(BENCH_CHECK_ARGS) \
	    --out benchmarks/results/bench-check-np$$np.json || status=1; done; \
	echo "make bench-check: $$( [ $$status = 0 ] && echo every goal passes || echo a goal FAILED)"; \
	exit $$status

# Fits the time model's costs on this machine (benchmarks/calibrate.py) and writes
# the table every new mesh loads ($MPITENSOR_TIME_MODEL or ~/.cache/mpitensor/):
# first the link ranks 0 and 1 share (shared memory on one node), then the network
# class over TCP (--mca btl self,tcp), each run keeping the other's entry. It
# times, so run it on a quiet machine; CALIBRATE_ARGS="--max-bytes 64KiB --reps 2"
# for a smoke run.
CALIBRATE_ARGS ?=
calibrate: install
	$(MPIRUN) 2 $(PY) benchmarks/calibrate.py $(CALIBRATE_ARGS)
	$(MPIRUN) 2 --mca btl self,tcp $(PY) benchmarks/calibrate.py --link net \
	  --mca-note "btl self,tcp" $(CALIBRATE_ARGS)

# Whether the time model ranks candidate plans as they measure
# (benchmarks/plan_ranking.py): every 1-D transition and (2,2) pair at 4 ranks, over
# shared memory and then over TCP, each printing its mismatches and a summary; the
# JSON goes to benchmarks/results/CPU/ and its summary into docs/performance.md.
# It times: run it on a quiet machine. PLAN_RANKING_ARGS="--sizes 1KiB --reps 3"
# for a smoke run; `plan_ranking.py --replay FILE [--table T]` ranks a run's stored
# times under another model without timing again.
PLAN_RANKING_ARGS ?=
# The same across two hosts simulated on this machine (tests/multinode/run.sh bench;
# root and namespaces, as test-multinode; not part of make test): each host's link
# limited to BENCH_NET_RATE, the time model fitted there (shared memory on one host,
# the network between two), then plan_ranking.py --link hosts on 2 hosts x 2 ranks,
# which also times the plan a node-blind planner would run. It times: run it on a
# quiet machine.
BENCH_NET_RATE ?= 10gbit
bench-multinode: install
	MT_NET_RATE=$(BENCH_NET_RATE) tests/multinode/run.sh bench $(PLAN_RANKING_ARGS)
	$(PY) benchmarks/tables.py

plan-ranking: install
	$(MPIRUN) 4 $(PY) benchmarks/plan_ranking.py --link shm $(PLAN_RANKING_ARGS)
	$(MPIRUN) 4 --mca btl self,tcp $(PY) benchmarks/plan_ranking.py --link net --label tcp \
	  $(PLAN_RANKING_ARGS)
	$(PY) benchmarks/tables.py

clean:
	rm -rf build $(VENV) $(ASAN_VENV)
