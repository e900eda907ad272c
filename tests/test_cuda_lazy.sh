#!/usr/bin/env bash
# tests/test_cuda_lazy.sh SHARDLM - issue 30: a CPU run never maps a CUDA library. In builds with
# the CUDA backend, libshardlm_cuda.so (cuBLAS, cuBLASLt, the CUDA runtime) and
# libshardlm_nccl.so are dlopen()ed only when a CUDA device or an NCCL group is opened
# (kernels/backend_lib.c): `generate` and `serve` on the CPU must load none of them (checked in
# /proc/PID/maps of a running server and in the dynamic loader's own log of a generate run);
# `--device cuda` loads the library (then runs, or says no device is usable); a missing library
# is a clear error naming its path. SKIP in builds without CUDA and without the shared assets.
set -u
shardlm=$1
assets=${SHARDLM_ASSETS:-$(dirname "$0")/../../shared/assets}
if ! "$shardlm" version | grep -q "CUDA backend compiled"; then
  echo "SKIP: this shardlm has no CUDA backend (or libshardlm_cuda.so is not found)"
  exit 77
fi
if [ ! -f "$assets/stories260K/stories260K.bin" ]; then
  echo "SKIP: no stories260K in $assets (no shared assets)"
  exit 77
fi
. "$(dirname "$0")/check.sh"
cuda_libs='libshardlm_cuda|libshardlm_nccl|libcublas|libcublasLt|libcudart|libnccl|libcuda\.so'

"$shardlm" convert llama2c --checkpoint "$assets/stories260K/stories260K.bin" \
  --tokenizer "$assets/stories260K/tok512.model" --out "$tmp/model" > /dev/null 2>&1
check "convert the stories260K checkpoint" $?

# generate on the CPU: the loader's log names every object it maps, dlopen()ed ones included.
LD_DEBUG=files LD_DEBUG_OUTPUT="$tmp/ld" "$shardlm" generate --model "$tmp/model" \
  --prompt "Once upon a time" --max-tokens 16 > "$tmp/gen" 2> "$tmp/gen.err"
check "generate on the CPU runs" $?
cat "$tmp"/ld.* > "$tmp/ld" 2> /dev/null
grep -q "file=" "$tmp/ld"; check "the loader's log was written (LD_DEBUG=files)" $?
! grep -Eq "file=[^ ]*($cuda_libs)" "$tmp/ld"
rc=$? # saved: the command substitution in the name below would reset $?
check "generate on the CPU maps no CUDA library ($(grep -Eo "file=[^ ]*($cuda_libs)[^ ]*" "$tmp/ld" | sort -u | tr '\n' ' '))" $rc

# serve on the CPU: the maps of the running server, once it listens.
"$shardlm" serve --model "$tmp/model" --listen 127.0.0.1:0 > "$tmp/serve" 2> "$tmp/serve.err" &
pid=$!
for _ in $(seq 1 300); do
  [ -s "$tmp/serve" ] && break
  kill -0 "$pid" 2> /dev/null || break
  sleep 0.1
done
[ -s "$tmp/serve" ]; check "serve on the CPU starts and listens" $?
maps=$(cat "/proc/$pid/maps" 2> /dev/null)
[ -n "$maps" ] && ! grep -Eq "$cuda_libs" <<< "$maps"
rc=$?
check "serve on the CPU maps no CUDA library ($(grep -Eo "[^ /]*($cuda_libs)[^ ]*" <<< "$maps" | sort -u | tr '\n' ' '))" $rc
kill "$pid" 2> /dev/null
wait "$pid" 2> /dev/null

# --device cuda loads the library: it generates on a GPU, or says no CUDA device is usable
# (never that the library or one of its symbols is missing).
LD_DEBUG=files LD_DEBUG_OUTPUT="$tmp/ldc" "$shardlm" generate --model "$tmp/model" --device cuda \
  --prompt "Once upon a time" --max-tokens 4 > /dev/null 2> "$tmp/cuda.err"
rc=$?
cat "$tmp"/ldc.* > "$tmp/ldc" 2> /dev/null
grep -q "file=[^ ]*libshardlm_cuda.so" "$tmp/ldc"; check "--device cuda loads libshardlm_cuda.so" $?
[ "$rc" = 0 ] || { grep -q "CUDA device" "$tmp/cuda.err" && ! grep -q "cannot load" "$tmp/cuda.err"; }
ok=$?
check "--device cuda runs or names the missing device (rc $rc: $(head -c 200 "$tmp/cuda.err"))" $ok

# A missing library: STATUS_UNAVAILABLE naming the path, exit 1, no crash.
SHARDLM_CUDA_LIB=$tmp/none/libshardlm_cuda.so "$shardlm" generate --model "$tmp/model" \
  --device cuda --max-tokens 4 > /dev/null 2> "$tmp/none.err"
rc=$?
[ "$rc" = 1 ] && grep -q "cannot load libshardlm_cuda.so: $tmp/none/libshardlm_cuda.so" "$tmp/none.err"
ok=$?
check "a missing libshardlm_cuda.so is a clear error (rc $rc: $(head -c 200 "$tmp/none.err"))" $ok
check_summary
