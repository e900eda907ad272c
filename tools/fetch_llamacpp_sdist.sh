#!/usr/bin/env bash
# tools/fetch_llamacpp_sdist.sh [DIR] - llama-cpp-python 0.3.36's source distribution from PyPI (about
# 77 MB), unpacked into DIR (default .cache/llama.cpp): its vendor/llama.cpp holds llama.cpp's
# tokenizer test vectors (models/ggml-vocab-*.gguf with .inp / .out: tokenizer_vocab_vectors_sdist),
# src/llama-vocab.cpp (the per-type BOS defaults tokenizer_gguf_pre reads) and the sources
# tools/bench_vs_llamacpp.sh builds llama-bench from. pip downloads it (preparing its metadata
# fetches its build backend, scikit-build-core, as any pip download of an sdist does) and its
# sha256 is checked against the one pinned here. Idempotent: nothing is downloaded when DIR already
# holds the unpacked tree. Needs python3 -m pip, sha256sum and tar. Not run by any test (it needs
# the network); `make test` runs it first.
set -euo pipefail
dir=${1:-.cache/llama.cpp}
version=0.3.36
# The sha256 of llama_cpp_python-0.3.36.tar.gz as first downloaded (2026-11-29).
expected=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
src=$dir/llama_cpp_python-$version/vendor/llama.cpp
if [ -f "$src/CMakeLists.txt" ]; then
  echo "fetch_llamacpp_sdist: $src is present"
  exit 0
fi
mkdir -p "$dir"
archive=$dir/llama_cpp_python-$version.tar.gz
if [ ! -f "$archive" ] || [ "$(sha256sum "$archive" | cut -d' ' -f1)" != "$expected" ]; then
  echo "fetch_llamacpp_sdist: downloading llama-cpp-python $version's source distribution (about 77 MB) from PyPI"
  tmp=$dir/.download
  rm -rf "$tmp"
  python3 -m pip download --no-binary :all: --no-deps -d "$tmp" "llama-cpp-python==$version" >&2
  got=$(sha256sum "$tmp/llama_cpp_python-$version.tar.gz" | cut -d' ' -f1)
  if [ "$got" != "$expected" ]; then
    echo "fetch_llamacpp_sdist: the download's sha256 $got is not the pinned $expected" >&2
    exit 1
  fi
  mv -f "$tmp/llama_cpp_python-$version.tar.gz" "$archive"
  rm -rf "$tmp"
fi
tar -xzf "$archive" -C "$dir"
echo "fetch_llamacpp_sdist: unpacked $src"
