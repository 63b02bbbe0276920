# cooktop: `make run` sets everything up and generates text; `make test` runs the tests.
# Setup (scripts/setup.sh) is idempotent: the second run takes seconds.
#   make setup                      system packages (apt), .venv, the project + extras, kp
#   make setup-compare              also the `compare` extra (llama-cpp-python, built from source)
#   make run [PROMPT=... N=64]      setup, then generate with the default model
#   make test [PYTEST_ARGS=...]     setup, then pytest
#   make test-quick                 the edit loop's subset (under 3 minutes)
#   make test-vulkan-validation     setup, then the Vulkan tests under the Khronos validation layer
#   make test-vulkan-gpu-assisted   only its GPU-assisted part (shaders instrumented for bounds)
#   make test-opencl-validation     setup, then the OpenCL tests on Oclgrind (a simulated GPU: races, bounds)
#   make shaders                    compile the Vulkan GLSL shaders to SPIR-V
#   make bench                      setup, then `cooktop bench`
#   make llamacpp-vulkan            build llama.cpp's llama-bench with its Vulkan backend (in ../llamacpp-vk)
#   make bench-vs-vulkan [MODEL=..] cooktop Vulkan vs that llama-bench on lavapipe, back to back, one table
#   make llamacpp-cpu               build llama.cpp's CPU llama-server + llama-bench (in /tmp/llama-build)
#   make test-llama-server-suite    llama.cpp's server test suite against `cooktop serve` (and llama-server)
#   make lint                       ruff (style, imports) and mypy on the package
#   make coverage                   the whole suite under coverage: lines and branches of cooktop/
#   make fuzz [FUZZ_EXAMPLES=100000] the long fuzz run (GGUF reader, tokenizer; tests/test_fuzz.py)
# Variables passed on the command line (COOKTOP_EXTRAS=compare, PYTHON=python3.11,
# COOKTOP_SHARED=/path) reach scripts/setup.sh through the environment.

SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
COOKTOP := $(VENV)/bin/cooktop
PROMPT ?= Once upon a time
N ?= 64
PYTEST_ARGS ?=
# pytest-xdist workers (0: one process). Most tests use one core, so on 2 cores two workers nearly
# halve the wall time. `make test` takes one per CPU (SUITE_JOBS): the Ray cluster's cases (about
# 5 minutes, mostly waiting on Ray) run in the background from the end of the collection
# (tests/ray_cluster/run_cases.py) while every worker computes, and are reported last. The
# validation runs take one per CPU too (TEST_JOBS, `auto`).
TEST_JOBS ?= auto
SUITE_JOBS ?= $(shell nproc 2>/dev/null || echo 1)
XDIST = -n $(TEST_JOBS)
FUZZ_EXAMPLES ?= 100000
comma := ,

.DEFAULT_GOAL := help
.PHONY: help setup setup-compare run test test-quick test-vulkan-validation test-vulkan-gpu-assisted test-opencl-validation shaders bench llamacpp-vulkan bench-vs-vulkan \
	lint fuzz llamacpp-cpu test-llama-server-suite coverage

help:
	@sed -n '1,20s/^# \{0,1\}//p' Makefile

setup:
	bash scripts/setup.sh

setup-compare:
	COOKTOP_EXTRAS="$(if $(COOKTOP_EXTRAS),$(COOKTOP_EXTRAS)$(comma))compare" bash scripts/setup.sh

run: setup
	$(COOKTOP) run -p "$(PROMPT)" -n $(N)

# pytest exits 5 when it collects no test: that fails `make test` too, by name.
# VULKAN_VALIDATION=1 (.ci/run sets it): the Vulkan tests (-k vulkan) run under the Khronos validation
# layer with synchronization validation (tests/vulkan_validation.py), the others as usual: every test
# of the suite once, the Vulkan ones validated on the way, so CI does not run them a second time.
# (With it, a -k in PYTEST_ARGS would replace the split: leave it for plain runs.)
VULKAN_VALIDATION ?=
PYTEST_RUN = $(PY) -m pytest -q -n $(SUITE_JOBS)
NO_TESTS = if [ $$rc -eq 5 ]; then echo "make test: FAILED: pytest collected no tests (exit 5)" >&2; fi; exit $$rc
test: setup
ifeq ($(VULKAN_VALIDATION),1)
	@echo "$(PYTEST_RUN) -k 'not vulkan' $(PYTEST_ARGS)"; \
	$(PYTEST_RUN) -k "not vulkan" $(PYTEST_ARGS) || { rc=$$?; $(NO_TESTS); }
	@echo "$(PY) tests/vulkan_validation.py -q $(XDIST) -k vulkan $(PYTEST_ARGS)"; \
	$(PY) tests/vulkan_validation.py -q $(XDIST) -k vulkan $(PYTEST_ARGS) || { rc=$$?; $(NO_TESTS); }
else
	@echo "$(PYTEST_RUN) $(PYTEST_ARGS)"; \
	$(PYTEST_RUN) $(PYTEST_ARGS) || { rc=$$?; $(NO_TESTS); }
endif

# The edit loop's suite (under 3 minutes on 2 cores): every op on numpy and OpenCL against the
# references, the device contract, the llama.cpp reference logits and one model end to end per
# architecture family, the server's smoke, the layout rules; no test marked slow, no Vulkan
# (lavapipe compiles each pipeline cold). `make test` stays the whole suite.
QUICK_TESTS ?= tests/test_ops_parity.py tests/test_ops_parity_ext.py tests/test_moe_ops.py \
	tests/test_device_contract.py tests/test_reference.py tests/test_arch.py tests/test_arch_moe.py \
	tests/test_gemma3_phi3.py tests/test_server.py tests/test_layout.py tests/test_slowguard.py
# The whole suite (as `make test`, PYTEST_ARGS too) under coverage, lines and branches of cooktop/ in
# every Python process it starts (pyproject's [tool.coverage.run] patch = subprocess: xdist workers,
# `cooktop` subprocesses, the Ray cluster's nodes; one data file each under COVERAGE_FILE's folder),
# then one combined report; the total line is the README's coverage figure.
COVERAGE_FILE ?= $(CURDIR)/.coverage-data/cov
coverage: setup
	rm -rf $(dir $(COVERAGE_FILE)) && mkdir -p $(dir $(COVERAGE_FILE))
	COVERAGE_FILE=$(COVERAGE_FILE) $(PY) -m coverage run -m pytest -q -n $(SUITE_JOBS) $(PYTEST_ARGS); rc=$$?; \
	COVERAGE_FILE=$(COVERAGE_FILE) $(PY) -m coverage combine -q $(dir $(COVERAGE_FILE)) && \
	COVERAGE_FILE=$(COVERAGE_FILE) $(PY) -m coverage report --precision=2 --skip-covered | tail -3; exit $$rc

test-quick: setup
	$(PY) -m pytest -q $(XDIST) -m "not slow" -k "not vulkan" $(QUICK_TESTS)

# Every Vulkan test (-k vulkan) under VK_LAYER_KHRONOS_validation with synchronization
# validation; fails on any error message (tests/vulkan_validation.py parses the layer's log).
# VALIDATION_ARGS replaces the pytest arguments (default: -q -k vulkan, TEST_JOBS workers; each
# worker logs to a FIFO of its own, so messages stay attributed to their test).
VALIDATION_ARGS ?= -q -k vulkan $(XDIST)
# Then GPU-assisted validation (shaders instrumented for out-of-bounds access) on the op parity
# tests whose shaders it instruments in seconds; the dequantizing shaders (matmul, get_rows) take
# ~4 minutes per pipeline under it on lavapipe, so they are left out by name (README "Tests"), and
# so is test_low_bit_k_quants (Q2_K / Q3_K matmul and get_rows pipelines). The gated delta rule's
# shaders (tests/test_gated_delta_net.py) take 20 s under it; the vision ops' (tests/test_vision_ops.py) a few,
# their attention_full left out (15-20 s a case under it: test_ops_parity.py's attention runs its shaders).
GPU_ASSISTED_ARGS ?= -q -p no:cacheprovider $(XDIST) tests/test_ops_parity.py tests/test_gated_delta_net.py \
	tests/test_vision_ops.py -k "vulkan and not matmul and not get_rows and not low_bit and not attention_full"
test-vulkan-validation: setup
	$(PY) tests/vulkan_validation.py $(VALIDATION_ARGS)
	$(PY) tests/vulkan_validation.py --gpu-assisted $(GPU_ASSISTED_ARGS)

# Only the GPU-assisted part: `.ci/run` runs it after `VULKAN_VALIDATION=1 make test`, which ran the
# synchronization-validated part with the suite.
test-vulkan-gpu-assisted: setup
	$(PY) tests/vulkan_validation.py --gpu-assisted $(GPU_ASSISTED_ARGS)

# The OpenCL op parity tests and stories260K / a tiny quantized model end to end on Oclgrind with
# data-race and bounds checking, GPU launch shapes; fails on any report (tests/opencl_validation.py).
# OPENCL_VALIDATION_ARGS replaces the pytest arguments (default: the harness's DEFAULT_ARGS).
OPENCL_VALIDATION_ARGS ?=
test-opencl-validation: setup
	$(PY) tests/opencl_validation.py $(or $(OPENCL_VALIDATION_ARGS),--default-args $(XDIST))

shaders:
	@test -x $(PY) || { echo "make shaders: no $(PY); run 'make setup' first" >&2; exit 1; }
	$(PY) -m cooktop.backends.vulkan.build

# Recompile every shader variant with glslc and compare the shipped .spv bytes (about 50 s; the test
# suite checks the recorded source digests instead, without a compiler).
shaders-check: setup
	$(PY) -m cooktop.backends.vulkan.build --check

bench: setup
	$(COOKTOP) bench --device cpu,opencl,vulkan -p 128 -n 32 -r 3

# llama.cpp's own Vulkan backend for a same-driver comparison (scripts/build-llamacpp-vulkan.sh:
# llama-cpp-python 0.3.8's vendored llama.cpp, ~10-40 minutes on 2 cores).
LLAMACPP_DIR ?= ../llamacpp-vk
LLAMA_BENCH ?= $(LLAMACPP_DIR)/llama_cpp_python-0.3.8/vendor/llama.cpp/build-vulkan/bin/llama-bench
# The Vulkan driver of both engines: lavapipe where installed (empty: the loader's choice).
BENCH_ICD ?= $(firstword $(wildcard /usr/share/vulkan/icd.d/lvp_icd.*.json))
MODEL ?=
BENCH_VS_ARGS ?= -p 32 -n 8 -r 3
llamacpp-vulkan:
	bash scripts/build-llamacpp-vulkan.sh $(LLAMACPP_DIR)

# llama.cpp's CPU llama-server and llama-bench, the baselines of `cooktop bench --vs llama.cpp
# --llama-bench` and scripts/serve_concurrency.py (scripts/build-llamacpp-cpu.sh, ~10 minutes on 2 cores).
LLAMACPP_CPU_DIR ?= /tmp/llama-build
llamacpp-cpu:
	bash scripts/build-llamacpp-cpu.sh $(LLAMACPP_CPU_DIR)

# llama.cpp's tools/server/tests, offline, against `cooktop serve`; with LLAMA_SERVER=PATH (default
# /tmp/llama-build/bin/llama-server when built) against it too, then both counts and what differs.
# About 10 minutes a server on 2 cores; not in .ci/run. SUITE_ARGS: pytest arguments (e.g. -k basic).
test-llama-server-suite: setup
	bash scripts/llama_server_suite/run.sh $(SUITE_ARGS)

bench-vs-vulkan: setup
	@test -x $(LLAMA_BENCH) || { echo "make bench-vs-vulkan: no $(LLAMA_BENCH); run 'make llamacpp-vulkan'" >&2; exit 1; }
	$(if $(BENCH_ICD),VK_ICD_FILENAMES=$(BENCH_ICD)) $(COOKTOP) bench --vs llama.cpp --llama-bench $(LLAMA_BENCH) \
		--device vulkan:0 $(if $(MODEL),-m $(MODEL)) $(BENCH_VS_ARGS)

lint:
	@test -x $(PY) || { echo "make lint: no $(PY); run 'make setup' first" >&2; exit 1; }
	$(VENV)/bin/ruff check cooktop tests scripts
	$(VENV)/bin/mypy

# FUZZ_EXAMPLES inputs for each of the GGUF reader and the tokenizer (an hour or so on 2 cores);
# the last line printed says how many were tried. Needs the dev extra (hypothesis): make setup first.
fuzz:
	@test -x $(PY) || { echo "make fuzz: no $(PY); run 'make setup' first" >&2; exit 1; }
	COOKTOP_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q -s -p no:cacheprovider --timeout=0 \
		--hypothesis-show-statistics tests/test_fuzz.py
