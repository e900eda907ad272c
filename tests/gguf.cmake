# The GGUF reader (engine/formats/gguf.h), included from tests/CMakeLists.txt. tests/gguf_setup.py
# writes small GGUF files and gguf-py's reference dequantizations (fixture gguf, SKIP (77)
# when gguf-py is not installed); test_gguf compares the reader against them and, when the
# Gemma 3 270M file has been fetched into .cache/ (docs/models.md), checks it too.
set(GGUF_FIXTURE_DIR ${CMAKE_BINARY_DIR}/gguf_fixtures)
set(GGUF_MODEL ${CMAKE_SOURCE_DIR}/.cache/gemma3-270m/gemma-3-270m-q4_k_m.gguf)

add_test(NAME gguf_setup COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/gguf_setup.py
         ${GGUF_FIXTURE_DIR})
set_tests_properties(gguf_setup PROPERTIES FIXTURES_SETUP gguf LABELS "unit;python"
                     SKIP_RETURN_CODE 77 TIMEOUT 120)

shardlm_test_exe(test_gguf test_gguf.c)
shardlm_add_test(gguf "unit" test_gguf ${GGUF_FIXTURE_DIR} ${GGUF_MODEL})
set_tests_properties(gguf PROPERTIES FIXTURES_REQUIRED gguf)

# A GGUF served as it is (checkpoint_gguf.c, blocks kept by model_load) on the tiny Gemma 3 of
# the same fixture; the real 270M file is golden_gemma3_gguf's.
shardlm_test_exe(test_gguf_serve test_gguf_serve.c)
shardlm_add_test(gguf_serve "unit" test_gguf_serve ${GGUF_FIXTURE_DIR})
set_tests_properties(gguf_serve PROPERTIES FIXTURES_REQUIRED gguf)
# The same file served on CUDA with its blocks against the CPU's dequantized f32 model.
shardlm_add_test(gguf_serve_cuda "gpu" test_gguf_serve ${GGUF_FIXTURE_DIR} --cuda)
set_tests_properties(gguf_serve_cuda PROPERTIES FIXTURES_REQUIRED gguf)

# A GGUF served with a LoRA adapter unmerged, against the float64 reference with the adapter
# merged (tests/reference/gemma3_ref.py) and against `convert gguf` + `merge-lora`; the server's
# default adapter (--default-adapter, what `make run` serves). Drives a real server over gRPC and
# HTTP, so labelled as the server tests are.
add_test(NAME server_gguf_lora
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/server/test_gguf_lora.py
                 --shardlm $<TARGET_FILE:shardlm> --fixtures ${GGUF_FIXTURE_DIR})
set_tests_properties(server_gguf_lora PROPERTIES FIXTURES_REQUIRED gguf LABELS "server;python" SKIP_RETURN_CODE 77
                     TIMEOUT 300 ENVIRONMENT "SHARDLM_PY_CLIENT=${SHARDLM_PY_CLIENT_DIR}")

# Kept-blocks checkpoints: ggml blocks in safetensors files, `convert gguf --keep-blocks`, reshard
# with blocks (tp 2 on block boundaries, the tp 4 refusal), on the fixture's tiny Gemma 3 files.
shardlm_test_exe(test_keep_blocks test_keep_blocks.c)
target_link_libraries(test_keep_blocks PRIVATE PkgConfig::CJSON)
shardlm_add_test(keep_blocks "unit" test_keep_blocks ${GGUF_FIXTURE_DIR})
set_tests_properties(keep_blocks PROPERTIES FIXTURES_REQUIRED gguf)
# The command line (convert --keep-blocks, generate, reshard --format hf of a GGUF, train and
# merge-lora on a kept-blocks directory) on the tiny file, and on the real Gemma 3 270M file when
# fetched (SKIP otherwise): its size, and generate from the kept-blocks directory and from
# `reshard --format hf` of the GGUF against the GGUF itself.
add_test(NAME keep_blocks_cli COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_keep_blocks.sh
         $<TARGET_FILE:shardlm> ${GGUF_FIXTURE_DIR}/tiny_gemma3_blocks.gguf)
set_tests_properties(keep_blocks_cli PROPERTIES FIXTURES_REQUIRED gguf LABELS "unit" SKIP_RETURN_CODE 77 TIMEOUT 120)
add_test(NAME gemma3_gguf_keep_blocks COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_keep_blocks.sh
         $<TARGET_FILE:shardlm> ${GGUF_MODEL})
set_tests_properties(gemma3_gguf_keep_blocks PROPERTIES LABELS "golden" SKIP_RETURN_CODE 77 TIMEOUT 300)
