"""Regenerate the gRPC code in ``labeller/apps/draplugin/api/`` from ``registration.proto`` and ``dra.proto``.

    python -m labeller.apps.draplugin.generate            # needs grpcio-tools (the 'test' extra)

protoc writes ``import dra_pb2`` into the service modules; it is rewritten to a package import so
the generated code works as ``labeller.apps.draplugin.api``. ``tests/draplugin/test_draplugin_generated.py``
runs ``generate`` into a temporary directory and fails when the committed files differ.
"""

from __future__ import annotations

import sys
from pathlib import Path

from labeller.base import grpcgen

HERE = Path(__file__).resolve().parent
PROTOS = (HERE / "registration.proto", HERE / "dra.proto")
OUTPUT = HERE / "api"
GENERATED = grpcgen.generated_names(PROTOS)
INIT = ('"""Generated from ../registration.proto and ../dra.proto by ``python -m labeller.apps.draplugin.generate``; '
        'do not edit."""\n')


def generate(output: Path = OUTPUT) -> list[Path]:
    """Run protoc into ``output`` and return the files written."""
    return grpcgen.generate(PROTOS, "labeller.apps.draplugin.api", output, INIT)


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else OUTPUT):
        print(path)
