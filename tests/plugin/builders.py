"""Small Inventory builders for the plugin unit tests."""

from __future__ import annotations

from labeller.inventory import (
    AmdComputeNode,
    AmdGpu,
    AmdInventory,
    Inventory,
    MigDevice,
    NvidiaGpu,
    NvidiaInventory,
)


def bus(i: int) -> str:
    return f"0000:{0x10 + i:02x}:00.0"


def nvidia_gpu(i: int, *, numa: int | None = 0, peers: tuple[int, ...] = (), mig: tuple[str, ...] | None = None,
               name: str = "NVIDIA A100-SXM4-40GB") -> NvidiaGpu:
    migs = tuple(MigDevice(index=j, uuid=f"MIG-{i}-{j}", profile=p, memory_mib=4864, gpu_instance_id=j + 1,
                           compute_instance_id=0) for j, p in enumerate(mig or ()))
    return NvidiaGpu(index=i, name=name, uuid=f"GPU-{i}", memory_bytes=40 << 30, compute_capability=(8, 0),
                     pci_bus_id=bus(i), minor_number=i, mig_capable=True, mig_enabled=mig is not None,
                     mig_devices=migs, nvlink_peers=tuple(bus(p) for p in peers), numa_node=numa)


def nvidia(*gpus: NvidiaGpu) -> Inventory:
    return Inventory(nvidia=NvidiaInventory("550.54.15", 12040, tuple(gpus)))


def amd_node(kfd: int, location: int, *, render: int, card: int | None = None, numa: int | None = 0,
             links: tuple[tuple[int, int], ...] = ()) -> AmdComputeNode:
    return AmdComputeNode(kfd_node=kfd, gpu_id=None, render_minor=render, card=card, simd_count=416, simd_per_cu=4,
                          vram_bytes=None, gfx_target_version=90010, location_id=location, domain=0, numa_node=numa,
                          links=links)


def amd_gpu(bdf: str, *nodes: AmdComputeNode, numa: int | None = 0) -> AmdGpu:
    return AmdGpu(bdf=bdf, device_id=0x740F, revision=0, product_name="AMD Instinct MI210", family="AI",
                  nodes=tuple(nodes), numa_node=numa)


def amd(*gpus: AmdGpu) -> Inventory:
    return Inventory(amd=AmdInventory("6.7.0", "", tuple(gpus)))
