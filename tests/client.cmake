# tests/client.cmake - included from tests/CMakeLists.txt: the C client against a real
# `shardlm serve` of stories260K. tests/test_client.sh starts the server and drives the
# subcommands (`shardlm complete|chat|bench`) and test_client_lib (the library, method by
# method). Label "server"; exits 77 (SKIP) when the assets are absent.
find_package(Threads REQUIRED)
add_executable(test_client_lib ${CMAKE_CURRENT_SOURCE_DIR}/test_client_lib.c)
target_link_libraries(test_client_lib PRIVATE shardlm_client Threads::Threads)
add_test(NAME client_c COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_client.sh
         $<TARGET_FILE:shardlm> $<TARGET_FILE:test_client_lib>)
set_tests_properties(client_c PROPERTIES LABELS "server" SKIP_RETURN_CODE 77 TIMEOUT 600)
