"""Regenerating a plugin's gRPC code from its ``.proto`` files (a developer's tool: it needs
grpcio-tools, the 'test' extra). Each plugin's ``generate`` module names its protos and package;
a staleness test per plugin runs it into a temporary directory and compares.

protoc writes ``import x_pb2`` into the service modules; it is rewritten to a package import so the
generated code works as ``<package>``."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generated_names(protos: Sequence[Path]) -> tuple[str, ...]:
    return tuple(f"{proto.stem}{suffix}" for proto in protos for suffix in SUFFIXES)


def generate(protos: Sequence[Path], package: str, output: Path, init: str) -> list[Path]:
    """Run protoc on ``protos`` into ``output`` (the package ``package``); the files written."""
    from grpc_tools import protoc  # type: ignore[import-untyped]

    output.mkdir(parents=True, exist_ok=True)
    include = protos[0].parent
    with tempfile.TemporaryDirectory() as tmp:
        code = protoc.main(["grpc_tools.protoc", f"-I{include}", f"--python_out={tmp}", f"--pyi_out={tmp}",
                            f"--grpc_python_out={tmp}", *(str(proto) for proto in protos)])
        if code != 0:
            raise RuntimeError(f"protoc failed with exit code {code}")
        written = []
        for name in generated_names(protos):
            text = (Path(tmp) / name).read_text()
            for proto in protos:
                module = f"{proto.stem}_pb2"
                text = text.replace(f"import {module} as {proto.stem}__pb2",
                                    f"from {package} import {module} as {proto.stem}__pb2")
            (output / name).write_text(text)
            written.append(output / name)
    (output / "__init__.py").write_text(init)
    return [*written, output / "__init__.py"]
