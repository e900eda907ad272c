#!/usr/bin/env bash
# tests/test_blas_core.sh SHARDLM MODEL_DIR - the OpenBLAS kernels shardlm runs (cli/main.c,
# cpu_blas_better_core): on a CPU with AVX2 and FMA, never OpenBLAS's pre-AVX2 kernels (Debian
# 12's OpenBLAS 0.3.21 picks "Prescott", its SSE3 sgemm, on an Emerald Rapids Xeon; shardlm then
# sets OPENBLAS_CORETYPE and runs itself again), and a user's OPENBLAS_CORETYPE is kept as given.
# Read from the "cpu:" line the CPU backend logs ("..., OpenBLAS NAME").
set -euo pipefail
shardlm=$1
model=$2
core() { # the OpenBLAS kernels named by the cpu: line of a one-token generate, with env "$@"
  env "$@" "$shardlm" generate --model "$model" --max-tokens 1 --threads 1 2>&1 >/dev/null |
    sed -n 's/.* cpu: .*, OpenBLAS \([A-Za-z0-9_]*\).*/\1/p' | head -n 1
}
fail=0
got=$(core -u OPENBLAS_CORETYPE)
old=" Prescott Core2 Penryn Dunnington Nehalem Atom Sandybridge Katmai Coppermine Northwood Banias Opteron Barcelona Bobcat Bulldozer Piledriver Steamroller Excavator Nano Unknown "
if [ -z "$got" ]; then
  echo "FAIL no 'OpenBLAS NAME' in the cpu: line"; fail=1
elif grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
  case "$old" in
    *" $got "*) echo "FAIL OpenBLAS runs its $got kernels on a CPU with AVX2 and FMA"; fail=1 ;;
    *) echo "PASS OpenBLAS runs its $got kernels on this CPU with AVX2 and FMA" ;;
  esac
else
  echo "note: no AVX2 + FMA here: OpenBLAS's own choice ($got) stands"
fi
got=$(core OPENBLAS_CORETYPE=Prescott)
if [ "$got" = Prescott ]; then echo "PASS a user's OPENBLAS_CORETYPE=Prescott is kept"
else echo "FAIL OPENBLAS_CORETYPE=Prescott given, OpenBLAS runs '$got'"; fail=1; fi
exit $fail
