#!/usr/bin/env bash
# tests/golden_setup.sh SHARDLM OUT_DIR - the ctest fixture of the golden model tests. Builds
# every expectation with the independent float64 NumPy references in tests/reference/ (never
# with shardlm itself), and the model directories the C tests load:
#   OUT/gpt2, OUT/llama_sharded_bf16, OUT/llama_f16     random HF checkpoints + reference.json
#   OUT/llama_mqa_v509, OUT/gpt2_v509                   odd vocabulary; one KV head (llama)
#   OUT/qwen2, OUT/qwen3                                 q/k/v biases; QK norm, wide heads
#   OUT/llama3_rope, OUT/yarn_rope                       rope_scaling llama3 and yarn
#   OUT/yarn_rope_untruncated                            yarn with truncate false (GPT-OSS's)
#   OUT/phi3, OUT/mistral                                fused weights, partial rotary, LongRoPE; windows
#   OUT/phi3_lora                                        phi3 + OUT/phi3_lora/adapter (PEFT, fused names)
#   OUT/gemma2                                           soft-capping, alternating windows
#   OUT/olmo2, OUT/olmo2_mqa                             post-norms only, whole-projection QK norm (1 KV head)
#   OUT/mixtral, OUT/qwen3_moe, OUT/olmoe                mixtures of experts
#   OUT/gpt_oss                                          GPT-OSS: sinks, alternating windows, YaRN
#                                                        (truncate false), clamped SwiGLU experts
#   OUT/stories260K                                     `shardlm convert llama2c` of the asset
#   OUT/stories260K_ref.json                            NumPy greedy ids and logits
# Without the shared assets the stories260K part is left out (the C test then SKIPs it).
set -euo pipefail
shardlm=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
assets=${SHARDLM_ASSETS:-$here/../../shared/assets}
rm -rf "$out"
mkdir -p "$out"
"$py" "$here/reference/make_models.py" gpt2 --out "$out/gpt2" --seed 1
"$py" "$here/reference/make_models.py" llama --out "$out/llama_sharded_bf16" --seed 2 --dtype bf16 --shards 2
"$py" "$here/reference/make_models.py" llama --out "$out/llama_f16" --seed 3 --dtype f16
# Odd vocabulary (vocab-parallel padding) and one KV head (replicated when tp > 1).
"$py" "$here/reference/make_models.py" llama --out "$out/llama_mqa_v509" --seed 4 --vocab 509 --kv-heads 1
"$py" "$here/reference/make_models.py" gpt2 --out "$out/gpt2_v509" --seed 5 --vocab 509
# Qwen 2 (q/k/v biases) and Qwen 3 (QK norm, head_dim 16 with 8 heads on a hidden size of 64).
"$py" "$here/reference/make_models.py" qwen2 --out "$out/qwen2" --seed 6
"$py" "$here/reference/make_models.py" qwen3 --out "$out/qwen3" --seed 7
# Scaled rotary embeddings: Llama 3's (every frequency band: kept, smoothed, divided) and YaRN's
# (a ramp, and the attention factor on cos and sin), with a small original context so that the
# scaling changes the prompt's logits.
"$py" "$here/reference/make_models.py" llama --out "$out/llama3_rope" --seed 8 --rope-scaling \
  '{"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}'
"$py" "$here/reference/make_models.py" llama --out "$out/yarn_rope" --seed 9 --rope-scaling \
  '{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}'
"$py" "$here/reference/make_models.py" llama --out "$out/yarn_rope_untruncated" --seed 9 --rope-scaling \
  '{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "truncate": false}'
# Dynamic NTK: transformers rescales only beyond max_position_embeddings, never reached here.
"$py" "$here/reference/make_models.py" llama --out "$out/dynamic_rope" --seed 13 --rope-scaling \
  '{"rope_type": "dynamic", "factor": 2.0}'
# Phi-3 (fused qkv_proj / gate_up_proj, partial rotary 0.75, LongRoPE, a sliding window of 10) and
# Mistral (a sliding window of 10): both windows shorter than the prompt and the greedy run.
"$py" "$here/reference/make_models.py" phi3 --out "$out/phi3" --seed 10
"$py" "$here/reference/make_models.py" mistral --out "$out/mistral" --seed 11
# The same Phi-3 with a PEFT LoRA adapter in its fused module names (qkv_proj, gate_up_proj):
# the reference is the adapted model's (W + s B A per part, float64).
"$py" "$here/reference/make_models.py" phi3 --out "$out/phi3_lora" --seed 10 --peft-lora
# Gemma 2: soft-capped attention scores and final logits, every other layer windowed (window 5,
# shorter than the prompt), sandwich norms, GeGLU, tied embeddings.
"$py" "$here/reference/make_models.py" gemma2 --out "$out/gemma2" --seed 12
# OLMo 2: post-norms only, q and k normed over the whole projection.
"$py" "$here/reference/make_models.py" olmo2 --out "$out/olmo2" --seed 14
# The same with one KV head (its whole-projection k norm at tp 2 would see a replicated head).
"$py" "$here/reference/make_models.py" olmo2 --out "$out/olmo2_mqa" --seed 15 --kv-heads 1
# Mixtures of experts: Mixtral (8 experts, top 2, renormalised), Qwen 3 MoE (6 experts, top 3, not
# renormalised, per-head QK norm), OLMoE (4 experts, top 2, whole-projection QK norm).
"$py" "$here/reference/make_models.py" mixtral --out "$out/mixtral" --seed 21
"$py" "$here/reference/make_models.py" qwen3_moe --out "$out/qwen3_moe" --seed 22
"$py" "$here/reference/make_models.py" olmoe --out "$out/olmoe" --seed 23
# Qwen 2 MoE: q, k, v biases, 4 experts top 2, and a shared expert behind its sigmoid gate.
"$py" "$here/reference/make_models.py" qwen2_moe --out "$out/qwen2_moe" --seed 24
# MiniMax-M2: 6 experts top 2 behind a sigmoid router whose top k a per-expert bias selects (the
# maker asserts the bias moves the logits), whole-projection QK norm, 4 of 8 features rotated.
"$py" "$here/reference/make_models.py" minimax_m2 --out "$out/minimax_m2" --seed 25
# GLM-4.5: a dense first layer (intermediate 96), then 8 experts top 2 behind DeepSeek-V3's router
# (sigmoid, selection bias, 4 groups of which the best 2 are eligible, routed_scaling_factor 2.5)
# with a plain shared expert; q/k/v biases, half of each head rotated; the MTP layer's tensors in the
# file, unread. The maker asserts each of those choices moves the logits (glm_ref.VARIANTS). Seed
# 35: the least greedy margin 0.13.
"$py" "$here/reference/make_models.py" glm4_moe --out "$out/glm4_moe" --seed 35
# GPT-OSS: attention sinks, q/k/v/o biases, layers 0 and 2 windowed (window 4), YaRN factor 32
# untruncated, 4 experts top 2 with a router bias, the clamped "+1" SwiGLU. Seed 36: the least
# greedy margin 0.069 (0.080 in bf16), the least gap between the 2nd and 3rd router logit 0.022.
# make_models.py asserts that the prompt reaches both clamps and a choice the router bias makes.
"$py" "$here/reference/make_models.py" gpt_oss --out "$out/gpt_oss" --seed 36
if [ -f "$assets/stories260K/stories260K.bin" ] && [ -f "$assets/stories260K/tok512.model" ]; then
  "$shardlm" convert llama2c --checkpoint "$assets/stories260K/stories260K.bin" \
    --tokenizer "$assets/stories260K/tok512.model" --out "$out/stories260K"
  "$py" "$here/reference/llama2c_ref.py" --checkpoint "$assets/stories260K/stories260K.bin" \
    --steps 120 --json > "$out/stories260K_ref.json"
else
  echo "golden_setup: SKIP stories260K: no assets at $assets"
fi
