#!/usr/bin/env bash
# tools/install_deps.sh - installs what shardlm needs to build and test, and nothing when all
# of it is already present (idempotent). Debian packages through apt-get, Python test
# dependencies through pip. The CUDA toolkit is not installed here: the build compiles the
# CUDA backend when nvcc is found (/usr/local/cuda on the build machines).
set -euo pipefail

DEBS=(
  build-essential cmake pkg-config
  libgrpc-dev libprotobuf-c-dev protobuf-c-compiler
  libsentencepiece-dev
  libopenmpi-dev openmpi-bin
  libopenblas-dev
  libcjson-dev libmicrohttpd-dev
  libpcre2-dev libicu-dev
  openssl
  unzip python3-venv
  iproute2
  clang libomp-dev
)
PYMODS=(numpy wheel grpc grpc_tools grpc_health grpc_reflection gguf jax optax openai prometheus_client tokenizers llguidance jsonschema jinja2 anthropic tiktoken sentencepiece scipy langchain_openai openai_harmony)  # python import names
PYPKGS=(numpy wheel grpcio grpcio-tools grpcio-health-checking grpcio-reflection gguf "jax[cpu]" optax openai prometheus_client tokenizers "llguidance==1.9.1" jsonschema jinja2 anthropic tiktoken sentencepiece scipy langchain-openai "openai-harmony==0.0.8")  # matching pip names
# llguidance (no torch) and jsonschema: the oracles of the grammar engine (tests/test_grammar.py) and
# of the structured outputs (tests/server/test_structured.py); jinja2: the templates' (test_jinja.py).
# tiktoken and sentencepiece: the oracles of the tiktoken rank-file loader (tests/test_tiktoken.py), of
# SentencePiece with its own template (tests/test_sp_chat.py) and
# of the Precompiled normalizer (its charsmap; tests/test_tokenizer_kinds.py).
# jax (CPU wheels) and optax: the independent autodiff and optimizer the training tests compare
# against (tests/test_train_grad.py, test_train_step.py). Never torch: its wheels pull CUDA.
# openai-harmony: OpenAI's own reader of GPT-OSS's harmony format, the oracle of the harmony reply
# parser (tests/test_harmony.py; offline on .cache/tiktoken's o200k_base).
# langchain-openai: LangChain's ChatOpenAI, a second real client of tools and structured outputs
# (tests/server/test_langchain.py).
# openai and prometheus_client: the official OpenAI SDK and Prometheus' text parser that
# tests/server/test_http.py drives the HTTP front with. wheel (and python3-venv): building and
# installing clients/python as a user does (tests/test_python_package.sh). iproute2: the network
# namespaces that tests/test_multinode.sh makes "nodes" of.

missing=()
for p in "${DEBS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install_deps: apt-get install ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

PY=${PYTHON:-python3}
pymissing=()
for i in "${!PYMODS[@]}"; do
  "$PY" -c "import ${PYMODS[$i]}" 2>/dev/null || pymissing+=("${PYPKGS[$i]}")
done
if [ ${#pymissing[@]} -gt 0 ]; then
  echo "install_deps: pip install ${pymissing[*]}"
  "$PY" -m pip install -q "${pymissing[@]}"
fi
exit 0
