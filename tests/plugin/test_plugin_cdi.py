"""CDI spec files: written for every device the plugin advertises under a CDI deviceListStrategy,
valid against the CDI JSON schema (tests/fixtures/cdi) and the CDI parser's own rules, and every
name an Allocate response gives resolves in them. Stale files of ours go; nobody else's do."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft7Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from labeller.model.config import parse_config
from labeller.host.machine import NodeOptions, open_host
from labeller.apps.plugin.api import api_pb2 as pb
from tests.builders import nvidia, nvidia_gpu, offer_of
from tests.fakes.kubelet import FakeKubelet
from tests.plugin.conftest import probing_plugin, running_plugin
from tests.plugin.profile_files import l40s_node, write_yaml
from vendors import RESOURCE_NAMES
from vendors.nvidia import cdi as nvidia_cdi

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "cdi"
CDI_CRI = {"flags": {"plugin": {"deviceListStrategy": ["cdi-cri", "cdi-annotations"]}}}
# The CDI parser (pkg/parser/parser.go): a device name is letters, digits, '_', '-', '.', ':',
# starting and ending with a letter or digit; a vendor or class starts with a letter.
DEVICE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")
KIND = re.compile(r"[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?/[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?")
# What the containerd 1.7 / CRI-O 1.28 of Kubernetes 1.28 read (CDI packages v0.5/v0.6).
READABLE_BY_KUBERNETES_1_28 = ("0.3.0", "0.4.0", "0.5.0", "0.6.0")


class SpecValidator:
    """The CDI schema; it leaves the spec-level ``containerEdits`` out of its properties, so those
    are checked against the same ``containerEdits`` definition the devices use."""

    def __init__(self) -> None:
        defs = Resource.from_contents(json.loads((SCHEMA_DIR / "defs.json").read_text()), default_specification=DRAFT7)
        registry: Registry[Any] = Registry().with_resource("defs.json", defs)
        self.spec = Draft7Validator(json.loads((SCHEMA_DIR / "schema.json").read_text()), registry=registry)
        self.edits = Draft7Validator({"$ref": "defs.json#/definitions/containerEdits"}, registry=registry)

    def iter_errors(self, spec: dict[str, Any]) -> list[Any]:
        return [*self.spec.iter_errors(spec), *self.edits.iter_errors(spec.get("containerEdits", {}))]


def validator() -> SpecValidator:
    return SpecValidator()


def minimum_version(spec: dict[str, Any]) -> tuple[int, ...]:
    """The CDI library's requiresV040..V060 (specs-go/version.go), for the fields we might use."""
    edits = [spec["containerEdits"], *(d["containerEdits"] for d in spec["devices"])]
    if "annotations" in spec or any("annotations" in d for d in spec["devices"]) or "." in spec["kind"].split("/")[1]:
        return (0, 6, 0)
    if any(not d["name"][0].isalpha() for d in spec["devices"]) or \
            any("hostPath" in n for e in edits for n in e.get("deviceNodes", [])):
        return (0, 5, 0)
    if any("type" in m for e in edits for m in e.get("mounts", [])):
        return (0, 4, 0)
    return (0, 3, 0)


def check_spec(path: Path) -> dict[str, Any]:
    spec = json.loads(path.read_text())
    errors = sorted(e.message for e in validator().iter_errors(spec))
    assert errors == [], errors
    assert KIND.fullmatch(spec["kind"]), spec["kind"]
    assert all(DEVICE_NAME.fullmatch(d["name"]) for d in spec["devices"])
    assert spec["cdiVersion"] in READABLE_BY_KUBERNETES_1_28
    assert tuple(int(p) for p in spec["cdiVersion"].split(".")) >= minimum_version(spec)
    return spec


def resolvable(directory: Path) -> set[str]:
    """Every fully qualified device name the spec files in ``directory`` define."""
    names = set()
    for path in directory.glob("*.json"):
        spec = json.loads(path.read_text())
        names |= {f"{spec['kind']}={d['name']}" for d in spec["devices"]}
    return names


def given_names(response: pb.ContainerAllocateResponse) -> list[str]:
    annotated = [n for value in response.annotations.values() for n in value.split(",")]
    return [c.name for c in response.cdi_devices] + annotated


@pytest.mark.parametrize(("profile", "resource", "extra"), [
    ("dgx-h100", "nvidia.com/gpu", {}),
    ("dgx-a100-mig-mixed", "nvidia.com/mig-1g.5gb",
     {"flags": {"migStrategy": "mixed", "nvidiaDevRoot": "/run/nvidia/driver",
                                                               "plugin": {"deviceIDStrategy": "index"}}}),
    ("mi300x-x8-cpx-mixed", "amd.com/cpx_nps4", {"labeller": {"amd": {"resourceNamingStrategy": "mixed"}}}),
    ("dgx-h100-4of8-shared", "nvidia.com/gpu.shared",
     {"sharing": {"timeSlicing": {"renameByDefault": True,
                                  "resources": [{"name": "gpu", "replicas": 4, "devices": 4}]}}}),
])
def test_every_advertised_device_is_in_a_valid_spec_and_allocate_names_resolve(
        sock_dir: Path, kubelet: FakeKubelet, tmp_path: Path, profile: str, resource: str, extra: dict[str,
                                                                                                       Any]) -> None:
    config: dict[str, Any] = {**extra, "flags": {**extra.get("flags", {}), "plugin": {
        **extra.get("flags", {}).get("plugin", {}), "deviceListStrategy": ["cdi-cri", "cdi-annotations"]}}}
    with running_plugin(sock_dir, profile, config, cdi_spec_dir=tmp_path) as running:
        assert kubelet.wait_for(lambda: kubelet.allocatable(resource) > 0)
        files = sorted(p.name for p in tmp_path.iterdir())
        vendors = {r.vendor for r in offer_of(running.inventory, running.config).resources}
        assert files == sorted(f"gpu-labeller-{v}.json" for v in vendors)  # and no temporary file left
        specs = [check_spec(tmp_path / f) for f in files]
        advertised = {d.physical.visible_id for r in offer_of(running.inventory, running.config).resources
                      for d in r.devices}
        assert {d["name"] for s in specs for d in s["devices"]} == advertised
        response, _ = kubelet.admit(resource, [1])
        (container,) = response.container_responses
        names = given_names(container)
        assert names and set(names) <= resolvable(tmp_path)
        assert not container.devices  # only CDI strategies: the runtime gets the nodes from the spec


def test_amd_spec_gives_each_partition_its_render_node_and_kfd(sock_dir: Path, kubelet: FakeKubelet,
                                                               tmp_path: Path) -> None:
    config = {**CDI_CRI, "labeller": {"amd": {"resourceNamingStrategy": "mixed"}}}
    with running_plugin(sock_dir, "mi300x-x8-cpx-mixed", config, cdi_spec_dir=tmp_path) as running:
        assert kubelet.wait_for(lambda: kubelet.allocatable("amd.com/cpx_nps4") == 63)
        spec = check_spec(tmp_path / "gpu-labeller-amd.json")
        assert spec["kind"] == "amd.com/gpu" and spec["containerEdits"] == {
            "deviceNodes": [{"path": "/dev/kfd", "permissions": "rwm"}]}
        (resource,) = offer_of(running.inventory, running.config).resources
        first = resource.devices[0].physical
        (entry,) = [d for d in spec["devices"] if d["name"] == first.visible_id]
        assert entry["containerEdits"]["deviceNodes"] == [
            {"path": f"/dev/dri/renderD{first.node.render_minor}", "permissions": "rwm"}]  # type: ignore[attr-defined]


def test_driver_files_on_the_host_root_are_mounted(tmp_path: Path) -> None:
    lib = tmp_path / "run/nvidia/driver/usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    for name in ("libcuda.so.550.54.15", "libnvidia-ml.so.550.54.15", "libnvidia-ptxjitcompiler.so.550.54.15",
                 "libc.so.6"):
        (lib / name).write_text("ELF")
    (lib / "libcuda.so.1").symlink_to("libcuda.so.550.54.15")
    (lib / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.550.54.15")
    (tmp_path / "run/nvidia/driver/usr/bin").mkdir(parents=True)
    (tmp_path / "run/nvidia/driver/usr/bin/nvidia-smi").write_text("ELF")
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "usr/bin/nvidia-ctk").write_text("ELF")
    config = parse_config({"flags": {"nvidiaDriverRoot": "/run/nvidia/driver",
                                     "plugin": {"deviceListStrategy": "cdi-cri"}}}, RESOURCE_NAMES)
    (resource,) = offer_of(nvidia(nvidia_gpu(0), nvidia_gpu(1)), config).resources
    spec = nvidia_cdi.spec(resource.physical_devices, config, tmp_path)
    assert spec is not None
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    check_spec(path)
    root = "/run/nvidia/driver/usr/lib/x86_64-linux-gnu"
    mounts = {(m["hostPath"], m["containerPath"]) for m in spec["containerEdits"]["mounts"]}
    assert mounts == {
        (f"{root}/libcuda.so.550.54.15", "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"),
        (f"{root}/libnvidia-ml.so.550.54.15", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15"),
        (f"{root}/libnvidia-ptxjitcompiler.so.550.54.15",
         "/usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.550.54.15"),
        (f"{root}/libcuda.so.550.54.15", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        (f"{root}/libnvidia-ml.so.550.54.15", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
        ("/run/nvidia/driver/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi"),
    }
    assert spec["containerEdits"]["hooks"] == [{
        "hookName": "createContainer", "path": "/usr/bin/nvidia-ctk",
        "args": ["/usr/bin/nvidia-ctk", "hook", "update-ldcache", "--folder", root]}]
    assert spec["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert [d["containerEdits"]["deviceNodes"] for d in spec["devices"]] == [
        [{"path": "/dev/nvidia0", "permissions": "rwm", "hostPath": "/run/nvidia/driver/dev/nvidia0"}],
        [{"path": "/dev/nvidia1", "permissions": "rwm", "hostPath": "/run/nvidia/driver/dev/nvidia1"}]]


def test_stale_specs_of_ours_are_removed_and_nobody_elses(sock_dir: Path, kubelet: FakeKubelet, tmp_path: Path) -> None:
    spec_dir, profile, config_file = tmp_path / "cdi", tmp_path / "node.yaml", tmp_path / "config.yaml"
    spec_dir.mkdir()
    (spec_dir / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n")  # nvidia-ctk's
    (spec_dir / "gpu-labeller-notes.json").write_text("{}")  # ours by prefix only: not a vendor file we write
    write_yaml(profile, l40s_node(1, amd_gpus=1))
    write_yaml(config_file, {"version": "v1", **CDI_CRI})
    with open_host(NodeOptions(simulate=str(profile), config_path=config_file)) as node, \
            probing_plugin(sock_dir, node, config_file, cdi_spec_dir=spec_dir) as run:
        assert kubelet.wait_for(lambda: (spec_dir / "gpu-labeller-amd.json").exists()
                                and (spec_dir / "gpu-labeller-nvidia.json").exists())
        write_yaml(profile, l40s_node(1))  # the AMD GPU is gone: its spec goes
        run.sighup()
        assert kubelet.wait_for(lambda: not (spec_dir / "gpu-labeller-amd.json").exists())
        write_yaml(config_file, {"version": "v1"})  # envvar again: no CDI names, no spec
        run.sighup()
        assert kubelet.wait_for(lambda: not (spec_dir / "gpu-labeller-nvidia.json").exists())
        assert sorted(p.name for p in spec_dir.iterdir()) == ["gpu-labeller-notes.json", "nvidia.yaml"]


def test_the_schema_check_can_fail() -> None:
    broken = {"cdiVersion": "0.5.0", "kind": "amd.com/gpu", "devices": [{"name": "0000:05:00.0"}],
              "containerEdits": {"deviceNodes": [{"permissions": "rwm"}]}}
    messages = sorted(e.message for e in validator().iter_errors(broken))
    assert messages == ["'containerEdits' is a required property", "'path' is a required property"]
    assert minimum_version(broken | {"devices": [{"name": "0000:05:00.0", "containerEdits": {}}]}) == (0, 5, 0)


def test_a_link_at_a_spec_path_is_left_alone_and_its_target_untouched(sock_dir: Path, kubelet: FakeKubelet,
                                                                      tmp_path: Path) -> None:
    """The spec files are written as the DRA plugin's (labeller.base.ownfiles): never through a link, and
    temporary files a killed plugin left are removed at start."""
    spec_dir, target = tmp_path / "cdi", tmp_path / "elsewhere.json"
    spec_dir.mkdir()
    target.write_text("a file the plugin must never write\n")
    (spec_dir / "gpu-labeller-nvidia.json").symlink_to(target)
    stale, kept = spec_dir / ".gpu-labeller-nvidia.json.k3x9q1.tmp", spec_dir / ".nvidia.yaml.1.tmp"
    stale.write_text("{half")
    kept.write_text("nvidia-ctk's")
    with running_plugin(sock_dir, "dgx-h100", CDI_CRI, cdi_spec_dir=spec_dir):
        assert kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") > 0)  # the specs were written before
        assert target.read_text() == "a file the plugin must never write\n"
        assert (spec_dir / "gpu-labeller-nvidia.json").is_symlink()
        assert not stale.exists() and kept.read_text() == "nvidia-ctk's"
