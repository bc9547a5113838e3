#!/usr/bin/env bash
# Makes the bundle that bench/gpu/run.sh runs on a GPU machine, on a CPU machine with the CUDA 13
# toolkit: a Release build for Hopper (-DGP_CUDA=ON, sm_90, no MPI, portable CPU kernels) in
# build-gpu/, and gpu-bundle/ beside it with the programs, the CUDA module and the Debian
# libraries they load that a GPU machine's image may lack (OpenBLAS, its Fortran runtime,
# cJSON), then gpu-bundle.tar.xz (about 15 MB) of it. The GPU machine needs only its driver,
# the CUDA 13 runtime and cuBLAS (run.sh finds them) and python3.
#
#   bash bench/gpu/bundle.sh            # then carry gpu-bundle.tar.xz (both paths are ignored)
#
# The libraries are copied from this machine's Debian packages (libopenblas0-pthread,
# libgfortran5, libquadmath0, libcjson1); where one is missing, `apt-get download` fetches
# its package and dpkg -x unpacks it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${GP_GPU_BUILD:-$ROOT/build-gpu}
BUNDLE=$ROOT/gpu-bundle
PROGRAMS=(gpipe test_kernels_cuda test_cuda_api test_pipeline gp_gemm_paths)
WORKLOG=$(mktemp)
trap 'rm -f "$WORKLOG"' EXIT
cd "$ROOT"
command -v nvcc >/dev/null || { echo "bundle.sh: nvcc not found: needs the CUDA 13 toolkit" >&2; exit 1; }
echo "bundle.sh: building $BUILD (Release, CUDA sm_90, no MPI)..."
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DGP_MPI=OFF -DGP_NATIVE=OFF >"$WORKLOG" 2>&1 ||
    { tail -20 "$WORKLOG"; exit 1; }
cmake --build "$BUILD" -j"$(nproc)" --target "${PROGRAMS[@]}" gpipe_cuda
rm -rf "$BUNDLE" && mkdir -p "$BUNDLE/lib"
for p in "${PROGRAMS[@]}" libgpipe_cuda.so; do cp "$BUILD/$p" "$BUNDLE/"; done
# Each library the programs load that is not part of glibc, the CUDA toolkit or the driver.
need=(libopenblas.so.0 libgfortran.so.5 libquadmath.so.0 libcjson.so.1 libz.so.1)
pkgs=(libopenblas0-pthread libgfortran5 libquadmath0 libcjson1 zlib1g)
for i in "${!need[@]}"; do
    lib=${need[$i]}
    path=$(ldconfig -p | awk -v l="$lib" '$1 == l && /x86-64/ && !p {p = $NF} END {print p}')
    if [ -z "$path" ]; then
        tmp=$(mktemp -d)
        (cd "$tmp" && apt-get download "${pkgs[$i]}" >/dev/null && dpkg -x ./*.deb x)
        path=$(find "$tmp/x" -name "$lib" | head -1)
    fi
    [ -n "$path" ] || { echo "bundle.sh: $lib not found (package ${pkgs[$i]})" >&2; exit 1; }
    cp -L "$path" "$BUNDLE/lib/$lib"
done
(cd "$BUILD" && git -C "$ROOT" rev-parse HEAD) >"$BUNDLE/COMMIT"
tar -C "$ROOT" -cJf "$ROOT/gpu-bundle.tar.xz" gpu-bundle
echo "bundle.sh: $(du -sh "$BUNDLE" | cut -f1) in gpu-bundle/, $(du -h gpu-bundle.tar.xz | cut -f1) in gpu-bundle.tar.xz (commit $(cut -c1-12 "$BUNDLE/COMMIT"))"
