# Thin wrapper over CMake so the usual verbs work: make, make run,
# make test, make test-asan, make install. Each runs scripts/deps.sh first (a
# quick no-op when every package is present), so a fresh Debian 12 machine
# needs nothing else: `make run` only what the SQLite path needs, `make test`
# everything the whole suite runs (deps.sh --all: PostgreSQL, MariaDB,
# promtool, the packaging tools).
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CTEST_ARGS ?=

PREFIX     ?= /usr/local
DESTDIR    ?=
LISTEN     ?= 127.0.0.1:8080
DB         ?= sqlite:var/idem.db

FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=
FUZZ_FLAGS   := -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all \
		-fno-omit-frame-pointer

.PHONY: all deps deps-all build run test test-asan test-long fuzz install deb bench clean format

all: build

deps:
	@scripts/deps.sh

deps-all:
	@scripts/deps.sh --all

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# Start idemd on the embedded default. On an empty database, first create a
# demo merchant and the mock channel and print a curl example that works.
run: build
	@mkdir -p var
	@$(BUILD)/idemctl --db $(DB) demo http://$(LISTEN)
	$(BUILD)/idemd --listen $(LISTEN) --db $(DB)

test: deps-all build
	scripts/run-tests.sh $(BUILD) $(CTEST_ARGS)

# The long fault suite (tests/fault, docs/reliability.md): LONG_ROUNDS (200)
# rounds of each case, one case at a time: kill -9 of idemd per backend, the
# database server crashed / frozen (PostgreSQL, MariaDB), injected I/O
# faults on SQLite; then the summary table. About 45-60 minutes.
LONG_ROUNDS ?= 200
test-long: deps-all build
	@rm -f $(BUILD)/long-results.tsv
	IDEM_CRASH_ROUNDS=$(LONG_ROUNDS) IDEM_IOFAULT_ROUNDS=$(LONG_ROUNDS) \
		IDEM_DBCRASH_ROUNDS=$(LONG_ROUNDS) \
		IDEM_RESULTS_FILE=$(abspath $(BUILD))/long-results.tsv \
		scripts/run-tests.sh $(BUILD) -L 'crash|iofault' -j 1 $(CTEST_ARGS); rc=$$?; \
		python3 tests/fault/summary.py $(BUILD)/long-results.tsv $$rc; exit $$rc

# The benchmark (bench/run.sh, about 6 minutes): rewrites the table in
# docs/benchmarks.md. Needs the database servers of scripts/deps.sh --all.
bench: build
	bench/run.sh $(BUILD)

$(ASAN_BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DIDEM_SANITIZE=ON

test-asan: deps-all $(ASAN_BUILD)/CMakeCache.txt
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
		UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		scripts/run-tests.sh $(ASAN_BUILD) $(CTEST_ARGS)

# The libFuzzer targets of tests/fuzz (clang, the whole library instrumented),
# each run for FUZZ_SECONDS from its seed corpus (tests/fuzz/run.sh). make
# test only replays the corpus (ctest -L fuzz).
$(FUZZ_BUILD)/CMakeCache.txt: | deps-all
	CC=clang cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIDEM_FUZZ=ON \
		-DCMAKE_C_FLAGS="$(FUZZ_FLAGS)"

fuzz: deps-all $(FUZZ_BUILD)/CMakeCache.txt
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target \
		$(addprefix fuzz_,$(or $(FUZZ_TARGETS),key request fingerprint recon signature store_url http))
	tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# Installs idemd, idemctl, libidem (shared + static), the headers and idem.pc
# under PREFIX (DESTDIR for staging).
install: build
	DESTDIR=$(DESTDIR) cmake --install $(BUILD) --prefix $(PREFIX)

# The Debian packages (debian/), built in a scratch copy: $(BUILD)/deb/*.deb.
deb:
	@scripts/deps.sh --pkg
	scripts/build-deb.sh $(BUILD)/deb

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
