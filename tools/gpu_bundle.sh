#!/usr/bin/env bash
# tools/gpu_bundle.sh [BUILD_DIR] - packs, on the build machine (nvcc, no GPU), everything the
# lent GPU machine lacks into .gpu/bundle.tar.xz (with the working tree under 63 MiB), for tools/gpu_check.sh there:
#   b/build/...        the binaries the `gpu` tests and the GPU benchmarks run (same relative
#                      paths as in BUILD_DIR), every CTestTestfile.cmake, the golden and GGUF
#                      fixtures the gpu tests read (made here by their ctest fixtures)
#   b/lib/             the Debian libraries they link (OpenBLAS, SentencePiece, gRPC, ...), not
#                      glibc, libstdc++, libgcc_s (the GPU machine's own are newer) nor CUDA's
#                      libraries (the GPU machine's own: libcudart, cuBLAS, NCCL)
#   b/mpi/usr/...      Open MPI and PMIx as Debian installs them (relocated there by OPAL_PREFIX
#                      and PMIX_INSTALL_PREFIX)
#   b/assets/          the shared assets the tests read (stories260K, tinyshakespeare)
#   b/manifest         where it came from: paths to rewrite, the commit, the CUDA version
# BUILD_DIR (default build/) must be a CUDA build with the fixtures made (make test, or
# `ctest -R 'golden_setup|gguf_setup'`). docs/cuda.md says how the two scripts are used.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
assets=${SHARDLM_ASSETS:-$root/../shared/assets}
out=$root/.gpu
# The CUDA backend and NCCL are libraries the binaries load on first use (kernels/backend_lib.c).
cuda_lib=$(find "$build" -name libshardlm_cuda.so -not -path '*/CMakeFiles/*' | head -1)
nccl_lib=$(find "$build" -name libshardlm_nccl.so -not -path '*/CMakeFiles/*' | head -1)
[ -n "$cuda_lib" ] ||
  { echo "gpu_bundle: $build is not a CUDA build (no libshardlm_cuda.so in it)" >&2; exit 1; }
[ -f "$build/golden/stories260K/model.safetensors" ] ||
  { echo "gpu_bundle: no fixtures in $build (run ctest -R 'golden_setup|gguf_setup' there)" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
B=$stage/b
mkdir -p "$B/build" "$B/lib" "$B/mpi" "$B/assets"
cp "$cuda_lib" "$B/lib/libshardlm_cuda.so"
[ -n "$nccl_lib" ] && cp "$nccl_lib" "$B/lib/libshardlm_nccl.so"

# The binaries: every executable the gpu-labelled tests and the GPU benchmarks name.
bins=(cli/shardlm tests/test_ops tests/test_ops_dropout tests/test_attention_train tests/test_ops_backward
      tests/test_ops_quant tests/test_parallel tests/test_train_grad tests/test_model tests/test_gguf_serve
      tests/bench_engine tests/bench_train tests/bench_cuda)
for f in "${bins[@]}"; do
  [ -x "$build/$f" ] || { echo "gpu_bundle: SKIP $f (not built)"; continue; }
  mkdir -p "$B/build/$(dirname "$f")"
  strip --strip-debug -o "$B/build/$f" "$build/$f"
done
(cd "$build" && find . -name CTestTestfile.cmake -not -path '*/CMakeFiles/*' | while read -r f; do
  mkdir -p "$B/build/$(dirname "$f")"; cp "$f" "$B/build/$f"; done)
# Only the fixtures the gpu-labelled tests and gpu_check.sh read: the whole golden/ is about 55 MiB
# of random weights that xz cannot shrink (it made the bundle 69 MiB on 2026-12-02, over what the
# device tool carries). test_model cuda: gpt2, llama_sharded_bf16; serve_cuda_*, generate_mpi_cuda,
# bench_engine: stories260K; train_parallel_cuda: stories260K, gpt2, llama_f16; gguf_serve_cuda:
# tiny_gemma3.gguf; model_cuda_{gpt_oss,qwen2_moe,phi3_lora,gemma2}: those four (about 3.4 MiB).
for d in stories260K gpt2 llama_f16 llama_sharded_bf16 gpt_oss qwen2_moe phi3_lora gemma2; do
  [ -d "$build/golden/$d" ] || { echo "gpu_bundle: no $build/golden/$d (run ctest -R golden_setup there)" >&2; exit 1; }
  mkdir -p "$B/build/golden"
  cp -r "$build/golden/$d" "$B/build/golden/$d"
done
if [ -f "$build/gguf_fixtures/tiny_gemma3.gguf" ]; then
  mkdir -p "$B/build/gguf_fixtures"
  cp "$build/gguf_fixtures/tiny_gemma3.gguf" "$B/build/gguf_fixtures/"
fi

mkdir -p "$B/assets/stories260K" "$B/assets/datasets"
cp "$assets/stories260K/stories260K.bin" "$assets/stories260K/tok512.model" "$B/assets/stories260K/"
cp "$assets/datasets/tinyshakespeare.txt" "$B/assets/datasets/"

# Open MPI and PMIx, file by file as their packages install them.
for pkg in openmpi-bin openmpi-common libopenmpi3 libpmix2; do
  dpkg -L "$pkg" | while read -r f; do
    case $f in /usr/share/doc/* | /usr/share/man/* | /usr/share/lintian/*) continue ;; esac
    if [ -f "$f" ] && [ ! -L "$f" ]; then mkdir -p "$B/mpi$(dirname "$f")"; cp "$f" "$B/mpi$f"
    elif [ -L "$f" ]; then mkdir -p "$B/mpi$(dirname "$f")"; cp -P "$f" "$B/mpi$f"; fi
  done
done
ln -sf orterun "$B/mpi/usr/bin/mpirun"

# The libraries every ELF file in the bundle links, less the base system and CUDA's own.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|libstdc\+\+|libgcc_s|libcuda\.so|libcudart|libcublas|libnccl|libutil\.so|libresolv\.so)'
find "$B/build" "$B/mpi" "$B/lib" -type f | while read -r f; do
  file -b "$f" | grep -q '^ELF' || continue
  ldd "$f" 2> /dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
  [[ $name =~ $skip ]] && continue
  case $path in "$B"/*) continue ;; esac
  [ -f "$B/lib/$name" ] || cp -L "$path" "$B/lib/$name"
done

cat > "$B/manifest" << EOF
build_dir=$build
source_dir=$root
python=$(grep '^_Python3_EXECUTABLE:' "$build/CMakeCache.txt" | cut -d= -f2)
mpiexec=$(grep '^MPIEXEC_EXECUTABLE:' "$build/CMakeCache.txt" | cut -d= -f2)
commit=$(git -C "$root" rev-parse HEAD)$(git -C "$root" diff --quiet HEAD || echo "+uncommitted")
cuda=$(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
made=$(date -u +%Y-%m-%dT%H:%M:%SZ)
EOF
mkdir -p "$out"
# -9e: about 1 MiB smaller than -6 (2026-12-04: 33.6 against 34.5 MiB), about a minute longer. A
# dictionary over the whole tar (192 MiB; 154 MiB unpacked on 2026-12-07), one thread so that it is
# one block: the test binaries link the same engine statically, and copies further apart than -9e's
# 64 MiB were packed again (2026-12-07: 34.9 MiB with -T2 -9e, 33.6 MiB so; about 90 s on 2 cores).
tar -C "$stage" --sort=name -cf - b | xz -T1 --lzma2=preset=9e,dict=192MiB > "$out/bundle.tar.xz.tmp"
mv "$out/bundle.tar.xz.tmp" "$out/bundle.tar.xz"
size=$(stat -c %s "$out/bundle.tar.xz")
echo "gpu_bundle: $out/bundle.tar.xz: $((size / 1048576)) MiB ($(du -sh "$B" | cut -f1) unpacked)"
# The device tool carries the working tree (tracked and untracked files git does not ignore)
# and .gpu together, 64 MiB at most: leave 2 MiB of room.
tree=$(cd "$root" && git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2> /dev/null |
       awk '{ s += $1 } END { print s + 0 }')
echo "gpu_bundle: with the working tree's $((tree / 1048576)) MiB: $(((size + tree) / 1048576)) MiB to carry (at most 63)"
[ $((size + tree)) -lt $((63 * 1048576)) ] || { echo "gpu_bundle: over 63 MiB with the working tree (the device tool carries 64)" >&2; exit 1; }
