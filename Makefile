# Short commands (README.md lists them). Each target installs what is missing (as
# root, through apt-get), configures with CMake and builds before it runs.

PACKAGES := build-essential cmake pkg-config clang libclang-rt-14-dev python3 python3-venv \
            python3-numpy libopenblas-dev libcjson-dev zlib1g-dev libopenmpi-dev openmpi-bin \
            dataset-fashion-mnist fortunes fortunes-de fortunes-es fortunes-it fortunes-ru \
            fortunes-pl fortunes-cs
BUILD      ?= build
INSTALL_BUILD ?= build-install
PREFIX     ?= /usr/local
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 30
FUZZ_TARGETS := checkpoint checkpoint_index config idx text tokens tokenizer
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
GPIPE      := $(BUILD)/gpipe
# Python packages from PyPI for the tests (the reference `safetensors` reader, and `tokenizers`
# for the token datasets' test, which skips without it), in a venv that also sees Debian's
# python3-numpy (and python3-torch where installed).
PYENV      ?= .pyenv
PY_PACKAGES := safetensors
PY_OPTIONAL := tokenizers

.PHONY: all deps pydeps pydeps-hf check-hf build test test-fast test-asan test-tsan test-fuzz demo demo-long demo-fashion bench bench-peers bench-portable gpu-bundle docs install clean

all: build

deps:
	@missing=""; for p in $(PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$missing; \
	fi

pydeps: deps
	@if ! $(PYENV)/bin/python -c "import safetensors, numpy" 2>/dev/null; then \
	  echo "installing into $(PYENV): $(PY_PACKAGES)"; \
	  /usr/bin/python3 -m venv --system-site-packages $(PYENV) && \
	  $(PYENV)/bin/pip install -q $(PY_PACKAGES); \
	fi
	@if ! $(PYENV)/bin/python -c "import tokenizers" 2>/dev/null; then \
	  echo "installing into $(PYENV): $(PY_OPTIONAL)"; \
	  $(PYENV)/bin/pip install -q $(PY_OPTIONAL) || \
	    echo "pydeps: $(PY_OPTIONAL) did not install; cli_tokens will be skipped"; \
	fi

# The local build is optimized for this machine's CPU (-march=native) for the demos, tests and
# benchmarks; make install builds its own portable copy.
$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DGP_NATIVE=ON

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# The whole suite: the optimized build (with MPI: the multi-process tests run
# under mpirun), then again under ASan + UBSan (the MPI tests without leak
# detection: Open MPI's plugins leave allocations behind), the threaded tests
# under ThreadSanitizer, built without MPI (Open MPI is not instrumented: its
# threads would read as races), which also tests a build without MPI, and the
# libFuzzer targets for a bounded time each.
test: build pydeps test-asan test-tsan test-fuzz
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# GPT-2 through transformers and back (tests/hf/roundtrip.sh), outside make test: transformers
# 4.44 from PyPI over Debian's python3-torch, in the same venv. The C test against transformers'
# numbers (test_gpt2) reads committed fixtures and needs none of it.
PY_HF := transformers==4.44.*
pydeps-hf: pydeps
	@dpkg-query -W -f='$${Status}' python3-torch 2>/dev/null | grep -q "install ok installed" || { \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q python3-torch; }
	@$(PYENV)/bin/python -c "import transformers" 2>/dev/null || \
	  $(PYENV)/bin/pip install -q "$(PY_HF)" || echo "pydeps-hf: $(PY_HF) did not install; check-hf will skip"

check-hf: build pydeps-hf
	cmake --build $(BUILD) -j $(JOBS) --target gpt2_logits
	bash tests/hf/roundtrip.sh $(BUILD) $(PYENV)/bin/python || [ $$? = 77 ]

test-fast: build pydeps
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The sanitizer builds leave CUDA out (GP_CUDA=OFF, which AUTO means there anyway): nvcc's
# objects are not instrumented, and the CUDA driver conflicts with ASan's shadow memory and
# hides its ordering from TSan. They also test the build without CUDA.
test-asan: deps pydeps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DGP_SANITIZE=ON -DCMAKE_C_COMPILER=clang -DGP_CUDA=OFF
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && GP_TEST_QUICK=1 ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS)

# The threaded tests (transport, trace recorder, pipeline runtime, the CPU device's thread pool
# under every kernel) under ThreadSanitizer.
# setarch -R turns off address randomization where it can: some kernels randomize more than
# the TSan runtime of older clangs accepts ("unexpected memory mapping").
test-tsan: deps
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DGP_TSAN=ON -DCMAKE_C_COMPILER=clang -DGP_MPI=OFF -DGP_CUDA=OFF
	cmake --build $(TSAN_BUILD) -j $(JOBS)
	cd $(TSAN_BUILD) && NORAND=""; \
	  if setarch $$(uname -m) -R true 2>/dev/null; then NORAND="setarch $$(uname -m) -R"; fi; \
	  GP_TEST_QUICK=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
	  $$NORAND ctest --output-on-failure -j $(JOBS) -R 'comm|trace|pipeline|test_checkpoint|test_kernels|layers_tp|test_plan|test_skip'

# libFuzzer (clang, ASan + UBSan) on the checkpoint, checkpoint-index (multi-part sets), JSON
# config, IDX and text readers, token files and tokenizer.json, each for FUZZ_SECONDS from its
# committed seed corpus in tests/fuzz/corpus/ (which also holds every input that ever failed, as
# a regression), JOBS targets at a time; new inputs go to $(FUZZ_BUILD)/corpus, never the tree.
test-fuzz: deps
	cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=Debug -DGP_FUZZ=ON -DGP_BUILD_TESTS=OFF \
	  -DCMAKE_C_COMPILER=clang -DGP_CUDA=OFF
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target $(addprefix fuzz_,$(FUZZ_TARGETS))
	bash tests/fuzz/run_all.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) $(JOBS) $(FUZZ_TARGETS)

# The main job: a byte-level Transformer LM on the multilingual fortunes, as a 2-stage pipeline
# (about 5 minutes on 2 cores), then a sample after a prompt in each of the seven languages.
demo: build
	$(GPIPE) train --model examples/demo_lm.json --stages 2 --micro-batches 8 --remat none \
	  --steps 1500 --batch 32 --lr 3e-3 --eval-every 250 --sample 160 \
	  --prompts examples/demo_prompts.txt --report $(BUILD)/demo_report.json \
	  --metrics $(BUILD)/demo_metrics.jsonl --curve $(BUILD)/demo_curve.svg \
	  --timeline $(BUILD)/demo_timeline.svg --trace $(BUILD)/demo_trace.json
	@echo "learning curve: $(BUILD)/demo_curve.svg; last step's pipeline timeline:" \
	  "$(BUILD)/demo_timeline.svg (open both in a browser); Chrome trace: $(BUILD)/demo_trace.json" \
	  "(https://ui.perfetto.dev); metrics: $(BUILD)/demo_metrics.jsonl; report: $(BUILD)/demo_report.json"

# The longer run (about 25 minutes on 2 cores): a wider, deeper model, ending with samples after
# a prompt in each of the seven languages.
demo-long: build
	$(GPIPE) train --model examples/demo_lm_long.json --stages 2 --micro-batches 8 --remat none \
	  --steps 4000 --batch 32 --lr 2e-3 --eval-every 500 --sample 300 \
	  --prompts examples/demo_prompts.txt --report $(BUILD)/demo_long_report.json \
	  --metrics $(BUILD)/demo_long_metrics.jsonl --curve $(BUILD)/demo_long_curve.svg \
	  --timeline $(BUILD)/demo_long_timeline.svg --trace $(BUILD)/demo_long_trace.json
	@echo "learning curve: $(BUILD)/demo_long_curve.svg; last step's pipeline timeline:" \
	  "$(BUILD)/demo_long_timeline.svg; metrics: $(BUILD)/demo_long_metrics.jsonl; report: $(BUILD)/demo_long_report.json"

demo-fashion: build
	rm -rf $(BUILD)/fashion_checkpoint
	$(GPIPE) train --model examples/resnet_fashion.json --stages 2 --batch 32 --micro-batches 4 \
	  --remat none --schedule zbv --epochs 12 --lr 0.1 --lr-schedule cosine --warmup 800 \
	  --weight-decay 5e-4 --augment flip --erase 0.5 --label-smoothing 0.1 \
	  --checkpoint-dir $(BUILD)/fashion_checkpoint \
	  --report $(BUILD)/fashion_report.json --metrics $(BUILD)/fashion_metrics.jsonl \
	  --curve $(BUILD)/fashion_curve.svg --timeline $(BUILD)/fashion_timeline.svg
	$(GPIPE) eval --checkpoint $(BUILD)/fashion_checkpoint/ckpt-00022500.safetensors \
	  --tta flip --report $(BUILD)/fashion_tta_report.json
	@echo "learning curve: $(BUILD)/fashion_curve.svg; last step's pipeline timeline:" \
	  "$(BUILD)/fashion_timeline.svg; metrics: $(BUILD)/fashion_metrics.jsonl; reports:" \
	  "$(BUILD)/fashion_report.json, $(BUILD)/fashion_tta_report.json (the final model with" \
	  "test-time augmentation); final checkpoint: $(BUILD)/fashion_checkpoint"

# gpipe beside PyTorch (Debian's python3-torch, not a test dependency: installed here if missing)
# on C1, T1 and T2, each printing both sides and the ratio (bench/peers/).
bench-peers: build
	@dpkg-query -W -f='$${Status}' python3-torch 2>/dev/null | grep -q "install ok installed" || { \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q python3-torch; }
	/usr/bin/python3 bench/peers/c1.py --gpipe $(GPIPE) --rounds 3
	/usr/bin/python3 bench/peers/t1.py --gpipe $(GPIPE) --rounds 2 --steps 5 --warmup 2
	/usr/bin/python3 bench/peers/t2.py --gpipe $(GPIPE)

bench: build
	bash bench/run.sh $(GPIPE)
	$(BUILD)/bench_conv 1
	$(BUILD)/bench_conv 2
	$(BUILD)/bench_norm 1
	bash bench/run_t2.sh $(GPIPE)
	bash bench/run_table1.sh $(GPIPE)
	bash bench/run_mpi.sh $(GPIPE)
	bash bench/run_mesh.sh $(GPIPE)

# The portable build (the one make install makes) against this machine's native build, on C1,
# T1 and the Fashion demo's workload, alternating rounds (bench/run_portable.sh).
bench-portable: build
	INSTALL_BUILD=$(INSTALL_BUILD) bash bench/run_portable.sh $(GPIPE)

# The bundle that bench/gpu/run.sh runs on a GPU machine, made here with the CUDA 13 toolkit:
# build-gpu/ (sm_90, Release) and gpu-bundle.tar.xz with the programs and the libraries they load.
gpu-bundle: deps
	bash bench/gpu/bundle.sh

# The option reference (docs/cli.md) and the man page (docs/gpipe.1) from gpipe's --help texts;
# the test cli_doc_sync fails until this is run after a help text changes.
docs: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS) --target gpipe
	bash tools/gen_cli_doc.sh $(GPIPE) md > docs/cli.md.tmp && mv docs/cli.md.tmp docs/cli.md
	bash tools/gen_cli_doc.sh $(GPIPE) man > docs/gpipe.1.tmp && mv docs/gpipe.1.tmp docs/gpipe.1

# A separate tree without -march=native: what is installed may run on another CPU than this one
# (gpipe's CPU kernels in it are compiled for several instruction sets and chosen at start).
install: deps
	cmake -S . -B $(INSTALL_BUILD) -DCMAKE_BUILD_TYPE=Release -DGP_NATIVE=OFF -DGP_BUILD_TESTS=OFF
	cmake --build $(INSTALL_BUILD) -j $(JOBS)
	cmake --install $(INSTALL_BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD) $(INSTALL_BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD) $(PYENV)
