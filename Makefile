# keel -- the two commands of the README, and a few more for developers.
#
#   make run    install missing Debian packages, configure, build keel-world and
#               keel-wal only (the build's output goes to $(BUILD)/run-build.log;
#               its tail is shown when it fails), run the demo world
#   make test   the same set-up, build everything, then the whole test suite
#
# Developer targets: build, test-asan (ASan+UBSan), test-tsan (TSan, thread
# suites), bench (Release build; BENCH_ARGS="systems --json"), fuzz
# (libFuzzer targets of tests/fuzz for FUZZ_SECONDS each; needs the Debian
# packages clang and libclang-rt-dev, docs/testing.md), install (cmake
# --install of the build into PREFIX, default /usr/local), clean.
# WERROR=ON turns warnings into errors (CI does).

BUILD      ?= build
BUILD_TYPE ?= RelWithDebInfo
WERROR     ?= OFF
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
RUN_ARGS   ?=
BENCH_ARGS ?=
CTEST_ARGS ?=
FUZZ_SECONDS ?= 60
PREFIX     ?= /usr/local

# Debian packages the build and the tests need (groff-base: the man pages'
# test renders them with groff).
DEB_PACKAGES := build-essential cmake pkg-config liblmdb-dev lmdb-utils liburcu-dev libzstd-dev check groff-base \
                libmicrohttpd-dev libnats-dev
# ... and what only the tests run: promtool (in prometheus) and curl check
# keel-world --metrics; nats-server runs the replication tests' JetStream
# servers. The test targets pass them on to deps.
TEST_DEB_PACKAGES := prometheus curl nats-server
test test-asan test-tsan: DEPS_EXTRA := $(TEST_DEB_PACKAGES)

.PHONY: all deps build run test test-asan test-tsan bench fuzz install clean

all: build

# Install what is missing: directly as root, through sudo when it works
# without a password, otherwise say exactly what to run.
deps:
	@missing=""; \
	for p in $(DEB_PACKAGES) $(DEPS_EXTRA); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "keel: missing Debian packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; \
	  elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; \
	  else echo "keel: cannot install as $$(id -un); run: sudo apt-get install -y$$missing" >&2; exit 1; fi; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  $$SUDO apt-get install -y -q $$missing >/dev/null 2>&1 || \
	  { $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q $$missing; } || \
	  { echo "keel: apt-get failed; install by hand:$$missing" >&2; exit 1; }; \
	fi

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DKEEL_WERROR=$(WERROR)

build: deps $(BUILD)/CMakeCache.txt
	cmake -S . -B $(BUILD) -DKEEL_WERROR=$(WERROR) >/dev/null
	cmake --build $(BUILD) -j$(JOBS)

# The demo needs two binaries, not the tests, benchmarks and fuzz tools.
run: deps
	@mkdir -p $(BUILD)
	@echo "keel: configuring and building keel-world and keel-wal ($(BUILD)/run-build.log)"
	@{ { [ -f $(BUILD)/CMakeCache.txt ] || cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE); } && \
	   cmake -S . -B $(BUILD) -DKEEL_WERROR=$(WERROR) && \
	   cmake --build $(BUILD) -j$(JOBS) --target keel-world keel-wal; } >$(BUILD)/run-build.log 2>&1 || \
	  { tail -n 30 $(BUILD)/run-build.log; echo "keel: the build failed (all of it: $(BUILD)/run-build.log)" >&2; exit 1; }
	$(BUILD)/tools/keel-world $(RUN_ARGS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) $(CTEST_ARGS)

# Headers, libkeel.so + libkeel.a, keel.pc, the CMake package, the tools and
# the man pages under PREFIX (README, "Install and link").
install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

# Sanitizer builds live in their own directories.
test-asan: deps
	cmake -S . -B $(BUILD)-asan -DCMAKE_BUILD_TYPE=Debug -DKEEL_SANITIZE=address -DKEEL_WERROR=$(WERROR)
	cmake --build $(BUILD)-asan -j$(JOBS)
	cd $(BUILD)-asan && ASAN_OPTIONS=detect_leaks=1:detect_stack_use_after_return=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j$(JOBS) $(CTEST_ARGS)

test-tsan: deps
	cmake -S . -B $(BUILD)-tsan -DCMAKE_BUILD_TYPE=Debug -DKEEL_SANITIZE=thread -DKEEL_WERROR=$(WERROR)
	cmake --build $(BUILD)-tsan -j$(JOBS)
	cd $(BUILD)-tsan && ctest --output-on-failure -j$(JOBS) -L threads $(CTEST_ARGS)

# Benchmarks run from a Release build of their own.
bench: deps
	cmake -S . -B $(BUILD)-release -DCMAKE_BUILD_TYPE=Release -DKEEL_WERROR=$(WERROR) -DKEEL_BUILD_TESTS=OFF
	cmake --build $(BUILD)-release -j$(JOBS) --target keel-bench
	./$(BUILD)-release/tools/keel-bench $(BENCH_ARGS)

# Fuzzing: a clang build of its own (libFuzzer + ASan + UBSan), each
# target run for FUZZ_SECONDS on a copy of its corpus; fails on any finding.
fuzz: deps
	@command -v clang >/dev/null || { echo "keel: make fuzz needs clang: apt-get install -y clang libclang-rt-dev" >&2; exit 1; }
	CC=clang cmake -S . -B $(BUILD)-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKEEL_FUZZ=ON -DKEEL_BUILD_TESTS=OFF -DKEEL_WERROR=$(WERROR)
	cmake --build $(BUILD)-fuzz -j$(JOBS) --target fuzz_record fuzz_reader
	tests/fuzz/run-fuzz.sh $(BUILD)-fuzz $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-tsan $(BUILD)-release $(BUILD)-fuzz
