"""Regenerate inferpool/protocol/generated/ from inferpool/protocol/grpc_predict_v2.proto and
inferpool/protocol/inferpool_ext.proto (inferpool's own services, which use the V2 messages),
model_repository_pb2.py from inferpool/protocol/model_repository.proto (MLServer's
``inference.model_repository`` service), and health_pb2.py from
inferpool/protocol/health.proto: only its descriptor is used, by gRPC reflection (the health
messages themselves are coded by hand, protocol/health.py).

Run from the repository root: ``python scripts/generate_proto.py``. Needs grpcio-tools
(``pip install inferpool[proto]``). The generated modules are checked in. protoc makes them
refuse, at import, a protobuf or grpcio runtime older than the generator; the post-edit below
removes both checks, so that inferpool shares one environment with clients that pin older
majors (tritonclient and MLServer want protobuf<7). The code that remains (``_builder``,
``_loaded_options``, our own descriptor pool) works from protobuf 5.29 and grpcio 1.63 on: the
``lowest`` tox environment (tests/constraints/lowest.txt) holds pyproject.toml's lower bounds
to that.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTOCOL = ROOT / "inferpool" / "protocol"
PROTO = PROTOCOL / "grpc_predict_v2.proto"
EXT_PROTO = PROTOCOL / "inferpool_ext.proto"
REPOSITORY_PROTO = PROTOCOL / "model_repository.proto"
HEALTH_PROTO = PROTOCOL / "health.proto"
OUT = PROTOCOL / "generated"
HEADER = (
    '"""Generated from grpc_predict_v2.proto, inferpool_ext.proto and model_repository.proto\n'
    'by scripts/generate_proto.py; do not edit."""\n'
)


POOL_LINE = "POOL = _descriptor_pool.DescriptorPool()\n"


# protoc's runtime version checks, each removed whole by the post-edit (see the docstring).
PROTOBUF_CHECK = (
    r"from google\.protobuf import runtime_version as _runtime_version\n",
    r"_runtime_version\.ValidateProtobufRuntimeVersion\(\n(?:    .*\n)*?\)\n",
)
GRPC_CHECK = (
    r"\nGRPC_GENERATED_VERSION = .*\n(?:.*\n)*?if _version_not_supported:\n"
    r"    raise RuntimeError\(\n(?:        .*\n)*?    \)\n",
)


def _edit(path: Path, *replacements: tuple[str, str]) -> None:
    text = path.read_text()
    for old, new in replacements:
        if text.count(old) != 1:
            sys.exit(f"{path.name}: expected {old!r} once; has protoc's output changed?")
        text = text.replace(old, new)
    path.write_text(text)


def _strip(path: Path, *patterns: str) -> None:
    text = path.read_text()
    for pattern in patterns:
        text, count = re.subn(pattern, "", text)
        if count != 1:
            sys.exit(f"{path.name}: expected {pattern!r} once; has protoc's output changed?")
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
            str(EXT_PROTO),
            str(REPOSITORY_PROTO),
        ]
    )
    if status != 0:
        sys.exit(f"protoc failed with status {status}")
    # health.proto: messages only (no stubs, no stub file), for the descriptor.
    status = protoc.main(
        ["grpc_tools.protoc", f"-I{PROTOCOL}", f"--python_out={OUT}", str(HEALTH_PROTO)]
    )
    if status != 0:
        sys.exit(f"protoc failed with status {status}")
    _edit(
        OUT / "health_pb2.py",
        ("_descriptor_pool.Default().AddSerializedFile(", "POOL.AddSerializedFile("),
        (
            "# @@protoc_insertion_point(imports)",
            "from .grpc_predict_v2_pb2 import POOL\n# @@protoc_insertion_point(imports)",
        ),
    )
    _strip(OUT / "health_pb2.py", *PROTOBUF_CHECK)
    _edit(
        OUT / "grpc_predict_v2_pb2.py",
        # Our own descriptor pool: tritonclient (and MLServer) register the same
        # ``inference.*`` names in the default pool, and both must import in one process.
        ("_descriptor_pool.Default().AddSerializedFile(", "POOL.AddSerializedFile("),
        (
            "# @@protoc_insertion_point(imports)",
            POOL_LINE + "# @@protoc_insertion_point(imports)",
        ),
    )
    _strip(OUT / "grpc_predict_v2_pb2.py", *PROTOBUF_CHECK)
    # protoc writes a top-level import; the package needs a relative one.
    _edit(
        OUT / "grpc_predict_v2_pb2_grpc.py",
        ("\nimport grpc_predict_v2_pb2 as", "\nfrom . import grpc_predict_v2_pb2 as"),
    )
    _strip(OUT / "grpc_predict_v2_pb2_grpc.py", *GRPC_CHECK)
    # The extension's messages live in the V2 file's pool, where the messages it uses are.
    _edit(
        OUT / "inferpool_ext_pb2.py",
        ("_descriptor_pool.Default().AddSerializedFile(", "POOL.AddSerializedFile("),
        (
            "import grpc_predict_v2_pb2 as grpc__predict__v2__pb2\n",
            "from . import grpc_predict_v2_pb2 as grpc__predict__v2__pb2\n"
            "from .grpc_predict_v2_pb2 import POOL\n",
        ),
    )
    _strip(OUT / "inferpool_ext_pb2.py", *PROTOBUF_CHECK)
    _edit(
        OUT / "inferpool_ext_pb2.pyi",
        ("import grpc_predict_v2_pb2 as", "from . import grpc_predict_v2_pb2 as"),
    )
    _edit(
        OUT / "inferpool_ext_pb2_grpc.py",
        ("\nimport inferpool_ext_pb2 as", "\nfrom . import inferpool_ext_pb2 as"),
    )
    _strip(OUT / "inferpool_ext_pb2_grpc.py", *GRPC_CHECK)
    # MLServer's repository service: in the same pool (its package is its own).
    _edit(
        OUT / "model_repository_pb2.py",
        ("_descriptor_pool.Default().AddSerializedFile(", "POOL.AddSerializedFile("),
        (
            "# @@protoc_insertion_point(imports)",
            "from .grpc_predict_v2_pb2 import POOL\n# @@protoc_insertion_point(imports)",
        ),
    )
    _strip(OUT / "model_repository_pb2.py", *PROTOBUF_CHECK)
    _edit(
        OUT / "model_repository_pb2_grpc.py",
        ("\nimport model_repository_pb2 as", "\nfrom . import model_repository_pb2 as"),
    )
    _strip(OUT / "model_repository_pb2_grpc.py", *GRPC_CHECK)
    (OUT / "__init__.py").write_text(HEADER)


if __name__ == "__main__":
    generate()
    print(f"generated {', '.join(sorted(p.name for p in OUT.iterdir() if p.is_file()))}")
