"""What a container gets for NVIDIA devices, as NVIDIA's plugin answers Allocate.

``deviceListStrategy``: ``envvar`` sets ``NVIDIA_VISIBLE_DEVICES`` to the de-duplicated UUIDs or
indices; ``volume-mounts`` sets it to a directory and mounts one ``/dev/null`` per device under
it; ``cdi-annotations`` adds one annotation naming the CDI devices; ``cdi-cri`` fills
``cdi_devices``. With ``passDeviceSpecs`` (and a non-CDI strategy) device nodes are passed under
``nvidiaDevRoot``: ``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools`` and
``/dev/nvidia<minor>`` always (nvidia-uvm nodes are created on first use, so their absence at
plugin start proves nothing), ``/dev/nvidia-modeset`` only when it exists under the host root, and
for MIG devices the ``nvidia-caps`` nodes listed in ``/proc/driver/nvidia-caps/mig-minors``.

MPS replicas (NVIDIA's ``internal/plugin/mps.go``): ``CUDA_MPS_PIPE_DIRECTORY`` names the
resource's pipe directory as the container sees it (``/mps/<resource>/pipe``), which is mounted from
``<mpsRoot>/<resource>/pipe``, and ``<mpsRoot>/shm`` is mounted at ``/dev/shm``: the MPS server and
its clients share memory there.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from labeller.model.config import Config
from labeller.model.offer import PhysicalDevice, Resource
from labeller.model.vendor.plugin import Allocate, ContainerEdits, DeviceNode, Mount, name_cdi_devices
from vendors.nvidia import mps
from vendors.nvidia.devices import NvidiaDevice
from vendors.nvidia.settings import NvidiaSettings
from vendors.sysfs import Untrusted, read_text

VOLUME_MOUNT_DIR = "/var/run/nvidia-container-devices"
CDI_KIND = "k8s.device-plugin.nvidia.com/gpu"
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
OPTIONAL_NODES = ("/dev/nvidia-modeset",)
MIG_MINORS = "proc/driver/nvidia-caps/mig-minors"


def read_mig_minors(path: Path) -> dict[str, int]:
    """``gpu0/gi1/access 12`` lines -> {"gpu0/gi1/access": 12}; empty when unreadable."""
    try:
        text = read_text(path) or ""
    except Untrusted:
        return {}
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def mps_edits(config: Config, resource: Resource) -> ContainerEdits:
    """What every container of an MPS-shared resource gets, whatever its devices."""
    root, name = config.plugin.mps_root, resource.name
    container_pipe = mps.pipe_dir(mps.CONTAINER_ROOT, name)
    return ContainerEdits(
        envs={"CUDA_MPS_PIPE_DIRECTORY": container_pipe},
        mounts=[Mount(mps.pipe_dir(root, name), container_pipe, read_only=False),
                Mount(mps.shm_dir(root), mps.CONTAINER_SHM, read_only=False)],
    )


class HostNodes:
    """The device nodes NVIDIA devices need, from what the host root shows: ``/dev/nvidiactl``,
    ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools`` always, ``/dev/nvidia-modeset`` when there, and per
    device ``/dev/nvidia<minor>`` plus a MIG device's ``nvidia-caps`` nodes. Read once."""

    def __init__(self, host_root: Path):
        self.mig_minors = read_mig_minors(host_root / MIG_MINORS)
        self.optional = [p for p in OPTIONAL_NODES if (host_root / p.lstrip("/")).exists()]

    @property
    def control(self) -> list[str]:
        return [*CONTROL_NODES, *self.optional]

    def of(self, device: NvidiaDevice) -> list[str]:
        minor = device.nvml_gpu.minor_number
        if minor is None:
            return []
        paths = [f"/dev/nvidia{minor}"]
        if device.mig_ids is not None:
            gi, ci = device.mig_ids
            for cap in (f"gpu{minor}/gi{gi}/access", f"gpu{minor}/gi{gi}/ci{ci}/access"):
                cap_minor = self.mig_minors.get(cap)
                if cap_minor is not None:
                    paths.append(f"/dev/nvidia-caps/nvidia-cap{cap_minor}")
        return paths


def allocator(config: Config, host_root: Path, resource: Resource) -> Allocate:
    """Allocate for one resource; reads the host's MIG capability minors and optional nodes once."""
    flags, settings = config.plugin, config.section(NvidiaSettings)
    nodes = HostNodes(host_root)
    root = settings.dev_root.rstrip("/")
    shared_by_mps = mps_edits(config, resource) if resource.strategy == "mps" else None

    def device_nodes(devices: Sequence[NvidiaDevice]) -> list[DeviceNode]:
        paths = list(dict.fromkeys([*nodes.control, *(p for d in devices for p in nodes.of(d))]))
        return [DeviceNode(root + p, p) for p in paths]

    def allocate(physical: Sequence[PhysicalDevice]) -> ContainerEdits:
        devices = [d for d in physical if isinstance(d, NvidiaDevice)]
        ids = [d.visible_id for d in devices]
        strategies = flags.device_list_strategy
        edits = ContainerEdits()
        if "volume-mounts" in strategies:
            edits.envs["NVIDIA_VISIBLE_DEVICES"] = VOLUME_MOUNT_DIR
            edits.mounts.extend(Mount("/dev/null", f"{VOLUME_MOUNT_DIR}/{i}") for i in ids)
        elif "envvar" in strategies:
            edits.envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(ids)
        name_cdi_devices(edits, [f"{CDI_KIND}={i}" for i in ids], strategies, flags.cdi_annotation_prefix,
                         "nvidia-device-plugin")
        if settings.pass_device_specs and {"envvar", "volume-mounts"} & set(strategies):
            edits.devices.extend(device_nodes(devices))
        if shared_by_mps is not None:
            edits.envs.update(shared_by_mps.envs)
            edits.mounts.extend(shared_by_mps.mounts)
        return edits

    return allocate
