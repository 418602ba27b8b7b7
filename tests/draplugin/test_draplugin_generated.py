"""The generated gRPC code is current, and the protos match the kubelet's wire facts: package,
service and method names (the gRPC paths the kubelet calls), message field names and numbers."""

from __future__ import annotations

from pathlib import Path

from labeller.apps.draplugin import generate
from labeller.apps.draplugin.api import dra_pb2, registration_pb2
from tests.plugin.test_plugin_generated import stale_files


def test_generated_code_is_not_stale(tmp_path: Path) -> None:
    stale = stale_files(generate.generate(tmp_path), generate.OUTPUT)
    assert not stale, f"stale generated code {stale}: run python -m labeller.apps.draplugin.generate"


def test_a_changed_proto_is_detected(tmp_path: Path) -> None:
    fresh = generate.generate(tmp_path / "fresh")
    old = tmp_path / "old"
    old.mkdir()
    for path in fresh:
        (old / path.name).write_text(path.read_text().replace("cdi_device_ids", "cdi_devices"))
    (old / "registration_pb2_grpc.py").unlink()
    assert stale_files(fresh, old) == ["registration_pb2_grpc.py", "dra_pb2.pyi"]


REGISTRATION_WIRE = {
    "PluginInfo": {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4},
    "RegistrationStatus": {"plugin_registered": 1, "error": 2},
    "RegistrationStatusResponse": {},
    "InfoRequest": {},
}
DRA_WIRE = {
    "NodePrepareResourcesRequest": {"claims": 1},
    "NodePrepareResourcesResponse": {"claims": 1},
    "NodePrepareResourceResponse": {"devices": 1, "error": 2},
    "Device": {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4},
    "NodeUnprepareResourcesRequest": {"claims": 1},
    "NodeUnprepareResourcesResponse": {"claims": 1},
    "NodeUnprepareResourceResponse": {"error": 1},
    "Claim": {"namespace": 1, "uid": 2, "name": 3},
}


def fields(module: object) -> dict[str, dict[str, int]]:
    file = module.DESCRIPTOR  # type: ignore[attr-defined]
    return {name: {f.name: f.number for f in m.fields} for name, m in file.message_types_by_name.items()}


def test_registration_messages_match_the_wire_facts() -> None:
    assert registration_pb2.DESCRIPTOR.package == "pluginregistration"
    assert fields(registration_pb2) == REGISTRATION_WIRE


def test_dra_messages_match_the_wire_facts() -> None:
    assert dra_pb2.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1"
    assert fields(dra_pb2) == DRA_WIRE
    entry = dra_pb2.NodePrepareResourcesResponse.DESCRIPTOR.fields_by_name["claims"].message_type
    assert entry is not None and entry.GetOptions().map_entry  # map<string, NodePrepareResourceResponse>
    value = entry.fields_by_name["value"].message_type
    assert value is not None and value.name == "NodePrepareResourceResponse"


def test_the_grpc_paths_the_kubelet_calls() -> None:
    methods = {f"/{s.full_name}/{m.name}" for file in (registration_pb2, dra_pb2)
               for s in file.DESCRIPTOR.services_by_name.values() for m in s.methods}
    assert methods == {
        "/pluginregistration.Registration/GetInfo",
        "/pluginregistration.Registration/NotifyRegistrationStatus",
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
    }
