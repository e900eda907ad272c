"""clients/python/setup.py - the one build step pyproject.toml cannot declare: generating the
gRPC stubs of protos/shardlm/v1/text_generation.proto (grpc_tools.protoc) into the built
package as shardlm_client/_generated/, which _stubs.load() prefers. The protos come from
$SHARDLM_PROTO_DIR, else ../../protos of this checkout. Not in ctest (it needs a fresh virtual environment and PyPI): checked by
`python3 -m venv v && v/bin/pip install ./clients/python`, then importing shardlm_client."""
import os
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PROTO = "shardlm/v1/text_generation.proto"


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        from grpc_tools import protoc

        here = Path(__file__).resolve().parent
        src = Path(os.environ.get("SHARDLM_PROTO_DIR", here.parents[1] / "protos"))
        if not (src / PROTO).exists():
            raise RuntimeError(f"{src / PROTO} not found: build from a shardlm checkout or set SHARDLM_PROTO_DIR")
        out = Path(self.build_lib) / "shardlm_client" / "_generated"
        out.mkdir(parents=True, exist_ok=True)
        rc = protoc.main(["grpc_tools.protoc", f"-I{src}", f"--python_out={out}", f"--pyi_out={out}",
                          f"--grpc_python_out={out}", PROTO])
        if rc != 0:
            raise RuntimeError(f"grpc_tools.protoc failed ({rc}) on {src / PROTO}")


setup(cmdclass={"build_py": BuildPyWithStubs})
