# hotkern build. `make` builds the libraries, the CLI and the tests; `make test`
# runs every suite (GPU suites SKIP without a device); `make demo` runs the demo.
# Both top-level commands install missing Debian packages first (scripts/deps.sh).

# Parallel by default: a make started by hand with no -j runs a job per core.
# A sub-make joins its parent's jobserver and adds nothing. GNU make 4.3 does
# not show the -j of its own command line to the makefile (4.4 puts it in
# MAKEFLAGS), hence the look at make's command line in /proc.
ifeq ($(MAKELEVEL),0)
HK_JOBS_GIVEN := $(shell { printf ' %s ' '$(filter -%,$(MAKEFLAGS))' "$$MAKEFLAGS"; \
                   tr '\0' ' ' </proc/$$PPID/cmdline; } 2>/dev/null | \
                   grep -Eq -- ' (-[a-zA-Z]*j|--jobs)' && echo 1)
ifeq ($(HK_JOBS_GIVEN),)
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 1)
endif
endif

# `make clean build` (any goals with clean) makes each goal in turn, each in
# parallel: clean must not remove what a build in parallel with it writes.
ifneq ($(and $(filter clean,$(MAKECMDGOALS)),$(filter-out clean,$(MAKECMDGOALS))),)
.PHONY: $(MAKECMDGOALS) hk-goals-in-turn
$(MAKECMDGOALS): hk-goals-in-turn
	@:
hk-goals-in-turn:
	@set -e; for g in $(MAKECMDGOALS); do $(MAKE) --no-print-directory $$g; done
else

# One short line a step (`  CC  build/obj/loader/gate.o`); `make V=1` prints
# the commands instead, as `make -n` does; `make -s` prints neither.
V        ?= 0
ifneq ($(V)$(findstring n,$(firstword -$(MAKEFLAGS))),0)
Q        :=
say       =
else ifneq ($(findstring s,$(firstword -$(MAKEFLAGS))),)
Q        := @
say       = @
else
Q        := @
say       = @printf '  %-4s %s\n' '$(1)' '$(2)';
endif

CUDA     ?= /usr/local/cuda
PREFIX   ?= /usr/local
DESTDIR  ?=
BUILD    ?= build
CC       ?= cc
# Where `make install` puts each part (DESTDIR stages them all): the helper
# programs the library starts go to LIBEXECDIR/hotkern, the man pages to
# MANDIR/man1 and man3. The pkg-config files and the CMake package say where
# the others went.
BINDIR     ?= $(PREFIX)/bin
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
LIBEXECDIR ?= $(PREFIX)/libexec
MANDIR     ?= $(PREFIX)/share/man
# Two libraries: libhotkern (engine, builds, watcher) needs the CUDA toolkit's
# NVRTC and nvJitLink only; libhotkern-net (releases, endpoint, puller) adds the
# network packages and links libhotkern.
CORE_PKGS := libsodium
NET_ONLY_PKGS := libcurl libmicrohttpd libcjson
NET_PKGS := $(NET_ONLY_PKGS) $(CORE_PKGS)
# NET=1 builds the network library and what needs it: the CLI's network
# commands and the interposition's HOTKERN_ENDPOINT and HOTKERN_ORIGIN. NET=0
# builds and installs the engine alone, with none of the network packages'
# -dev files on the machine. Unset, it is 1 where pkg-config finds them all.
# The CLI needs cJSON either way (its --json output): without it, NET=0
# leaves the CLI out. The tests, benchmarks, demo and examples need NET=1.
ifeq ($(origin NET),undefined)
NET := $(shell pkg-config --exists $(NET_ONLY_PKGS) 2>/dev/null && echo 1 || echo 0)
NET_WHY = pkg-config lacks$(shell for p in $(NET_ONLY_PKGS); do \
             pkg-config --exists $$p 2>/dev/null || printf ' %s' $$p; done)
else
NET_WHY := as asked
NET_OFF_ASKED := $(filter 0,$(NET))
endif
ifeq ($(filter 0 1,$(NET)),)
$(error NET is 0 (the engine alone) or 1 (and the network library), not '$(NET)')
endif
# The goals that install the packages first (deps) and then build in a
# sub-make: there NET is decided again, after deps, and said if it is 0; the
# make that runs deps says nothing of a NET found before it.
DEPS_GOALS := deps test test-cpu sanitize tsan demo demo-tour demo-nvcc bench abi-check \
              abi-baseline lint
NET_SAY  := $(if $(filter $(DEPS_GOALS),$(MAKECMDGOALS)),,1)
ifeq ($(NET),1)
CLI_ON   := 1
else
CLI_ON   := $(shell pkg-config --exists libcjson 2>/dev/null && echo 1)
$(if $(NET_SAY),$(info hotkern: NET=0 ($(NET_WHY)): building the engine without libhotkern-net, the CLI's \
network commands and HOTKERN_ENDPOINT/HOTKERN_ORIGIN$(if $(CLI_ON),,; without the CLI too (it \
needs libcjson))))
endif
PKGS     := $(sort $(CORE_PKGS) $(if $(filter 1,$(NET)),$(NET_PKGS)))
# The version the public header states (HK_VERSION_*), for hotkern.pc; the
# sonames carry its major version (see "ABI" in docs/DESIGN.md).
VERSION  := $(shell awk '/define HK_VERSION_(MAJOR|MINOR|PATCH)/ {printf "%s%s", sep, $$3; sep="."}' \
              include/hotkern/hotkern.h)
MAJOR    := $(firstword $(subst ., ,$(VERSION)))
SONAME   := libhotkern.so.$(MAJOR)
NET_SONAME := libhotkern-net.so.$(MAJOR)

WARN     := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
            -Wpointer-arith -Wformat=2 -Wno-unused-parameter
OPT      ?= -O2 -g
SAN      ?=
# HK_NO_NET: built with NET=0. (The paths compiled in: PATH_OBJ.)
CPPFLAGS := -D_GNU_SOURCE -DHK_BUILDING \
            $(if $(filter 0,$(NET)),-DHK_NO_NET) -Iinclude -I. -I$(CUDA)/include \
            $(shell pkg-config --cflags $(PKGS) 2>/dev/null) $(shell pkg-config --cflags check 2>/dev/null)
CFLAGS   := -std=c11 $(OPT) $(WARN) -fPIC -fvisibility=hidden -pthread $(SAN) $(EXTRA_CFLAGS)
# C++ (CXX, make's default g++): what uses the typed-launch header
# include/hotkern/hotkern.hpp, which is header-only: its suites and example.
CXXWARN  := -Wall -Wextra -Werror -Wshadow -Wpointer-arith -Wformat=2 -Wno-unused-parameter \
            -Wmissing-declarations
CXXFLAGS := -std=c++17 $(OPT) $(CXXWARN) -pthread $(SAN) $(EXTRA_CXXFLAGS)
CORE_LIBS := $(shell pkg-config --libs $(CORE_PKGS) 2>/dev/null) -L$(CUDA)/lib64 \
            -Wl,-rpath,$(CUDA)/lib64 -lnvrtc -lnvJitLink -ldl -lpthread -lm
NET_LIBS := $(if $(filter 1,$(NET)),$(shell pkg-config --libs $(NET_PKGS) 2>/dev/null) -lpthread -lm)
# Programs built here link both static archives (with NET=0, the engine's).
LIBS     := $(NET_LIBS) $(CORE_LIBS)
# A shared library names every library it needs (sanitizer runtimes resolve at run time).
NO_UNDEF := $(if $(SAN),,-Wl,--no-undefined)
CHECK_LIBS := $(shell pkg-config --libs check 2>/dev/null)

# util/ is compiled into both libraries, hidden in each (util/util.h).
UTIL_SRC := $(sort $(wildcard util/*.c))
UTIL_OBJ := $(UTIL_SRC:%.c=$(BUILD)/obj/%.o)
LIB_SRC  := $(sort $(filter-out ptx/helper.c,$(wildcard base/*.c loader/*.c ptx/*.c watch/*.c)) $(filter-out canary/helper.c,$(wildcard canary/*.c)))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o) $(UTIL_OBJ)
NET_SRC  := $(sort $(wildcard net/*.c))
NET_OBJ  := $(NET_SRC:%.c=$(BUILD)/obj/%.o) $(UTIL_OBJ)
# The CLI; with NET=0 without its network commands (cli/main.c says they are
# not built), linking the engine and cJSON only.
CLI_NET_SRC := cli/buildfor.c cli/http.c cli/keys_cmd.c cli/net_cmds.c cli/rollout.c cli/rollout_cmd.c \
               cli/gate.c cli/prom.c cli/watch.c cli/push_fleet.c
CLI_SRC  := $(sort $(filter-out $(if $(filter 0,$(NET)),$(CLI_NET_SRC)),$(wildcard cli/*.c)))
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
CLI_LIBS := $(if $(filter 1,$(NET)),$(LIBS),$(shell pkg-config --libs libcjson 2>/dev/null) $(CORE_LIBS))
TSUP_SRC := $(sort $(filter-out tests/cpu_% tests/gpu_%,$(wildcard tests/*.c)))
TSUP_OBJ := $(TSUP_SRC:%.c=$(BUILD)/obj/%.o)
TEST_SRC := $(sort $(wildcard tests/cpu_*.c tests/gpu_*.c))
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
# A CPU suite's own files: tests/cpu_NAME.c, and tests/NAME/*.c when that
# folder exists (not the folders of other uses: cpp, stub, fuzz, programs).
# $(call suite_obj,cpu_NAME): the objects of the folder's.
SUITE_DIR_NOT := cpu_cpp cpu_stub cpu_fuzz cpu_programs
suite_obj = $(if $(filter-out $(SUITE_DIR_NOT),$(filter cpu_%,$(1))),$(patsubst \
              %.c,$(BUILD)/obj/%.o,$(sort $(wildcard tests/$(patsubst cpu_%,%,$(1))/*.c))))
CPU_SUITES := $(patsubst tests/%.c,%,$(filter tests/cpu_%,$(TEST_SRC)))
# C++ suites (tests/cpu_*.cc), each built twice: with exceptions, and with
# -fno-exceptions as BUILD/tests/NAME_noexcept (hotkern.hpp's two error
# models), linked with tests/cpp/'s C support.
CXX_TEST_SRC := $(sort $(wildcard tests/cpu_*.cc))
CXX_TEST_BIN := $(CXX_TEST_SRC:tests/%.cc=$(BUILD)/tests/%) \
                $(CXX_TEST_SRC:tests/%.cc=$(BUILD)/tests/%_noexcept)
CXX_TSUP_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(sort $(wildcard tests/cpp/*.c)))
BENCH_SRC := $(sort $(wildcard bench/bench_*.c))
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
BSUP_SRC := $(sort $(filter-out bench/bench_%,$(wildcard bench/*.c)))
BSUP_OBJ := $(BSUP_SRC:%.c=$(BUILD)/obj/%.o)
DEMO_SRC := $(sort $(wildcard demo/*.c))
DEMO_BIN := $(if $(DEMO_SRC),$(BUILD)/bin/hotkern-demo)

STUB_CUDA := $(BUILD)/stub/libcuda-stub.so
# The fake driver as a loadable libcuda (HK_LIBCUDA=), for CPU-only runs of
# any hotkern program; installed for applications' CI.
FAKE_CUDA := $(BUILD)/lib/libhotkern-fakecuda.so
# A misbehaving canary helper for tests/cpu_canary.c.
BAD_CANARY := $(BUILD)/stub/hotkern-canary-bad
# A stand-in compute-sanitizer for tests/cpu_canary.c's memcheck tests.
FAKE_SAN := $(BUILD)/stub/fake-compute-sanitizer
# The metadata parsers (ptx/meta.h), which the fake driver and the fuzz targets
# build on their own.
META_SRC := ptx/detect.c ptx/meta.c ptx/meta_base.c ptx/meta_elf.c ptx/meta_ptx.c
FAKE_OBJ := $(BUILD)/obj/tests/stub/fakecuda_lib.o $(BUILD)/obj/tests/fakecuda.o \
            $(META_SRC:%.c=$(BUILD)/obj/%.o)
STATIC   := $(BUILD)/lib/libhotkern.a
SHARED   := $(BUILD)/lib/$(SONAME)
NET_STATIC := $(BUILD)/lib/libhotkern-net.a
NET_SHARED := $(BUILD)/lib/$(NET_SONAME)
# What programs link, in link order: the network library before the engine.
ARCHIVES := $(if $(filter 1,$(NET)),$(NET_STATIC)) $(STATIC)
CLI      := $(BUILD)/bin/hotkern
# Example programs (examples/), built as a program outside the tree is: the
# public headers only (no -I., no HK_BUILDING) and the shared libraries with
# the flags hotkern.pc and hotkern-net.pc give; each links only the hotkern
# library it needs (receive_pushes the network one), plus the CUDA runtime.
EX_SRC   := $(sort $(wildcard examples/*.c))
EX_BIN   := $(EX_SRC:examples/%.c=$(BUILD)/examples/%)
EX_CXX_SRC := $(sort $(wildcard examples/*.cpp))
EX_CXX_BIN := $(EX_CXX_SRC:examples/%.cpp=$(BUILD)/examples/%)
EX_NET   := $(BUILD)/examples/receive_pushes
EX_CFLAGS := -std=c11 $(OPT) $(WARN) -pthread $(SAN) -Iinclude -I$(CUDA)/include
EX_CXXFLAGS := -std=c++17 $(OPT) $(CXXWARN) -pthread $(SAN) -Iinclude -I$(CUDA)/include
EX_LIBS  := -L$(BUILD)/lib -Wl,-rpath,'$$ORIGIN/../lib' -L$(CUDA)/lib64 -Wl,-rpath,$(CUDA)/lib64 \
            -lcudart

# The <<<>>> interposition (interpose/): its core, and the two ways in: a
# library for LD_PRELOAD (programs linked with -cudart shared) and an archive
# for link-time --wrap (nvcc's default static cudart). WRAP_LDFLAGS is what
# such a program links with (hotkern-wrap.pc's wrap_ldflags for gcc and
# clang, nvcc_libs for nvcc, which refuses -Wl,; the CMake function).
ICORE_OBJ := $(BUILD)/obj/interpose/route.o $(BUILD)/obj/interpose/demangle.o \
             $(BUILD)/obj/interpose/env.o
ICORE_OBJ += $(BUILD)/obj/interpose/attrs.o
# Automatic safe points: the program's synchronisations (interpose/sync.c).
ICORE_OBJ += $(BUILD)/obj/interpose/sync.o
# The environment's runtime in device 0's primary context (interpose/primary.c).
ICORE_OBJ += $(BUILD)/obj/interpose/primary.o
# The translation units' registration (interpose/tu.c, elfsym.c, fatbin.c).
ICORE_OBJ += $(BUILD)/obj/interpose/tu.o $(BUILD)/obj/interpose/elfsym.o \
             $(BUILD)/obj/interpose/fatbin.o
PRELOAD  := $(BUILD)/lib/libhotkern-preload.so
WRAP     := $(BUILD)/lib/libhotkern-wrap.a
WRAP_SYMS := __cudaLaunchKernel __cudaLaunchKernel_ptsz cudaLaunchKernel cudaLaunchKernel_ptsz \
             cudaLaunchKernelExC cudaLaunchKernelExC_ptsz __cudaRegisterVar cudaMemcpyToSymbol \
             cudaMemcpyToSymbol_ptds cudaMemcpyToSymbolAsync cudaMemcpyToSymbolAsync_ptsz \
             cudaMemcpyFromSymbol cudaMemcpyFromSymbol_ptds cudaMemcpyFromSymbolAsync \
             cudaMemcpyFromSymbolAsync_ptsz cudaGetSymbolAddress
# Per-function settings, cooperative launches, the queries of a kernel's fit.
WRAP_SYMS += cudaLaunchCooperativeKernel cudaLaunchCooperativeKernel_ptsz cudaFuncSetAttribute \
             cudaFuncSetCacheConfig cudaKernelSetAttributeForDevice cudaFuncGetAttributes \
             cudaOccupancyMaxActiveBlocksPerMultiprocessor \
             cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags
# Automatic safe points (interpose/sync.c, entries.h's HKI_SYNC_ENTRIES).
WRAP_SYMS += cudaDeviceSynchronize cudaStreamSynchronize cudaStreamSynchronize_ptsz \
             cudaStreamQuery cudaStreamQuery_ptsz cudaEventSynchronize cudaEventQuery \
             cudaMemcpy cudaMemcpy_ptds cudaStreamDestroy
# The translation units' registration (interpose/tu.c).
WRAP_SYMS += __cudaRegisterFatBinary __cudaRegisterFatBinaryEnd __cudaUnregisterFatBinary \
             __cudaRegisterFunction __cudaGetKernel
comma    := ,
WRAP_LDFLAGS := -Wl,$(subst $() ,$(comma),$(addprefix --wrap=,$(WRAP_SYMS)))
WRAP_NVCCFLAGS := -Xlinker $(subst $() ,$(comma),$(addprefix --wrap=,$(WRAP_SYMS)))
# An ordinary nvcc program, built both ways (tests/gpu_interpose.cu).
NVCC     := $(CUDA)/bin/nvcc
NVCC_FLAGS := -O2 -arch=sm_90 -std=c++17 -Iinclude -Xcompiler -Wall,-Wextra,-Werror
NVCC_LIBS := $(filter-out -Wl% -pthread,$(LIBS)) -Xlinker -rpath=$(CUDA)/lib64 -lpthread
# (Not in sanitizer builds: their suites are the CPU ones.)
GPU_INTERPOSE := $(if $(SAN),,$(BUILD)/tests/gpu_interpose_shared $(BUILD)/tests/gpu_interpose_static \
                 $(BUILD)/tests/gpu_interpose_ptsz \
                 $(BUILD)/tests/gpu_interpose_tu_shared $(BUILD)/tests/gpu_interpose_tu_static \
                 $(BUILD)/bench/bench_interpose_shared $(BUILD)/bench/bench_interpose_static \
                 $(BUILD)/examples/existing_program_shared $(BUILD)/examples/existing_program_static \
                 $(BUILD)/bin/particles-shared $(BUILD)/bin/particles-static)
# The frame loop's stall per swap (bench/bench_frame_stall.cu), both ways.
GPU_INTERPOSE += $(if $(SAN),,$(BUILD)/bench/bench_frame_stall_shared \
                 $(BUILD)/bench/bench_frame_stall_static)

# The program shapes of tests/programs/ (its run.sh drives them): small
# multi-file nvcc programs, each linked both ways from the same objects:
# NAME-shared (-cudart shared, for LD_PRELOAD) and NAME-static (--wrap). The
# plugin host is -cudart shared only, with its two dlopen'd plugins: a plugin
# with a static cudart would carry a runtime of its own that the host's
# --wrap flags never reach. Linked without debug information (the engine's),
# as they travel to a GPU machine.
PROG_CASES := two_files dynsmem64k registers template_late cooperative graph threads exit_mid_build
PROG_DIR := $(BUILD)/programs
PROG_BIN := $(if $(SAN),,$(foreach c,$(PROG_CASES),$(PROG_DIR)/$(c)-shared $(PROG_DIR)/$(c)-static) \
              $(PROG_DIR)/plugins-shared $(PROG_DIR)/libplug_a.so $(PROG_DIR)/libplug_b.so)
prog_obj = $(patsubst tests/programs/%.cu,$(BUILD)/obj/tests/programs/%.o,$(sort $(wildcard tests/programs/$(1)/*.cu)))

# An ordinary nvcc program that ends while hotkern's first build may be in
# flight (tests/cpu_exit.c, tests/exit-stress.sh), built -cudart shared (for
# LD_PRELOAD), with the --wrap flags, and plain (static cudart, no hotkern:
# tests/cpu_setup.c). Outside BUILD/tests: not a suite.
EXIT_APPS := $(if $(SAN),,$(BUILD)/stub/exit_app_shared $(BUILD)/stub/exit_app_static \
             $(BUILD)/stub/exit_app_plain)

# The canary helper process (canary/helper.c), started by libhotkern.
CANARY   := $(BUILD)/bin/hotkern-canary
# The build helper process (ptx/helper.c), started by libhotkern when a
# runtime isolates its builds (options.build_isolated).
BUILDER  := $(BUILD)/bin/hotkern-build

.PHONY: all build deps test test-cpu test-gpu test-gpu-prebuilt test-examples sanitize tsan demo \
        demo-tour demo-nvcc bench bench-prebuilt install uninstall lint man format clean fuzz \
        fuzz-build abi-check abi-baseline lint-objects

all: build

# Keep the objects of test and bench programs (pattern-rule intermediates).
.SECONDARY:

# What `make install` installs (with NET=0, the engine's part of it), and
# the rest of `make build`: tests, benchmarks, demo and examples.
INSTALLED_BUILT := $(STATIC) $(SHARED) $(PRELOAD) $(WRAP) $(CANARY) $(BUILDER) $(FAKE_CUDA) \
                   $(if $(CLI_ON),$(CLI)) $(if $(filter 1,$(NET)),$(NET_STATIC) $(NET_SHARED))
DEV_BUILT := $(TEST_BIN) $(GPU_INTERPOSE) $(PROG_BIN) $(EXIT_APPS) $(STUB_CUDA) $(BAD_CANARY) \
             $(FAKE_SAN) $(BENCH_BIN) \
             $(DEMO_BIN) $(EX_BIN) $(CXX_TEST_BIN) $(EX_CXX_BIN)

# Internal targets assume the dependencies exist; the public ones install them.
build: $(INSTALLED_BUILT) $(if $(filter 1,$(NET)),$(DEV_BUILT))

# What needs the network library's build (the suites link it) is refused
# when NET=0 was asked for. Found missing instead, NET is found again by the
# sub-make, once deps has installed the packages.
NET_GOALS := test test-cpu test-examples sanitize tsan demo demo-tour demo-nvcc bench abi-check \
             abi-baseline
ifneq ($(NET_OFF_ASKED),)
ifneq ($(filter $(NET_GOALS),$(MAKECMDGOALS)),)
$(error make $(filter $(NET_GOALS),$(MAKECMDGOALS)) needs the network library: run it without NET=0)
endif
endif

deps:
	@sh scripts/deps.sh

# tests/all.sh runs the parts (the suites, the CPU ones HK_TEST_JOBS at a
# time; hotkern.hpp's misuses, which must not compile; the examples; the
# program shapes; the ABI, its report in BUILD/abi.log; that lint's checks of
# the sources fail on violations, tests/lint-check.sh), each to its end, and
# prints the verdict of them all last.
RUN_TESTS = CXX='$(CXX)' CUDA='$(CUDA)' HK_TEST_VERDICT='make $@' sh tests/all.sh $(BUILD)
test: deps
	@$(MAKE) --no-print-directory build
	@$(RUN_TESTS)

test-cpu: deps
	@$(MAKE) --no-print-directory build
	@$(RUN_TESTS) cpu compile lint-check

# For the GPU machine: runs what is already built, never recompiles.
test-gpu-prebuilt:
	@$(RUN_TESTS) gpu examples programs

# The example programs on what is built (each SKIPs without a device).
test-examples:
	@$(MAKE) --no-print-directory build
	@sh tests/run-examples.sh $(BUILD)

sanitize: deps
	@$(MAKE) --no-print-directory BUILD=build-san OPT="-O1 -g -fno-omit-frame-pointer" \
	  SAN="-fsanitize=address,undefined -fno-sanitize-recover=all" build
	@ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 sh tests/run.sh build-san cpu

tsan: deps
	@$(MAKE) --no-print-directory BUILD=build-tsan OPT="-O1 -g" SAN="-fsanitize=thread" build
	@TSAN_OPTIONS="halt_on_error=1 suppressions=$(CURDIR)/tests/tsan.supp" sh tests/run.sh build-tsan cpu

# The demos build what they run, not the tests and benchmarks: the demo, the
# CLI it runs and the helpers the library starts; the nvcc tour's two builds
# of its program and the preload library. DEMO_ARGS: more of hotkern-demo's
# options (`make demo DEMO_ARGS="--seconds 10"`).
DEMO_BUILT := $(DEMO_BIN) $(CLI) $(CANARY) $(BUILDER)
DEMO_NVCC_BUILT := $(BUILD)/bin/particles-shared $(BUILD)/bin/particles-static $(PRELOAD) $(CLI) \
                   $(CANARY) $(BUILDER)
demo: deps
	@$(MAKE) --no-print-directory $(DEMO_BUILT)
	@sh demo/run.sh $(BUILD) $(DEMO_ARGS)

demo-tour: deps
	@$(MAKE) --no-print-directory $(DEMO_BUILT)
	@sh demo/run.sh $(BUILD) --tour $(DEMO_ARGS)

# The existing-program demo: an nvcc program with <<<>>> launches, unchanged,
# edited while it runs (demo/nvcc/).
demo-nvcc: deps
	@$(MAKE) --no-print-directory $(DEMO_NVCC_BUILT)
	@sh demo/nvcc/tour.sh $(BUILD)

bench: deps
	@$(MAKE) --no-print-directory build
	@sh bench/run.sh $(BUILD)

bench-prebuilt:
	@sh bench/run.sh $(BUILD)

# The shared libraries' ABI against the committed baselines abi/*.abi
# (libabigail): fails on an incompatible change; added functions and fields
# appended to sized structures pass (docs/DESIGN.md, "ABI"). `make test` runs
# it. abi-baseline rewrites the baselines on purpose, after showing what
# changed: with each release, and with a major version bump.
abi-check: deps
	@$(MAKE) --no-print-directory $(SHARED) $(NET_SHARED)
	@sh scripts/abi-check.sh $(BUILD)

abi-baseline: deps
	@$(MAKE) --no-print-directory $(SHARED) $(NET_SHARED)
	@sh scripts/abi-check.sh $(BUILD) --update

# What objects are built with that no prerequisite shows, each in a file
# rewritten only when it changes, so that a change rebuilds what uses it:
# BUILD/config (NET) for every object, BUILD/config-paths (the paths compiled
# in) for PATH_OBJ alone. (Not by `make -n`, which changes nothing.)
CONFIG   := $(BUILD)/config
CONFIG_TEXT := NET=$(NET)
PATHS_CONFIG := $(BUILD)/config-paths
PATHS_CONFIG_TEXT := PREFIX=$(PREFIX) LIBEXECDIR=$(LIBEXECDIR)
write_config = $(shell mkdir -p '$(dir $(1))' && [ "$$(cat '$(1)' 2>/dev/null)" = '$(2)' ] || \
                 printf '%s\n' '$(2)' >'$(1)')
ifeq ($(findstring n,$(firstword -$(MAKEFLAGS))),)
$(call write_config,$(CONFIG),$(CONFIG_TEXT))
$(call write_config,$(PATHS_CONFIG),$(PATHS_CONFIG_TEXT))
endif
$(CONFIG):
	@mkdir -p $(dir $@)
	$(Q)printf '%s\n' '$(CONFIG_TEXT)' >$@
$(PATHS_CONFIG):
	@mkdir -p $(dir $@)
	$(Q)printf '%s\n' '$(PATHS_CONFIG_TEXT)' >$@

# HK_PREFIX and HK_LIBEXECDIR, in the objects that use them alone: where the
# library looks for its helper programs last (loader/canary.c), and what
# tests/cpu_install.c installs with. `make install PREFIX=...` rebuilds these
# (and relinks), not the rest.
PATH_OBJ := $(BUILD)/obj/loader/canary.o $(BUILD)/obj/tests/cpu_install.o $(call suite_obj,cpu_install)
$(PATH_OBJ): $(PATHS_CONFIG)
$(PATH_OBJ): CPPFLAGS += -DHK_PREFIX='"$(PREFIX)"' -DHK_LIBEXECDIR='"$(LIBEXECDIR)"'

$(BUILD)/obj/%.o: %.c $(CONFIG)
	@mkdir -p $(dir $@)
	$(call say,CC,$@)$(CC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.o: %.cc $(CONFIG)
	@mkdir -p $(dir $@)
	$(call say,CXX,$@)$(CXX) $(CPPFLAGS) $(CXXFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%_noexcept.o: %.cc $(CONFIG)
	@mkdir -p $(dir $@)
	$(call say,CXX,$@)$(CXX) $(CPPFLAGS) $(CXXFLAGS) -fno-exceptions -MMD -MP -c $< -o $@

$(STATIC): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(call say,AR,$@)rm -f $@ && ar rcs $@ $^

# The shared libraries link their objects as one, whose functions carry
# their version nodes (scripts/symver.sh, pkg/*.map).
$(SHARED): $(LIB_OBJ) pkg/hotkern.map scripts/symver.sh
	@mkdir -p $(dir $@)
	$(call say,LD,$@)sh scripts/symver.sh pkg/hotkern.map $(BUILD)/obj/libhotkern.o $(LIB_OBJ)
	$(Q)$(CC) -shared -Wl,-soname,$(SONAME) -Wl,--version-script=pkg/hotkern.map $(NO_UNDEF) $(SAN) \
	  -o $@ $(BUILD)/obj/libhotkern.o $(CORE_LIBS)
	$(Q)ln -sf $(SONAME) $(BUILD)/lib/libhotkern.so

$(NET_STATIC): $(NET_OBJ)
	@mkdir -p $(dir $@)
	$(call say,AR,$@)rm -f $@ && ar rcs $@ $^

$(NET_SHARED): $(NET_OBJ) pkg/hotkern-net.map scripts/symver.sh $(SHARED)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)sh scripts/symver.sh pkg/hotkern-net.map $(BUILD)/obj/libhotkern-net.o $(NET_OBJ)
	$(Q)$(CC) -shared -Wl,-soname,$(NET_SONAME) -Wl,--version-script=pkg/hotkern-net.map $(NO_UNDEF) \
	  -Wl,-rpath,'$$ORIGIN' $(SAN) -o $@ $(BUILD)/obj/libhotkern-net.o -L$(BUILD)/lib -lhotkern \
	  $(NET_LIBS)
	$(Q)ln -sf $(NET_SONAME) $(BUILD)/lib/libhotkern-net.so

$(PRELOAD): $(ICORE_OBJ) $(BUILD)/obj/interpose/preload.o $(ARCHIVES) pkg/hotkern-preload.map
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) -shared -Wl,--version-script=pkg/hotkern-preload.map $(NO_UNDEF) $(SAN) -o $@ \
	  $(ICORE_OBJ) $(BUILD)/obj/interpose/preload.o $(ARCHIVES) $(LIBS) -lstdc++

$(BUILD)/tests/gpu_interpose_shared: tests/gpu_interpose.cu $(PRELOAD) include/hotkern/*.h
	@mkdir -p $(dir $@)
	$(call say,NVCC,$@)$(NVCC) $(NVCC_FLAGS) -DHK_PRELOAD -cudart shared -o $@ $< -L$(BUILD)/lib -lhotkern-preload \
	  -Xlinker -rpath='$$ORIGIN/../lib' -Xlinker -rpath=$(CUDA)/lib64

$(BUILD)/tests/gpu_interpose_static: tests/gpu_interpose.cu $(WRAP) $(ARCHIVES) include/hotkern/*.h
	@mkdir -p $(dir $@)
	$(call say,NVCC,$@)$(NVCC) $(NVCC_FLAGS) -o $@ $< $(WRAP_NVCCFLAGS) $(WRAP) $(ARCHIVES) $(NVCC_LIBS) -lstdc++

$(BUILD)/tests/gpu_interpose_ptsz: tests/gpu_interpose.cu $(WRAP) include/hotkern/*.h
	@mkdir -p $(dir $@)
	$(call say,NVCC,$@)$(NVCC) $(NVCC_FLAGS) --default-stream per-thread -o $@ $< $(WRAP_NVCCFLAGS) $(WRAP) $(NVCC_LIBS) \
	  -lstdc++

# Several files with file-local kernels and variables of the same names.
GPU_TU_SRC := tests/gpu_interpose_tu.cu tests/gpu_tu/a.cu tests/gpu_tu/b.cu
$(BUILD)/tests/gpu_interpose_tu_shared: $(GPU_TU_SRC) $(PRELOAD) include/hotkern/*.h
	@mkdir -p $(dir $@)
	$(call say,NVCC,$@)$(NVCC) $(NVCC_FLAGS) -DHK_PRELOAD -cudart shared -o $@ $(GPU_TU_SRC) -L$(BUILD)/lib \
	  -lhotkern-preload -Xlinker -rpath='$$ORIGIN/../lib' -Xlinker -rpath=$(CUDA)/lib64

$(BUILD)/tests/gpu_interpose_tu_static: $(GPU_TU_SRC) $(WRAP) $(ARCHIVES) include/hotkern/*.h
	@mkdir -p $(dir $@)
	$(call say,NVCC,$@)$(NVCC) $(NVCC_FLAGS) -o $@ $(GPU_TU_SRC) $(WRAP_NVCCFLAGS) $(WRAP) $(ARCHIVES) $(NVCC_LIBS) -lstdc++

$(BUILD)/bench/bench_interpose_shared: bench/bench_interpose.cu $(PRELOAD) include/hotkern/*.h
	@mkdir -p $(dir $@)
	$(call say,NVCC,$@)$(NVCC) $(NVCC_FLAGS) -DHK_PRELOAD -cudart shared -o $@ $< -L$(BUILD)/lib -lhotkern-preload -ldl \
	  -Xlinker -rpath='$$ORIGIN/../lib' -Xlinker -rpath=$(CUDA)/lib64

$(BUILD)/bench/bench_interpose_static: bench/bench_interpose.cu $(WRAP) $(ARCHIVES) include/hotkern/*.h
	@mkdir -p $(dir $@)
	$(call say,NVCC,$@)$(NVCC) $(NVCC_FLAGS) -o $@ $< $(WRAP_NVCCFLAGS) $(WRAP) $(ARCHIVES) $(NVCC_LIBS) -lstdc++

$(BUILD)/bench/bench_frame_stall_shared: bench/bench_frame_stall.cu $(PRELOAD) include/hotkern/*.h
	@mkdir -p $(dir $@)
	$(call say,NVCC,$@)$(NVCC) $(NVCC_FLAGS) -DHK_PRELOAD -cudart shared -o $@ $< -L$(BUILD)/lib -lhotkern-preload -ldl \
	  -Xlinker -rpath='$$ORIGIN/../lib' -Xlinker -rpath=$(CUDA)/lib64

$(BUILD)/bench/bench_frame_stall_static: bench/bench_frame_stall.cu $(WRAP) $(ARCHIVES) include/hotkern/*.h
	@mkdir -p $(dir $@)
	$(call say,NVCC,$@)$(NVCC) $(NVCC_FLAGS) -o $@ $< $(WRAP_NVCCFLAGS) $(WRAP) $(ARCHIVES) $(NVCC_LIBS) -lstdc++

# Self-contained: the interposition reaches into the engine's internals,
# which libhotkern.so does not export, so the archive holds the engine too.
# The program as it is, -cudart shared (the interposition comes with
# LD_PRELOAD at run time) and static cudart linked with the --wrap flags;
# nothing of hotkern in their sources.
$(BUILD)/examples/existing_program_shared: examples/existing_program.cu
	@mkdir -p $(dir $@)
	$(call say,NVCC,$@)$(NVCC) $(NVCC_FLAGS) -cudart shared -o $@ $< -Xlinker -rpath=$(CUDA)/lib64

$(BUILD)/examples/existing_program_static: examples/existing_program.cu $(WRAP)
	@mkdir -p $(dir $@)
	$(call say,NVCC,$@)$(NVCC) $(NVCC_FLAGS) -o $@ $< $(WRAP_NVCCFLAGS) $(WRAP) $(NVCC_LIBS) -lstdc++

$(BUILD)/stub/exit_app_shared: tests/stub/exit_app.cu
	@mkdir -p $(dir $@)
	$(call say,NVCC,$@)$(NVCC) $(NVCC_FLAGS) -cudart shared -o $@ $< -Xlinker -rpath=$(CUDA)/lib64

$(BUILD)/stub/exit_app_static: tests/stub/exit_app.cu $(WRAP)
	@mkdir -p $(dir $@)
	$(call say,NVCC,$@)$(NVCC) $(NVCC_FLAGS) -o $@ $< $(WRAP_NVCCFLAGS) $(WRAP) $(NVCC_LIBS) -lstdc++

$(BUILD)/stub/exit_app_plain: tests/stub/exit_app.cu
	@mkdir -p $(dir $@)
	$(call say,NVCC,$@)$(NVCC) $(NVCC_FLAGS) -o $@ $<

$(BUILD)/bin/particles-shared: demo/nvcc/particles.cu
	@mkdir -p $(dir $@)
	$(call say,NVCC,$@)$(NVCC) $(NVCC_FLAGS) -cudart shared -o $@ $< -Xlinker -rpath=$(CUDA)/lib64

$(BUILD)/bin/particles-static: demo/nvcc/particles.cu $(WRAP)
	@mkdir -p $(dir $@)
	$(call say,NVCC,$@)$(NVCC) $(NVCC_FLAGS) -o $@ $< $(WRAP_NVCCFLAGS) $(WRAP) $(NVCC_LIBS) -lstdc++

$(BUILD)/obj/tests/programs/%.o: tests/programs/%.cu tests/programs/prog.h
	@mkdir -p $(dir $@)
	$(call say,NVCC,$@)$(NVCC) $(NVCC_FLAGS) -c -o $@ $<

define PROG_RULES
$(PROG_DIR)/$(1)-shared: $(call prog_obj,$(1))
	@mkdir -p $$(dir $$@)
	$$(call say,NVCC,$$@)$$(NVCC) $$(NVCC_FLAGS) -cudart shared -o $$@ $$^ -Xlinker -rpath=$$(CUDA)/lib64

$(PROG_DIR)/$(1)-static: $(call prog_obj,$(1)) $$(WRAP)
	@mkdir -p $$(dir $$@)
	$$(call say,NVCC,$$@)$$(NVCC) $$(NVCC_FLAGS) -o $$@ $(call prog_obj,$(1)) $$(WRAP_NVCCFLAGS) $$(WRAP) $$(NVCC_LIBS) -lstdc++ \
	  -Xlinker --strip-debug
endef
$(foreach c,$(PROG_CASES),$(eval $(call PROG_RULES,$(c))))

$(PROG_DIR)/plugins-shared: $(BUILD)/obj/tests/programs/plugins/host.o
	@mkdir -p $(dir $@)
	$(call say,NVCC,$@)$(NVCC) $(NVCC_FLAGS) -cudart shared -o $@ $^ -ldl -Xlinker -rpath=$(CUDA)/lib64

$(PROG_DIR)/lib%.so: tests/programs/plugins/%.cu
	@mkdir -p $(dir $@)
	$(call say,NVCC,$@)$(NVCC) $(NVCC_FLAGS) -Xcompiler -fPIC -shared -cudart shared -o $@ $< -Xlinker -rpath=$(CUDA)/lib64

$(WRAP): $(ICORE_OBJ) $(BUILD)/obj/interpose/wrap.o $(LIB_OBJ) $(if $(filter 1,$(NET)),$(NET_OBJ))
	@mkdir -p $(dir $@)
	$(call say,AR,$@)rm -f $@ && ar rcs $@ $(sort $^)

# libstdc++ for its C++ demangler (__cxa_demangle): check shows C++ kernel
# names demangled beside the mangled ones.
$(CLI): $(CLI_OBJ) $(ARCHIVES)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) $(CFLAGS) -o $@ $(CLI_OBJ) $(ARCHIVES) $(CLI_LIBS) -lstdc++

# With NET=0 cJSON is the CLI's alone.
ifeq ($(NET),0)
$(CLI_OBJ): CPPFLAGS += $(shell pkg-config --cflags libcjson 2>/dev/null)
endif

$(CANARY): $(BUILD)/obj/canary/helper.o $(STATIC)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) $(CFLAGS) -o $@ $< $(STATIC) $(CORE_LIBS)

$(BUILDER): $(BUILD)/obj/ptx/helper.o $(STATIC)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) $(CFLAGS) -o $@ $< $(STATIC) $(CORE_LIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(TSUP_OBJ) $(ARCHIVES)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) $(CFLAGS) -o $@ $< $(call suite_obj,$(@F)) $(TEST_OBJ) $(TSUP_OBJ) $(ARCHIVES) \
	  $(CHECK_LIBS) $(LIBS) $(TEST_LDFLAGS)
# A suite's folder (suite_obj).
$(foreach t,$(CPU_SUITES),$(eval $(BUILD)/tests/$(t): $(call suite_obj,$(t))))

# cpu_interpose drives the interposition's core with the fake driver.
$(BUILD)/tests/cpu_interpose $(BUILD)/tests/cpu_interpose_tu: TEST_OBJ := $(ICORE_OBJ)
$(BUILD)/tests/cpu_interpose $(BUILD)/tests/cpu_interpose_tu: TEST_LDFLAGS := -lstdc++
$(BUILD)/tests/cpu_interpose_fit: TEST_OBJ := $(ICORE_OBJ)
$(BUILD)/tests/cpu_interpose_fit: TEST_LDFLAGS := -lstdc++
# cpu_setup (HOTKERN_*) and cpu_exit too; both run the nvcc programs of
# EXIT_APPS.
$(BUILD)/tests/cpu_setup $(BUILD)/tests/cpu_exit: TEST_OBJ := $(ICORE_OBJ)
$(BUILD)/tests/cpu_setup $(BUILD)/tests/cpu_exit: TEST_LDFLAGS := -lstdc++
# cpu_safepoint drives the automatic safe points (interpose/sync.c) the same way.
$(BUILD)/tests/cpu_safepoint: TEST_OBJ := $(ICORE_OBJ)
$(BUILD)/tests/cpu_safepoint: TEST_LDFLAGS := -lstdc++
# cpu_primary: the environment's runtime in device 0's primary context.
$(BUILD)/tests/cpu_primary: TEST_OBJ := $(ICORE_OBJ)
$(BUILD)/tests/cpu_primary: TEST_LDFLAGS := -lstdc++
# (TEST_OBJ is the link's, not a prerequisite: these are.)
$(BUILD)/tests/cpu_interpose $(BUILD)/tests/cpu_interpose_tu $(BUILD)/tests/cpu_safepoint \
  $(BUILD)/tests/cpu_primary \
  $(BUILD)/tests/cpu_interpose_fit $(BUILD)/tests/cpu_setup $(BUILD)/tests/cpu_exit: $(ICORE_OBJ)

# The C++ suites link with the C++ compiler (a static pattern rule: the C
# suites' rule above must not take them).
$(CXX_TEST_BIN): $(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(CXX_TSUP_OBJ) $(TSUP_OBJ) $(ARCHIVES)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CXX) $(CXXFLAGS) -o $@ $< $(CXX_TSUP_OBJ) $(TSUP_OBJ) $(ARCHIVES) $(CHECK_LIBS) $(LIBS)

# cpu_load steps the wall clock as the library reads it.
$(BUILD)/tests/cpu_load: TEST_LDFLAGS := -Wl,--wrap=clock_gettime

# A stand-in libcuda for tests/cpu_driver.c's binding test (HK_LIBCUDA=); outside
# BUILD/tests, whose every executable tests/run.sh runs as a suite.
$(STUB_CUDA): tests/stub/libcuda.c
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) $(CPPFLAGS) $(CFLAGS) -shared -o $@ $<

$(BAD_CANARY): $(BUILD)/obj/tests/stub/canary_bad.o $(STATIC)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) $(CFLAGS) -o $@ $< $(STATIC) $(CORE_LIBS)

$(FAKE_SAN): $(BUILD)/obj/tests/stub/fake_sanitizer.o
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) $(CFLAGS) -o $@ $<

$(FAKE_CUDA): $(FAKE_OBJ)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) -shared $(NO_UNDEF) $(SAN) -o $@ $(FAKE_OBJ) -lpthread

# GPU suites and benchmarks use the CUDA runtime API as applications do.
$(BUILD)/tests/gpu_%: $(BUILD)/obj/tests/gpu_%.o $(TSUP_OBJ) $(ARCHIVES)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) $(CFLAGS) -o $@ $< $(TSUP_OBJ) $(ARCHIVES) $(CHECK_LIBS) $(LIBS) -lcudart

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(BSUP_OBJ) $(ARCHIVES)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) $(CFLAGS) -o $@ $< $(BSUP_OBJ) $(ARCHIVES) $(LIBS) -lcudart

# bench_save_cpu runs the engine on the tests' fake driver: no GPU needed.
$(BUILD)/bench/bench_save_cpu: $(BUILD)/obj/bench/bench_save_cpu.o $(BUILD)/obj/tests/fakecuda.o \
                               $(BSUP_OBJ) $(ARCHIVES)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) $(CFLAGS) -o $@ $< $(BUILD)/obj/tests/fakecuda.o $(BSUP_OBJ) $(ARCHIVES) $(LIBS) -lcudart

$(BUILD)/examples/%: examples/%.c $(SHARED)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) $(EX_CFLAGS) -o $@ $< $(or $(EX_HOTKERN),-lhotkern) $(EX_LIBS)

$(BUILD)/examples/%: examples/%.cpp $(SHARED) include/hotkern/hotkern.hpp
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CXX) $(EX_CXXFLAGS) -o $@ $< -lhotkern $(EX_LIBS)

$(EX_NET): $(NET_SHARED)
$(EX_NET): EX_HOTKERN := -lhotkern-net -lhotkern

$(BUILD)/bin/hotkern-demo: $(DEMO_SRC:%.c=$(BUILD)/obj/%.o) $(ARCHIVES)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) $(CFLAGS) -o $@ $(filter %.o,$^) $(ARCHIVES) $(LIBS) -lcudart

# `make install`: both libraries, static and shared (with NET=0 the engine's
# alone), the headers, the CLI, the helper programs the library starts (in
# LIBEXECDIR/hotkern), a pkg-config file per library, a CMake package
# (LIBDIR/cmake/hotkern, components core and net) and the man pages
# hotkern(1) and hotkern(3). The package files find the rest from where they
# lie when LIBDIR, INCLUDEDIR and LIBEXECDIR are under PREFIX (a moved or
# DESTDIR-staged tree works), and name a directory outside it as it is.
HELPERDIR := $(LIBEXECDIR)/hotkern
PCDIR    := $(LIBDIR)/pkgconfig
CMAKEDIR := $(LIBDIR)/cmake/hotkern
HEADERS  := $(filter-out $(if $(filter 0,$(NET)),include/hotkern/net.h), \
              $(sort $(wildcard include/hotkern/*.h include/hotkern/*.hpp)))
MAN1     := docs/man/hotkern.1
# hotkern(3), a page per subject and a link page per function and type
# (scripts/man3.sh); with NET=0 without net.h's, as the headers are.
MAN3_DIR := docs/man/man3
MAN3_NET := $(MAN3_DIR)/hotkern-net.3 $(shell grep -l '^\.so man3/hotkern-net\.3$$' $(MAN3_DIR)/*.3)
MAN3     := $(filter-out $(if $(filter 0,$(NET)),$(MAN3_NET)),$(wildcard $(MAN3_DIR)/*.3))
space    := $() $()
# $(call from_prefix,VAR,DIR): VAR/REST for DIR = PREFIX/REST, else DIR.
from_prefix = $(if $(filter $(PREFIX)/%,$(2)),$(1)/$(patsubst $(PREFIX)/%,%,$(2)),$(2))
# From the CMake package's folder up to PREFIX, or PREFIX itself when
# LIBDIR is elsewhere.
CMAKE_UP := $(if $(filter $(PREFIX)/%,$(CMAKEDIR)),$(subst $(space),,$(foreach d,$(subst /, \
              ,$(patsubst $(PREFIX)/%,%,$(CMAKEDIR))),../)),$(PREFIX))
# What a program linking each static archive links besides, as CMake lists.
CORE_LINK := $(shell pkg-config --libs $(CORE_PKGS) 2>/dev/null) $(CUDA)/lib64/libnvrtc.so \
             $(CUDA)/lib64/libnvJitLink.so -ldl -lpthread -lm
NET_LINK := $(NET_LIBS)
WRAP_LINK := $(NET_LINK) $(CORE_LINK) -lstdc++
cmake_list = $(subst $(space),;,$(strip $(1)))
SUBST    := sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@CUDA@|$(CUDA)|g' -e 's|@VERSION@|$(VERSION)|g' \
              -e 's|@MAJOR@|$(MAJOR)|g' -e 's|@WRAP_SYMS@|$(subst $() ,$(comma),$(addprefix --wrap=,$(WRAP_SYMS)))|g' \
              -e 's|@NET_LIBS@|$(strip $(NET_LIBS))|g' \
              -e 's|@PC_LIBDIR@|$(call from_prefix,$${prefix},$(LIBDIR))|g' \
              -e 's|@PC_INCLUDEDIR@|$(call from_prefix,$${prefix},$(INCLUDEDIR))|g' \
              -e 's|@PC_LIBEXECDIR@|$(call from_prefix,$${prefix},$(LIBEXECDIR))|g' \
              -e 's|@CMAKE_UP@|$(CMAKE_UP)|g' \
              -e 's|@CMAKE_LIBDIR@|$(call from_prefix,$${_hotkern_prefix},$(LIBDIR))|g' \
              -e 's|@CMAKE_INCLUDEDIR@|$(call from_prefix,$${_hotkern_prefix},$(INCLUDEDIR))|g' \
              -e 's|@CMAKE_HELPERDIR@|$(call from_prefix,$${_hotkern_prefix},$(HELPERDIR))|g' \
              -e 's|@CORE_LINK@|$(call cmake_list,$(CORE_LINK))|g' \
              -e 's|@NET_LINK@|$(call cmake_list,$(NET_LINK))|g' \
              -e 's|@WRAP_LINK@|$(call cmake_list,$(WRAP_LINK))|g'
PKG_OUT  := $(BUILD)/pkg
PC_FILES := hotkern.pc hotkern-wrap.pc $(if $(filter 1,$(NET)),hotkern-net.pc)
CMAKE_FILES := hotkernConfig.cmake hotkernConfigVersion.cmake
# The pkg-config files as an install writes them, also in `make build`:
# tests/cpu_setup.c checks the variables the documentation names.
PC_BUILT := $(addprefix $(PKG_OUT)/,$(PC_FILES))
build: $(PC_BUILT)
$(PC_BUILT): $(PKG_OUT)/%: pkg/%.in $(CONFIG) $(PATHS_CONFIG) Makefile
	@mkdir -p $(dir $@)
	$(call say,GEN,$@)$(SUBST) $< >$@
install: $(INSTALLED_BUILT)
	$(Q)install -d $(DESTDIR)$(INCLUDEDIR)/hotkern $(DESTDIR)$(LIBDIR) $(DESTDIR)$(PCDIR) \
	  $(DESTDIR)$(CMAKEDIR) $(DESTDIR)$(HELPERDIR) $(DESTDIR)$(MANDIR)/man3 \
	  $(if $(CLI_ON),$(DESTDIR)$(BINDIR) $(DESTDIR)$(MANDIR)/man1)
	$(call say,INST,$(DESTDIR)$(INCLUDEDIR)/hotkern/)install -m 644 $(HEADERS) $(DESTDIR)$(INCLUDEDIR)/hotkern/
	$(call say,INST,$(DESTDIR)$(LIBDIR)/)install -m 644 $(STATIC) $(WRAP) $(if $(filter 1,$(NET)),$(NET_STATIC)) \
	  $(DESTDIR)$(LIBDIR)/
	$(Q)install -m 755 $(SHARED) $(PRELOAD) $(FAKE_CUDA) $(if $(filter 1,$(NET)),$(NET_SHARED)) \
	  $(DESTDIR)$(LIBDIR)/
	$(Q)ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libhotkern.so
	$(Q)$(if $(filter 1,$(NET)),ln -sf $(NET_SONAME) $(DESTDIR)$(LIBDIR)/libhotkern-net.so)
	$(call say,INST,$(DESTDIR)$(HELPERDIR)/)install -m 755 $(CANARY) $(BUILDER) $(DESTDIR)$(HELPERDIR)/
	$(if $(CLI_ON),$(call say,INST,$(DESTDIR)$(BINDIR)/)install -m 755 $(CLI) $(DESTDIR)$(BINDIR)/)
	$(if $(CLI_ON),$(call say,INST,$(DESTDIR)$(MANDIR)/man1/)install -m 644 $(MAN1) $(DESTDIR)$(MANDIR)/man1/)
	$(call say,INST,$(DESTDIR)$(MANDIR)/man3/)install -m 644 $(MAN3) $(DESTDIR)$(MANDIR)/man3/
# (Earlier versions put the helpers in BINDIR.)
	$(Q)rm -f $(DESTDIR)$(BINDIR)/hotkern-canary $(DESTDIR)$(BINDIR)/hotkern-build
# The package files, written where they go (not in BUILD/pkg, which the
# build's own are, and suites read while an install runs).
	$(call say,INST,$(DESTDIR)$(PCDIR)/)$(foreach f,$(PC_FILES),$(SUBST) pkg/$(f).in \
	  >$(DESTDIR)$(PCDIR)/$(f) &&) chmod 644 $(addprefix $(DESTDIR)$(PCDIR)/,$(PC_FILES))
	$(call say,INST,$(DESTDIR)$(CMAKEDIR)/)$(foreach f,$(CMAKE_FILES),$(SUBST) pkg/$(f).in \
	  >$(DESTDIR)$(CMAKEDIR)/$(f) &&) chmod 644 $(addprefix $(DESTDIR)$(CMAKEDIR)/,$(CMAKE_FILES))

# Every file an install of either kind (NET=0 or 1) puts there, and the
# helpers where earlier versions put them; then the folders that are
# hotkern's own, when nothing else is left in them. Run it with the
# PREFIX, LIBDIR ... and DESTDIR of the install.
INSTALLED := $(addprefix $(INCLUDEDIR)/hotkern/,$(notdir $(wildcard include/hotkern/*.h \
               include/hotkern/*.hpp))) \
             $(addprefix $(LIBDIR)/,libhotkern.a libhotkern.so $(SONAME) libhotkern-net.a \
               libhotkern-net.so $(NET_SONAME) libhotkern-wrap.a libhotkern-preload.so \
               libhotkern-fakecuda.so) \
             $(addprefix $(PCDIR)/,hotkern.pc hotkern-net.pc hotkern-wrap.pc) \
             $(addprefix $(CMAKEDIR)/,hotkernConfig.cmake hotkernConfigVersion.cmake) \
             $(addprefix $(HELPERDIR)/,hotkern-canary hotkern-build) \
             $(addprefix $(BINDIR)/,hotkern hotkern-canary hotkern-build) \
             $(MANDIR)/man1/hotkern.1 $(addprefix $(MANDIR)/man3/,$(notdir $(wildcard $(MAN3_DIR)/*.3)))
uninstall:
	rm -f $(addprefix $(DESTDIR),$(INSTALLED))
	for d in $(addprefix $(DESTDIR),$(INCLUDEDIR)/hotkern $(CMAKEDIR) $(HELPERDIR)); do \
	  [ ! -d $$d ] || rmdir $$d 2>/dev/null || echo "uninstall: $$d is not empty, kept"; done

# libFuzzer targets, each run for FUZZ_TIME seconds (default 60) with its
# corpus under BUILD/fuzz/corpus-NAME:
#   fuzz_meta     the hand-written format parsers (ptx/detect.c, ptx/meta*.c),
#                 seeded with a PTX, cubins and a fatbin the toolkit makes now;
#   fuzz_release  manifest parse and verify (rollouts, and each host's decision),
#                 rollback requests, strict JSON;
#   fuzz_state    the anti-rollback state file;
#   fuzz_record   the engine's last-known-good record (loader/record.c);
#   fuzz_cache    the compile cache's entry files, artifacts and manifests
#                 (ptx/entry.c);
#   fuzz_guard    the canary's trap guard (ptx/guard.c), which rewrites PTX;
#   fuzz_elfsym   the ELF symbol table reader (interpose/elfsym.c), which reads
#                 the program's image to learn a kernel's source file;
#   fuzz_fatbin   the fatbin identifier reader (interpose/fatbin.c);
#   fuzz_http     raw HTTP (and release bodies, JSON and framed) into a live endpoint
#                 on 127.0.0.1, and the frame parser fed whole and in pieces.
# `make fuzz FUZZ_TARGETS=fuzz_http FUZZ_TIME=1800` runs one of them.
FUZZ_CC      := clang -std=c11 -g -O1 -D_GNU_SOURCE -DHK_BUILDING -Iinclude -I. \
                $(shell pkg-config --cflags libcjson libsodium libmicrohttpd 2>/dev/null) \
                -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -pthread
FUZZ_NET_LIBS := $(shell pkg-config --libs libcjson libsodium libmicrohttpd 2>/dev/null) -lm
FUZZ_TARGETS ?= fuzz_meta fuzz_release fuzz_state fuzz_http fuzz_record fuzz_cache fuzz_guard \
                fuzz_frame fuzz_elfsym fuzz_fatbin

fuzz-build:
	@mkdir -p $(BUILD)/fuzz/seeds
	$(FUZZ_CC) -o $(BUILD)/fuzz/fuzz_meta tests/fuzz/fuzz_meta.c $(META_SRC)
	$(FUZZ_CC) -o $(BUILD)/fuzz/fuzz_release tests/fuzz/fuzz_release.c net/release.c net/state.c \
	  net/json.c net/rollout.c net/shipped.c base/format.c base/error.c $(UTIL_SRC) $(FUZZ_NET_LIBS)
	$(FUZZ_CC) -o $(BUILD)/fuzz/fuzz_state tests/fuzz/fuzz_state.c net/release.c net/state.c \
	  net/json.c net/rollout.c net/shipped.c base/format.c base/error.c $(UTIL_SRC) $(FUZZ_NET_LIBS)
	$(FUZZ_CC) -I$(CUDA)/include -o $(BUILD)/fuzz/fuzz_record tests/fuzz/fuzz_record.c \
	  loader/record.c base/format.c base/error.c util/util.c
	$(FUZZ_CC) -o $(BUILD)/fuzz/fuzz_cache tests/fuzz/fuzz_cache.c ptx/entry.c $(META_SRC) \
	  util/wire.c $(shell pkg-config --libs libsodium 2>/dev/null)
	$(FUZZ_CC) -o $(BUILD)/fuzz/fuzz_guard tests/fuzz/fuzz_guard.c ptx/guard.c $(META_SRC)
	$(FUZZ_CC) -I$(CUDA)/include -o $(BUILD)/fuzz/fuzz_elfsym tests/fuzz/fuzz_elfsym.c interpose/elfsym.c
	@mkdir -p $(BUILD)/fuzz/seeds-elfsym
	cc -c -D_GNU_SOURCE -Iinclude -I. -I$(CUDA)/include -o $(BUILD)/fuzz/seeds-elfsym/elfsym.o interpose/elfsym.c
	$(FUZZ_CC) -I$(CUDA)/include -o $(BUILD)/fuzz/fuzz_fatbin tests/fuzz/fuzz_fatbin.c interpose/fatbin.c \
	  interpose/elfsym.c
	$(FUZZ_CC) -o $(BUILD)/fuzz/fuzz_http tests/fuzz/fuzz_http.c net/endpoint.c net/endpoint_admit.c \
	  net/endpoint_handlers.c net/release.c net/json.c net/refused.c net/rollout.c \
	  net/frame.c net/state.c net/shipped.c net/shipped_metrics.c base/format.c base/error.c \
	  loader/expo.c $(UTIL_SRC) $(FUZZ_NET_LIBS)
	$(FUZZ_CC) -o $(BUILD)/fuzz/fuzz_frame tests/fuzz/fuzz_frame.c net/frame.c
	$(CUDA)/bin/nvcc -ptx -arch=sm_90 tests/fuzz/seed.cu -o $(BUILD)/fuzz/seeds/seed.ptx
	$(CUDA)/bin/nvcc -cubin -arch=sm_80 tests/fuzz/seed.cu -o $(BUILD)/fuzz/seeds/seed80.cubin
	$(CUDA)/bin/nvcc -cubin -arch=sm_90a tests/fuzz/seed.cu -o $(BUILD)/fuzz/seeds/seed90a.cubin
	$(CUDA)/bin/nvcc -cubin -arch=sm_100 tests/fuzz/seed.cu -o $(BUILD)/fuzz/seeds/seed100.cubin
	$(CUDA)/bin/nvcc -fatbin -gencode arch=compute_80,code=sm_80 \
	  -gencode arch=compute_90,code=[sm_90,compute_90] \
	  -o $(BUILD)/fuzz/seeds/seed.fatbin tests/fuzz/seed.cu
	@mkdir -p $(BUILD)/fuzz/seeds-fatbin
	cp $(BUILD)/fuzz/seeds/seed.fatbin $(BUILD)/fuzz/seeds-fatbin/
	$(CUDA)/bin/fatbinary -64 --ident=tests/fuzz/seed.cu \
	  --image3=kind=elf,sm=80,file=$(BUILD)/fuzz/seeds/seed80.cubin \
	  --create=$(BUILD)/fuzz/seeds-fatbin/ident.fatbin
	$(CUDA)/bin/nvcc -fatbin -Xfatbin -compress=false -gencode arch=compute_90,code=compute_90 \
	  -o $(BUILD)/fuzz/seeds/seed-ptx.fatbin tests/fuzz/seed.cu

fuzz: fuzz-build
	@set -e; for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(BUILD)/fuzz/corpus-$$t; \
	  case $$t in \
	    fuzz_meta) seeds=$(BUILD)/fuzz/seeds ;; \
	    fuzz_release) seeds=tests/fuzz/seeds/release ;; \
	    fuzz_state) seeds=tests/fuzz/seeds/state ;; \
	    fuzz_record) seeds=tests/fuzz/seeds/record ;; \
	    fuzz_cache) seeds=tests/fuzz/seeds/cache ;; \
	    fuzz_guard) seeds=tests/fuzz/seeds/guard ;; \
	    fuzz_http) seeds=tests/fuzz/seeds/http ;; \
	    fuzz_frame) seeds=tests/fuzz/seeds/frame ;; \
	    fuzz_elfsym) seeds=$(BUILD)/fuzz/seeds-elfsym ;; \
	    fuzz_fatbin) seeds=$(BUILD)/fuzz/seeds-fatbin ;; \
	  esac; \
	  echo "== $$t"; \
	  $(BUILD)/fuzz/$$t -max_total_time=$(or $(FUZZ_TIME),60) -max_len=65536 -timeout=30 \
	    -print_final_stats=1 $(BUILD)/fuzz/corpus-$$t $$seeds; \
	done

FORMAT_SRC = $(wildcard include/hotkern/*.h util/*.[ch] base/*.[ch] loader/*.[ch] ptx/*.[ch] watch/*.[ch] \
               net/*.[ch] canary/*.[ch] interpose/*.[ch] cli/*.[ch] tests/*.[ch] tests/stub/*.c bench/*.[ch] \
               demo/*.[ch] examples/*.c include/hotkern/*.hpp tests/*.cc tests/cpp/*.[ch] \
               tests/cpp/*.cc examples/*.cpp tests/programs/prog.h tests/programs/*/*.cu \
               $(foreach t,$(CPU_SUITES),tests/$(patsubst cpu_%,%,$(t))/*.[ch]))
# The layering (scripts/layers.py, docs/DESIGN.md "Layers"): no arrow up, no
# circle between files (across folders or inside one), no library file over
# about 1,000 lines (800 in loader/), no loader/ or canary/ function over 100.
# It reads the library's objects' symbols, so it builds them first (nothing to
# do after make). The public headers (scripts/api.sh): each function says the
# version that added it, that of its symbol, and no field comment is longer
# than two lines. The man pages: docs/man/man3 is what scripts/man3.sh makes
# of the headers (`make man` writes it again), and every page renders without
# a warning, the link pages through their .so.
LAYER_OBJ := $(LIB_OBJ) $(NET_OBJ) $(ICORE_OBJ) $(BUILD)/obj/interpose/preload.o \
             $(BUILD)/obj/interpose/wrap.o $(CLI_OBJ) $(BUILD)/obj/canary/helper.o \
             $(BUILD)/obj/ptx/helper.o
lint: deps
	$(call say,LINT,clang-format)clang-format --dry-run --Werror $(FORMAT_SRC)
	$(call say,LINT,sh -n)sh -n scripts/deps.sh scripts/abi-check.sh scripts/man3.sh scripts/api.sh scripts/symver.sh \
	  tests/run.sh tests/all.sh tests/run-examples.sh \
	  tests/programs/run.sh tests/cpp/compile-fail.sh demo/nvcc/tour.sh bench/check_reuse.sh \
	  tests/exit-stress.sh bench/build-times.sh tests/lint-check.sh
	@sh scripts/api.sh --check
	@d=$$(mktemp -d) && sh scripts/man3.sh $$d/man3 && diff -r $$d/man3 $(MAN3_DIR) >/dev/null; \
	  s=$$?; rm -rf $$d; [ $$s -eq 0 ] || \
	  { echo "lint: $(MAN3_DIR) is not what scripts/man3.sh makes of the headers: make man" >&2; exit 1; }
	@for p in $(MAN1) $(MAN3_DIR)/hotkern*.3; do w=$$(groff -man -ww -z $$p 2>&1); \
	  [ -z "$$w" ] || { echo "lint: $$p: $$w" >&2; exit 1; }; done
	@w=$$(cd $(MAN3_DIR)/.. && groff -man -ww -z man3/hk_*.3 2>&1); \
	  [ -z "$$w" ] || { echo "lint: $(MAN3_DIR): $$w" >&2; exit 1; }
	@$(MAKE) --no-print-directory lint-objects
	$(call say,LINT,scripts/layers.py)python3 scripts/layers.py $(BUILD) --check

# (A goal of its own: made as goals, each object up to date would say so.)
lint-objects: $(LAYER_OBJ)
	@:

man:
	sh scripts/man3.sh $(MAN3_DIR)

format:
	clang-format -i $(FORMAT_SRC)

clean:
	$(call say,RM,build build-san build-tsan)rm -rf build build-san build-tsan

-include $(wildcard $(BUILD)/obj/*/*.d $(BUILD)/obj/*/*/*.d)

endif # (goals in turn)
