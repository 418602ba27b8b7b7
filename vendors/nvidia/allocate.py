"""What a container gets for NVIDIA devices, as NVIDIA's plugin answers Allocate.

``deviceListStrategy``: ``envvar`` sets ``NVIDIA_VISIBLE_DEVICES`` to the de-duplicated UUIDs or
indices; ``volume-mounts`` sets it to a directory and mounts one ``/dev/null`` per device under
it; ``cdi-annotations`` adds one annotation naming the CDI devices; ``cdi-cri`` fills
``cdi_devices``. With ``passDeviceSpecs`` (and a non-CDI strategy) device nodes are passed under
``nvidiaDevRoot``: ``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools`` and
``/dev/nvidia<minor>`` always (nvidia-uvm nodes are created on first use, so their absence at
plugin start proves nothing), ``/dev/nvidia-modeset`` only when it exists under the host root, and
for MIG devices the ``nvidia-caps`` nodes listed in ``/proc/driver/nvidia-caps/mig-minors``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from labeller.config import Config
from labeller.offer import PhysicalDevice
from labeller.vendor import Allocate, ContainerEdits, DeviceNode, Mount
from vendors.nvidia.devices import NvidiaDevice
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


def allocator(config: Config, host_root: Path) -> Allocate:
    """Allocate for one resource; reads the host's MIG capability minors and optional nodes once."""
    flags = config.plugin
    mig_minors = read_mig_minors(host_root / MIG_MINORS)
    optional = [p for p in OPTIONAL_NODES if (host_root / p.lstrip("/")).exists()]
    root = flags.nvidia_dev_root.rstrip("/")

    def device_nodes(devices: Sequence[NvidiaDevice]) -> list[DeviceNode]:
        paths = [*CONTROL_NODES, *optional]
        for device in devices:
            minor = device.nvml_gpu.minor_number
            if minor is None:
                continue
            if f"/dev/nvidia{minor}" not in paths:
                paths.append(f"/dev/nvidia{minor}")
            if device.mig_ids is not None:
                gi, ci = device.mig_ids
                for cap in (f"gpu{minor}/gi{gi}/access", f"gpu{minor}/gi{gi}/ci{ci}/access"):
                    cap_minor = mig_minors.get(cap)
                    if cap_minor is not None and f"/dev/nvidia-caps/nvidia-cap{cap_minor}" not in paths:
                        paths.append(f"/dev/nvidia-caps/nvidia-cap{cap_minor}")
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
        names = [f"{CDI_KIND}={i}" for i in ids]
        if "cdi-annotations" in strategies:
            # NVIDIA uses a random suffix; a digest of the IDs is as unique per container and reproducible.
            suffix = hashlib.sha256(",".join(ids).encode()).hexdigest()[:16]
            edits.annotations[f"{flags.cdi_annotation_prefix}nvidia-device-plugin_{suffix}"] = ",".join(names)
        if "cdi-cri" in strategies:
            edits.cdi_devices.extend(names)
        if flags.pass_device_specs and {"envvar", "volume-mounts"} & set(strategies):
            edits.devices.extend(device_nodes(devices))
        return edits

    return allocate
