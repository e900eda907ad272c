"""tools/client_import.py - how the tests and tools/soak.py import shardlm_client: from
$SHARDLM_PY_CLIENT (the copy the build installed with pip, which ctest names), or, run by hand
without it, from the checkout's clients/python with a note.
"""
import importlib
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = 77


def import_client():
    """shardlm_client from $SHARDLM_PY_CLIENT, never from clients/python when it is set. Exits 77
    (SKIP) when the build could not install it (pip, setuptools or grpcio-tools missing), 1 when
    its install failed or the package or its stubs came from anywhere else. Without the variable:
    the checkout's clients/python, with a note (its stubs generated on first import into a
    cache)."""
    where = os.environ.get("SHARDLM_PY_CLIENT")
    if not where:
        print(f"note: $SHARDLM_PY_CLIENT is not set: shardlm_client from the checkout ({ROOT / 'clients/python'}), "
              "not the installed package that ctest tests (BUILD/clients/python/site-packages)")
        sys.path.insert(0, str(ROOT / "clients/python"))
        return importlib.import_module("shardlm_client")
    where = Path(where).resolve()
    if (where / "FAILED.log").exists():
        print(f"FAIL: the build's pip install of the Python client failed:\n{(where / 'FAILED.log').read_text()}")
        sys.exit(1)
    if (where / "SKIP").exists() or not (where / "shardlm_client").is_dir():
        why = (where / "SKIP").read_text().strip() if (where / "SKIP").exists() else \
            f"no shardlm_client in {where}: build the python_client target"
        print(f"SKIP: {why}")
        sys.exit(SKIP)
    sys.path.insert(0, str(where))
    client = importlib.import_module("shardlm_client")
    stubs = Path(client.pb.__file__).resolve()
    if not Path(client.__file__).resolve().is_relative_to(where) or \
            not stubs.is_relative_to(where / "shardlm_client/_generated"):
        print(f"FAIL: shardlm_client ({client.__file__}, stubs {stubs}) not imported from {where}")
        sys.exit(1)
    print(f"shardlm_client from {Path(client.__file__).parent} (installed by the build)")
    return client
