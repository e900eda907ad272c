# The kernel tests again under each instruction-set ceiling (SHARDLM_CPU_ISA, kernels/cpu/
# cpu_isa.h: scalar, avx2, avx512, avx512-vnni, amx), so that every path a kernel family can take
# (the scalar fallbacks included) is exercised on the machines that can run it. Each variant,
# <test>_isa_<level> (label isa), goes through tests/isa_gate.c: a level this CPU lacks is
# reported as skipped (SKIP, exit 77), never as a pass. The plain tests run the best level.
shardlm_test_exe(isa_gate isa_gate.c)
shardlm_test_exe(test_cpu_isa test_cpu_isa.c)
shardlm_add_test(cpu_isa "unit" test_cpu_isa)

set(SHARDLM_ISA_LEVELS scalar avx2 avx512 avx512-vnni amx)
# shardlm_add_isa_tests(<name> <labels> <executable target> [args...]): one test per level.
function(shardlm_add_isa_tests name labels exe)
  foreach(level ${SHARDLM_ISA_LEVELS})
    add_test(NAME ${name}_isa_${level} COMMAND isa_gate $<TARGET_FILE:${exe}> ${ARGN})
    set_tests_properties(${name}_isa_${level} PROPERTIES LABELS "${labels};isa" SKIP_RETURN_CODE 77
                         TIMEOUT 600 ENVIRONMENT SHARDLM_CPU_ISA=${level})
  endforeach()
endfunction()

# The fixtures each variant needs, as its plain test.
function(shardlm_isa_fixtures name fixtures)
  foreach(level ${SHARDLM_ISA_LEVELS})
    set_tests_properties(${name}_isa_${level} PROPERTIES FIXTURES_REQUIRED "${fixtures}")
  endforeach()
endfunction()

shardlm_add_isa_tests(cpu_isa "unit" test_cpu_isa)
# Quantized products and dequantizer, every type (int8 per-row decode path, tiles for prefill).
shardlm_add_isa_tests(quant "unit" test_quant)
# Attention's inner kernels and the ops (attention, matmul's f32 one-row product, activations).
shardlm_add_isa_tests(attention_kernels "unit" test_attention_kernels)
shardlm_add_isa_tests(ops_cpu "unit" test_ops --backend cpu)
# bf16 and f16 weights read in place by the gemv, bit for bit the widened product.
shardlm_add_isa_tests(matmul_half "unit" test_matmul_half)
# A GGUF served from its blocks: tiny Gemma 3 (Q8_0), and every block type against float64.
shardlm_add_isa_tests(gguf_serve "unit" test_gguf_serve ${GGUF_FIXTURE_DIR})
shardlm_isa_fixtures(gguf_serve gguf)
shardlm_add_isa_tests(golden_gguf_types_blocks "golden" test_model ref ${GGUF_TYPES_DIR}/types.gguf
                      ${GGUF_TYPES_DIR}/types_ref.json)
shardlm_isa_fixtures(golden_gguf_types_blocks gguf_types)
foreach(level ${SHARDLM_ISA_LEVELS}) # the f32 tiles forced, as the plain test (tests/CMakeLists.txt)
  set_property(TEST golden_gguf_types_blocks_isa_${level} APPEND PROPERTY ENVIRONMENT SHARDLM_CPU_QUANT_SGEMM_MIN_M=32)
endforeach()
shardlm_add_isa_tests(golden_gguf_types_int8 "golden" test_model ref-int8 ${GGUF_TYPES_DIR}/types.gguf
                      ${GGUF_TYPES_DIR}/types_ref.json)
shardlm_isa_fixtures(golden_gguf_types_int8 gguf_types)
# The f32 one-row product's two orders (kernels/cpu/gemv.c: SHARDLM_CPU_GEMV_ROWS, by default 1
# on AMD and 8 elsewhere), each forced at the best level with both vector widths
# (SHARDLM_CPU_GEMV_BITS: 512 and 256, the latter the AMD default on AVX-512 CPUs) and at avx2, so
# every kernel runs on any CPU.
foreach(rows 1 8)
  foreach(level best best256 avx2)
    set(env SHARDLM_CPU_GEMV_ROWS=${rows})
    if(level STREQUAL "best" OR level STREQUAL "best256")
      add_test(NAME ops_cpu_gemv_rows${rows}_${level} COMMAND test_ops --backend cpu --filter matmul)
      add_test(NAME matmul_half_gemv_rows${rows}_${level} COMMAND test_matmul_half)
      if(level STREQUAL "best")
        list(APPEND env SHARDLM_CPU_GEMV_BITS=512)
      else()
        list(APPEND env SHARDLM_CPU_GEMV_BITS=256)
      endif()
    else()
      add_test(NAME ops_cpu_gemv_rows${rows}_${level} COMMAND isa_gate $<TARGET_FILE:test_ops> --backend cpu --filter matmul)
      add_test(NAME matmul_half_gemv_rows${rows}_${level} COMMAND isa_gate $<TARGET_FILE:test_matmul_half>)
      list(APPEND env SHARDLM_CPU_ISA=${level})
    endif()
    set_tests_properties(ops_cpu_gemv_rows${rows}_${level} matmul_half_gemv_rows${rows}_${level} PROPERTIES
                         LABELS "unit;isa" SKIP_RETURN_CODE 77 TIMEOUT 600 ENVIRONMENT "${env}")
  endforeach()
endforeach()
# The gemv's knobs as the CPU backend reads and names them (test_cpu_isa checks cpu_gemv_path).
foreach(knob SHARDLM_CPU_GEMV_BITS=256 SHARDLM_CPU_GEMV_BITS=512 SHARDLM_CPU_GEMV_ROWS=1 SHARDLM_CPU_GEMV_ROWS=8
        SHARDLM_CPU_BF16_DOT=0 SHARDLM_CPU_HUGEPAGES=0)
  string(REGEX REPLACE "SHARDLM_CPU_([A-Z0-9_]+)=([0-9]+)" "\\1\\2" suffix "${knob}")
  string(TOLOWER "${suffix}" suffix)
  add_test(NAME cpu_isa_${suffix} COMMAND test_cpu_isa)
  set_tests_properties(cpu_isa_${suffix} PROPERTIES LABELS "unit;isa" TIMEOUT 600 ENVIRONMENT "${knob}")
endforeach()
# Block-quantized products from 32 rows of x: dequantized tiles and sgemm (the default), or int8
# dot products at every row count (SHARDLM_CPU_QUANT_SGEMM_MIN_M, an opt-in), both forced.
foreach(minm 32 100000)
  add_test(NAME ops_cpu_quant_sgemm_min_m${minm} COMMAND test_ops --backend cpu --filter matmul)
  set_tests_properties(ops_cpu_quant_sgemm_min_m${minm} PROPERTIES LABELS "unit;isa" TIMEOUT 600
                       ENVIRONMENT SHARDLM_CPU_QUANT_SGEMM_MIN_M=${minm})
  add_test(NAME quant_sgemm_min_m${minm} COMMAND test_quant)
  set_tests_properties(quant_sgemm_min_m${minm} PROPERTIES LABELS "unit;isa" TIMEOUT 600
                       ENVIRONMENT SHARDLM_CPU_QUANT_SGEMM_MIN_M=${minm})
endforeach()
# Packed block weights on AMX tiles from another row count (kernels/cpu/matmul.c: 96 rows by
# default, SHARDLM_CPU_AMX_PACKED_MIN_M=N): test_quant's check_packed_backend checks both sides of
# it (SKIP where the CPU has no AMX).
add_test(NAME quant_amx_packed_min_m16 COMMAND test_quant)
set_tests_properties(quant_amx_packed_min_m16 PROPERTIES LABELS "unit;isa" TIMEOUT 600
                     ENVIRONMENT SHARDLM_CPU_AMX_PACKED_MIN_M=16)
