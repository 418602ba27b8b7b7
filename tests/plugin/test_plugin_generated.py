"""The generated gRPC code is current, and the proto matches the wire facts of the reference."""

from __future__ import annotations

import re
from pathlib import Path

from labeller.apps.plugin import generate
from labeller.apps.plugin.api import api_pb2 as pb

# Lines that only stamp the generator's version: a different grpcio-tools must not fail the test.
VERSION_STAMPS = re.compile(r"^(# Protobuf Python Version:.*|GRPC_GENERATED_VERSION = .*|\s+\d+,\s*)$", re.MULTILINE)


def normalised(path: Path) -> str:
    return VERSION_STAMPS.sub("", path.read_text())


def stale_files(fresh: list[Path], committed_dir: Path) -> list[str]:
    return [p.name for p in fresh
            if not (committed_dir / p.name).exists() or normalised(p) != normalised(committed_dir / p.name)]


def test_generated_code_is_not_stale(tmp_path: Path) -> None:
    stale = stale_files(generate.generate(tmp_path), generate.OUTPUT)
    assert not stale, f"stale generated code {stale}: run python -m labeller.apps.plugin.generate"


def test_a_changed_proto_is_detected(tmp_path: Path) -> None:
    fresh = generate.generate(tmp_path / "fresh")
    old = tmp_path / "old"
    old.mkdir()
    for path in fresh:
        (old / path.name).write_text(path.read_text().replace("get_preferred_allocation_available",
                                                              "get_preferred_allocation"))
    (old / "api_pb2_grpc.py").unlink()
    assert stale_files(fresh, old) == ["api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py"]


WIRE = {
    "DevicePluginOptions": {"pre_start_required": 1, "get_preferred_allocation_available": 2},
    "RegisterRequest": {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4},
    "ListAndWatchResponse": {"devices": 1},
    "Device": {"ID": 1, "health": 2, "topology": 3},
    "TopologyInfo": {"nodes": 1},
    "NUMANode": {"ID": 1},
    "PreStartContainerRequest": {"devices_ids": 1},
    "PreferredAllocationRequest": {"container_requests": 1},
    "ContainerPreferredAllocationRequest": {"available_deviceIDs": 1, "must_include_deviceIDs": 2,
                                            "allocation_size": 3},
    "PreferredAllocationResponse": {"container_responses": 1},
    "ContainerPreferredAllocationResponse": {"deviceIDs": 1},
    "AllocateRequest": {"container_requests": 1},
    "ContainerAllocateRequest": {"devices_ids": 1},
    "AllocateResponse": {"container_responses": 1},
    "ContainerAllocateResponse": {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5},
    "Mount": {"container_path": 1, "host_path": 2, "read_only": 3},
    "DeviceSpec": {"container_path": 1, "host_path": 2, "permissions": 3},
    "CDIDevice": {"name": 1},
    "Empty": {},
    "PreStartContainerResponse": {},
}


def test_messages_match_the_wire_facts() -> None:
    file = pb.DESCRIPTOR
    assert file.package == "v1beta1"
    assert {name: {f.name: f.number for f in m.fields} for name, m in file.message_types_by_name.items()} == WIRE


def test_services_and_methods() -> None:
    services = {s.full_name: [m.name for m in s.methods] for s in pb.DESCRIPTOR.services_by_name.values()}
    assert services == {
        "v1beta1.Registration": ["Register"],
        "v1beta1.DevicePlugin": ["GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation", "Allocate",
                                 "PreStartContainer"],
    }
    assert pb.DESCRIPTOR.services_by_name[["v1beta1", "DevicePlugin"][1]].methods_by_name[
        "ListAndWatch"].server_streaming
