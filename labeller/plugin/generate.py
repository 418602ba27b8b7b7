"""Regenerate the gRPC code in ``labeller/plugin/api/`` from ``labeller/plugin/api.proto``.

    python -m labeller.plugin.generate            # needs grpcio-tools (the 'test' extra)

protoc writes ``import api_pb2`` into the service module; it is rewritten to a package import so
the generated code works as ``labeller.plugin.api``. ``tests/plugin/test_plugin_generated.py``
runs ``generate`` into a temporary directory and fails when the committed files differ.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = HERE / "api.proto"
OUTPUT = HERE / "api"
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")
INIT = '"""Generated from ../api.proto by ``python -m labeller.plugin.generate``; do not edit."""\n'


def generate(output: Path = OUTPUT) -> list[Path]:
    """Run protoc into ``output`` and return the files written."""
    # imported here: grpcio-tools is only needed to regenerate
    from grpc_tools import protoc  # type: ignore[import-untyped]

    output.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        code = protoc.main([
            "grpc_tools.protoc", f"-I{HERE}", f"--python_out={tmp}", f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}", str(PROTO),
        ])
        if code != 0:
            raise RuntimeError(f"protoc failed with exit code {code}")
        written = []
        for name in GENERATED:
            text = (Path(tmp) / name).read_text()
            text = text.replace("import api_pb2 as api__pb2", "from labeller.plugin.api import api_pb2 as api__pb2")
            (output / name).write_text(text)
            written.append(output / name)
    (output / "__init__.py").write_text(INIT)
    return [*written, output / "__init__.py"]


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else OUTPUT):
        print(path)
