# The parallel runtime's communication layer (engine/parallel/parallel.h), included from
# tests/CMakeLists.txt. Runs as a world of one (no MPI at all) and under mpirun with 2, 3 and 4
# ranks on however many cores there are (--oversubscribe). Open MPI refuses to run as root
# unless told twice; the single-copy (CMA) mechanism is turned off because containers often
# forbid the ptrace-style access it needs (docs/parallel.md). The NCCL tests need one GPU per
# rank: label gpu, SKIP (77) otherwise.
find_package(MPI REQUIRED COMPONENTS C)

shardlm_test_exe(test_parallel test_parallel.c)

set(SHARDLM_MPI_TEST_ENV
    "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_btl_vader_single_copy_mechanism=none;OMPI_MCA_rmaps_base_oversubscribe=1")
if(SHARDLM_SANITIZE)
  # Open MPI's own allocations that live until exit are not ours: suppressed by library name
  # (tests/lsan_mpi.supp), which needs full stacks (the slow unwinder).
  list(APPEND SHARDLM_MPI_TEST_ENV
       "LSAN_OPTIONS=fast_unwind_on_malloc=0:suppressions=${CMAKE_CURRENT_SOURCE_DIR}/lsan_mpi.supp:print_suppressions=0")
endif()

function(shardlm_mpi_test name nranks labels)
  add_test(NAME ${name}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${nranks} --oversubscribe
                   ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_parallel> ${MPIEXEC_POSTFLAGS} ${ARGN})
  set_tests_properties(${name} PROPERTIES LABELS "${labels}" SKIP_RETURN_CODE 77 TIMEOUT 120
                       ENVIRONMENT "${SHARDLM_MPI_TEST_ENV}")
endfunction()

add_test(NAME parallel_world1 COMMAND test_parallel)
set_tests_properties(parallel_world1 PROPERTIES LABELS "unit;mpi" SKIP_RETURN_CODE 77 TIMEOUT 120
                     ENVIRONMENT "${SHARDLM_MPI_TEST_ENV}")
shardlm_mpi_test(parallel_mpi2 2 "unit;mpi")
shardlm_mpi_test(parallel_mpi3 3 "unit;mpi")
shardlm_mpi_test(parallel_mpi4 4 "unit;mpi")

# A hung rank: rank 0 must report it after its 1 s timeout. Rank 0 then leaves without
# MPI_Finalize (which would wait for the hung rank), so mpirun's exit status is not ours to
# judge: the test passes on rank 0's verdict line.
shardlm_mpi_test(parallel_mpi2_hang 2 "unit;mpi" --hang)
set_tests_properties(parallel_mpi2_hang PROPERTIES PASS_REGULAR_EXPRESSION "hang: PASS"
                     FAIL_REGULAR_EXPRESSION "FAIL;Sanitizer" TIMEOUT 60)

add_test(NAME parallel_nccl_world1 COMMAND test_parallel --nccl)
set_tests_properties(parallel_nccl_world1 PROPERTIES LABELS "gpu" SKIP_RETURN_CODE 77 TIMEOUT 120)
shardlm_mpi_test(parallel_nccl_mpi2 2 "gpu;mpi" --nccl)
# Two ranks on one GPU (SHARDLM_SHARE_GPU=1: NCCL over loopback sockets), for machines with one.
shardlm_mpi_test(parallel_nccl_mpi2_shared 2 "gpu;mpi" --nccl)
set_tests_properties(parallel_nccl_mpi2_shared PROPERTIES ENVIRONMENT "${SHARDLM_MPI_TEST_ENV};SHARDLM_SHARE_GPU=1")
# The same on the CUDA emulator with its NCCL (tests/CMakeLists.txt's last section).
if(TARGET shardlm_nccl_emu)
  add_test(NAME parallel_nccl_world1_emu COMMAND test_parallel --nccl)
  shardlm_mpi_test(parallel_nccl_mpi2_emu 2 "cuda_emu;mpi" --nccl)
  shardlm_mpi_test(parallel_nccl_mpi2_shared_emu 2 "cuda_emu;mpi" --nccl)
  set_property(GLOBAL APPEND PROPERTY SHARDLM_EMU_TESTS parallel_nccl_world1 parallel_nccl_mpi2
               parallel_nccl_mpi2_shared)
endif()
