"""Regenerate the gRPC code in ``labeller/apps/plugin/api/`` from ``labeller/apps/plugin/api.proto``.

    python -m labeller.apps.plugin.generate            # needs grpcio-tools (the 'test' extra)

protoc writes ``import api_pb2`` into the service module; it is rewritten to a package import so
the generated code works as ``labeller.apps.plugin.api``. ``tests/plugin/test_plugin_generated.py``
runs ``generate`` into a temporary directory and fails when the committed files differ.
"""

from __future__ import annotations

import sys
from pathlib import Path

from labeller.base import grpcgen

HERE = Path(__file__).resolve().parent
PROTOS = (HERE / "api.proto",)
OUTPUT = HERE / "api"
GENERATED = grpcgen.generated_names(PROTOS)
INIT = '"""Generated from ../api.proto by ``python -m labeller.apps.plugin.generate``; do not edit."""\n'


def generate(output: Path = OUTPUT) -> list[Path]:
    """Run protoc into ``output`` and return the files written."""
    return grpcgen.generate(PROTOS, "labeller.apps.plugin.api", output, INIT)


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else OUTPUT):
        print(path)
