"""Regenerate the gRPC code in ``labeller/draplugin/api/`` from ``registration.proto`` and ``dra.proto``.

    python -m labeller.draplugin.generate            # needs grpcio-tools (the 'test' extra)

protoc writes ``import dra_pb2`` into the service modules; it is rewritten to a package import so
the generated code works as ``labeller.draplugin.api``. ``tests/draplugin/test_draplugin_generated.py``
runs ``generate`` into a temporary directory and fails when the committed files differ.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTOS = (HERE / "registration.proto", HERE / "dra.proto")
OUTPUT = HERE / "api"
GENERATED = tuple(f"{proto.stem}{suffix}" for proto in PROTOS for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"))
INIT = ('"""Generated from ../registration.proto and ../dra.proto by ``python -m labeller.draplugin.generate``; '
        'do not edit."""\n')


def generate(output: Path = OUTPUT) -> list[Path]:
    """Run protoc into ``output`` and return the files written."""
    # imported here: grpcio-tools is only needed to regenerate
    from grpc_tools import protoc  # type: ignore[import-untyped]

    output.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        code = protoc.main([
            "grpc_tools.protoc", f"-I{HERE}", f"--python_out={tmp}", f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}", *(str(proto) for proto in PROTOS),
        ])
        if code != 0:
            raise RuntimeError(f"protoc failed with exit code {code}")
        written = []
        for name in GENERATED:
            text = (Path(tmp) / name).read_text()
            for proto in PROTOS:
                module = f"{proto.stem}_pb2"
                text = text.replace(f"import {module} as {proto.stem}__pb2",
                                    f"from labeller.draplugin.api import {module} as {proto.stem}__pb2")
            (output / name).write_text(text)
            written.append(output / name)
    (output / "__init__.py").write_text(INIT)
    return [*written, output / "__init__.py"]


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else OUTPUT):
        print(path)
