"""clients/python/shardlm_client/_stubs.py - the generated gRPC stubs of shardlm.v1: in an
installed package, those that setup.py generated at build time (shardlm_client/_generated/);
from a source checkout, made on first use from protos/ with grpc_tools.protoc (grpcio-tools)
and cached. Never committed.

Where they go: $SHARDLM_PY_STUBS_DIR when set, else
~/.cache/shardlm/python-stubs/<hash of the .proto>. Where the .proto comes from:
$SHARDLM_PROTO_DIR, else the protos/ folder of the checkout this package lives in.
Not here: the typed wrapper (client.py). Tests: tests/server/ import the package as the build
installed it (clients/python.cmake), with bundled stubs; tests/test_python_package.sh a wheel."""
import hashlib
import importlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

PROTO = "shardlm/v1/text_generation.proto"


def proto_dir() -> Path:
    env = os.environ.get("SHARDLM_PROTO_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "protos"


def _generate(src: Path, out: Path) -> None:
    from grpc_tools import protoc  # grpcio-tools

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".stubs-", dir=out.parent))
    rc = protoc.main(["grpc_tools.protoc", f"-I{src}", f"--python_out={tmp}", f"--pyi_out={tmp}",
                      f"--grpc_python_out={tmp}", PROTO])
    if rc != 0:
        raise RuntimeError(f"grpc_tools.protoc failed ({rc}) on {src / PROTO}")
    try:
        os.replace(tmp, out)  # atomic: concurrent first uses do not see half-written stubs
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another process got there first
        if not (out / "shardlm/v1/text_generation_pb2_grpc.py").exists():
            raise


def load():
    """Returns (text_generation_pb2, text_generation_pb2_grpc)."""
    bundled = Path(__file__).resolve().parent / "_generated"  # an installed package (setup.py)
    if (bundled / "shardlm/v1/text_generation_pb2_grpc.py").exists():
        if str(bundled) not in sys.path:
            sys.path.insert(0, str(bundled))
        return (importlib.import_module("shardlm.v1.text_generation_pb2"),
                importlib.import_module("shardlm.v1.text_generation_pb2_grpc"))
    src = proto_dir()
    proto = src / PROTO
    if not proto.exists():
        raise FileNotFoundError(f"{proto} not found: set SHARDLM_PROTO_DIR to the protos/ folder")
    digest = hashlib.sha256(proto.read_bytes()).hexdigest()[:16]
    base = os.environ.get("SHARDLM_PY_STUBS_DIR")
    out = Path(base) / digest if base else Path.home() / ".cache/shardlm/python-stubs" / digest
    if not (out / "shardlm/v1/text_generation_pb2_grpc.py").exists():
        _generate(src, out)
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    pb2 = importlib.import_module("shardlm.v1.text_generation_pb2")
    pb2_grpc = importlib.import_module("shardlm.v1.text_generation_pb2_grpc")
    return pb2, pb2_grpc
