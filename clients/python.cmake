# clients/python.cmake - the Python client (clients/python/) installed into the build tree for
# the tests. Target python_client (part of `all`): pip installs the package, as a user would,
# into build/clients/python/site-packages (SHARDLM_PY_CLIENT_DIR), from a copy of clients/python
# so that nothing is written into the checkout; setup.py generates the gRPC stubs into the
# package from protos/, as it does for a wheel. It runs again when the package's sources, its
# build files or the .proto change. The Python tests (tests/server/, tools/soak.py under ctest)
# import shardlm_client from that directory alone, passed as $SHARDLM_PY_CLIENT.
# Offline and without the network: pip runs with --no-index --no-build-isolation --no-deps and
# uses this Python's setuptools and grpcio-tools. Without them the build goes on with a note and
# the tests SKIP; a failed pip install leaves FAILED.log there and the tests FAIL
# (clients/python_install.cmake). Not here: the wheel in a fresh venv (tests/test_python_package.sh).
set(SHARDLM_PY_CLIENT_DIR ${CMAKE_CURRENT_BINARY_DIR}/python/site-packages CACHE INTERNAL
    "the Python client installed for the tests (clients/python.cmake)")
set(py_src ${CMAKE_CURRENT_SOURCE_DIR}/python)
file(GLOB py_package_sources CONFIGURE_DEPENDS ${py_src}/shardlm_client/*.py)
set(py_stamp ${CMAKE_CURRENT_BINARY_DIR}/python/site-packages.stamp)
add_custom_command(
  OUTPUT ${py_stamp}
  COMMAND ${CMAKE_COMMAND} -DPYTHON=${Python3_EXECUTABLE} -DSRC=${py_src}
          -DPROTO_DIR=${PROJECT_SOURCE_DIR}/protos -DWORK=${CMAKE_CURRENT_BINARY_DIR}/python
          -DDEST=${SHARDLM_PY_CLIENT_DIR} -DSTAMP=${py_stamp}
          -P ${CMAKE_CURRENT_SOURCE_DIR}/python_install.cmake
  DEPENDS ${py_package_sources} ${py_src}/setup.py ${py_src}/pyproject.toml ${py_src}/README.md
          ${PROJECT_SOURCE_DIR}/protos/shardlm/v1/text_generation.proto
          ${CMAKE_CURRENT_SOURCE_DIR}/python_install.cmake
  COMMENT "pip install clients/python into ${SHARDLM_PY_CLIENT_DIR}"
  VERBATIM)
add_custom_target(python_client ALL DEPENDS ${py_stamp})
