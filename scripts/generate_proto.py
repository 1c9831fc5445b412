"""Regenerate inferpool/protocol/generated/ from inferpool/protocol/grpc_predict_v2.proto.

Run from the repository root: ``python scripts/generate_proto.py``. Needs grpcio-tools.
The generated modules are checked in; their protobuf/grpcio runtime checks set the lower
bounds of ``protobuf`` and ``grpcio`` in pyproject.toml, so bump those after regenerating.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTOCOL = ROOT / "inferpool" / "protocol"
PROTO = PROTOCOL / "grpc_predict_v2.proto"
OUT = PROTOCOL / "generated"
HEADER = '"""Generated from grpc_predict_v2.proto by scripts/generate_proto.py; do not edit."""\n'


POOL_LINE = "POOL = _descriptor_pool.DescriptorPool()\n"


def _edit(path: Path, *replacements: tuple[str, str]) -> None:
    text = path.read_text()
    for old, new in replacements:
        if text.count(old) != 1:
            sys.exit(f"{path.name}: expected {old!r} once; has protoc's output changed?")
        text = text.replace(old, new)
    path.write_text(text)


def generate() -> None:
    OUT.mkdir(exist_ok=True)
    include = Path(protoc.__file__).parent / "_proto"
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{PROTOCOL}",
            f"-I{include}",
            f"--python_out={OUT}",
            f"--pyi_out={OUT}",
            f"--grpc_python_out={OUT}",
            str(PROTO),
        ]
    )
    if status != 0:
        sys.exit(f"protoc failed with status {status}")
    _edit(
        OUT / "grpc_predict_v2_pb2.py",
        # Our own descriptor pool: tritonclient (and MLServer) register the same
        # ``inference.*`` names in the default pool, and both must import in one process.
        ("_descriptor_pool.Default().AddSerializedFile(", "POOL.AddSerializedFile("),
        (
            "_runtime_version.ValidateProtobufRuntimeVersion(",
            POOL_LINE + "_runtime_version.ValidateProtobufRuntimeVersion(",
        ),
    )
    # protoc writes a top-level import; the package needs a relative one.
    _edit(
        OUT / "grpc_predict_v2_pb2_grpc.py",
        ("\nimport grpc_predict_v2_pb2 as", "\nfrom . import grpc_predict_v2_pb2 as"),
    )
    (OUT / "__init__.py").write_text(HEADER)


if __name__ == "__main__":
    generate()
    print(f"generated {', '.join(sorted(p.name for p in OUT.iterdir() if p.is_file()))}")
