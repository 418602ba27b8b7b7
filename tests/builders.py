"""The one set of builders every test shares: inventories, host trees, profile sections, captures,
and the derivations (offer, labels) as a command makes them."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from labeller.model import sharing
from labeller.model.config import Config, parse_config
from labeller.host.discovery import discover
from labeller.model.inventory import BackendReport, Inventory, PciGpu
from labeller.model.labels import LabelSet
from labeller.model.offer import Offer
from labeller.model.nodelabels import node_labels
from vendors import RESOURCE_NAMES, VENDORS, pci
from vendors.amd import probe as amd_probe
from vendors.amd.model import AmdComputeNode, AmdGpu, AmdInventory
from vendors.amd.simulate import no_enrichment
from vendors.nvidia import simulate as fake_nvml
from vendors.nvidia import mps
from vendors.nvidia.model import MigDevice, MpsReadiness, NvidiaGpu, NvidiaInventory
from vendors.sim_pci import write_device, write_host_bridge

T = TypeVar("T")


# --- deriving what a command derives ------------------------------------------------------------

def offer_of(inventory: Inventory, config: Config | dict[str, Any] | None = None) -> Offer:
    return sharing.derive(inventory, _config(config), VENDORS)


def label_set_of(inventory: Inventory, config: Config | dict[str, Any] | None = None) -> LabelSet:
    parsed = _config(config)
    return node_labels(inventory, parsed, sharing.derive(inventory, parsed, VENDORS), VENDORS)


def _config(config: Config | dict[str, Any] | None) -> Config:
    return config if isinstance(config, Config) else parse_config(config, RESOURCE_NAMES)


GPU_CLASSES = {vendor.discovery.pci_vendor_id: vendor.discovery.pci_classes for vendor in VENDORS}


def pci_scan(root: Path) -> tuple[tuple[PciGpu, ...], BackendReport]:
    """The PCI scan as discovery runs it, for every registered vendor."""
    return pci.scan(root, GPU_CLASSES)


def discover_node(root: Path, nvml: ModuleType | None = None, config: Config | None = None) -> Inventory:
    """Discovery of ``root``, with ``nvml`` standing in for pynvml (a fake, or one without a library)."""
    return discover(root, config or Config(), VENDORS, {"nvidia": nvml or fake_nvml.absent(), "amd": no_enrichment})


def groups(**label_groups: bool) -> Config:
    """The default config with some label groups (``labeller.labels``) switched: ``groups(amdBeta=False)``."""
    return parse_config({"labeller": {"labels": label_groups}}, RESOURCE_NAMES)


# --- host trees -----------------------------------------------------------------------------------

def add_pci_device(root: Path, bdf: str, vendor: int, device: int, class_code: int,
                   numa_node: int = -1, driver: str | None = None, revision: int = 0xA1) -> Path:
    return write_device(root, bdf, vendor, device, class_code, revision=revision, numa_node=numa_node, driver=driver)


def empty_node(root: Path) -> Path:
    """A genuine node without GPUs: its /sys lists a host bridge and nothing else."""
    write_host_bridge(root)
    return root


# --- waiting -------------------------------------------------------------------------------------

PATIENCE_S = 60.0
"""How long a test waits for something that must happen before it fails. Far more than anything takes
on a quiet machine (milliseconds), because CI is a loaded 2-core box where a Python process that
imports the kubernetes client may need seconds just to start. A wait that is met returns at once, so
the bound costs nothing; only a failing test waits it out (pytest-timeout stops a test at 120 s)."""


AT_ONCE_S = 10.0
"""The bound on a reaction the product promises "at once" or "within a second" (a repair on a watch
event, a retry as soon as the API answers, a look at a file every second): milliseconds on a quiet
machine, but a loaded CI box may add seconds of scheduling delay. A test asserting it measures the
time itself and sets the timer that the reaction must not wait for (the probe interval, a backoff) to
30 s or more, so that this bound still tells the two apart."""

RECOVERY_OUTLASTS_S = AT_ONCE_S + 1.0
"""A health recovery window (``recovery_seconds``) for a test that must see a device unhealthy before
it recovers: longer than any reaction the test allows (AT_ONCE_S), so that a loaded machine, slower
to publish than a short window lasts, cannot decide the test (one CI run saw a 0.5 s window end
before the plugin had written the device's slice)."""


def wait_for(predicate: Callable[[], Any], timeout: float = PATIENCE_S, step: float = 0.01) -> Any:
    """``predicate()``'s first true value, polled every ``step``; fails the test after ``timeout`` seconds.

    Not for latency budgets: a test that asserts "within a second" measures the time itself and
    says why its bound holds on a loaded machine."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(step)


def stays_true(predicate: Callable[[], Any], seconds: float = 0.3, step: float = 0.01) -> None:
    """Fail the test as soon as ``predicate()`` is false during the next ``seconds``.

    The one sleep a test may hold: "nothing happens" has no event to await. Await first whatever
    shows the product took in what it must not act on (a log line, a counter), so that this window
    only has to catch a late, wrong reaction."""
    deadline = time.monotonic() + seconds
    while True:
        assert predicate(), "changed while nothing should happen"
        if time.monotonic() >= deadline:
            return
        time.sleep(step)


def promptly(call: Callable[[], T], seconds: float = PATIENCE_S) -> T:
    """``call()``, failing the test instead of hanging when it does not return within ``seconds``
    (a probe that opened a FIFO for reading would block forever). Its exception is re-raised here."""
    outcome: list[T] = []
    raised: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"no answer within {seconds} s: the probe hangs"
    if raised:
        raise raised[0]
    return outcome[0]


# --- NVIDIA inventories ---------------------------------------------------------------------------

def bus(i: int) -> str:
    return f"0000:{0x10 + i:02x}:00.0"


def nvidia_gpu(i: int, *, numa: int | None = 0, peers: tuple[int, ...] = (), mig: tuple[str, ...] | None = None,
               name: str = "NVIDIA A100-SXM4-40GB") -> NvidiaGpu:
    """GPU ``i`` (UUID ``GPU-<i>``, bus ``bus(i)``); ``mig``: its MIG profiles, MIG enabled."""
    migs = tuple(MigDevice(index=j, uuid=f"MIG-{i}-{j}", profile=p, memory_mib=4864, gpu_instance_id=j + 1,
                           compute_instance_id=0) for j, p in enumerate(mig or ()))
    return NvidiaGpu(index=i, name=name, uuid=f"GPU-{i}", memory_bytes=40 << 30, compute_capability=(8, 0),
                     pci_bus_id=bus(i), minor_number=i, mig_capable=True, mig_enabled=mig is not None,
                     mig_devices=migs, nvlink_peers=tuple(bus(p) for p in peers), numa_node=numa)


def nvidia(*gpus: NvidiaGpu, **fields: Any) -> Inventory:
    if not gpus:
        return Inventory()
    return Inventory(parts=(NvidiaInventory(driver_version=fields.get("driver_version", "550.54.15"),
                                            cuda_driver_version=fields.get("cuda_driver_version", 12040),
                                            gpus=tuple(gpus)),))


def nvidia_part(inventory: Inventory) -> NvidiaInventory:
    part = inventory.part(NvidiaInventory)
    assert part is not None, "NVML described no GPU"
    return part


def mps_ready(inventory: Inventory, config: Config | dict[str, Any] | None, *, except_: tuple[str, ...] = ()
              ) -> Inventory:
    """``inventory`` as the NVIDIA probe reads it while ``gpu-labeller mps-control-daemon`` serves
    every MPS resource of ``config`` (but those named in ``except_``) and its heartbeat is fresh."""
    offer = offer_of(inventory, config)
    served = tuple(mps.served(h.resource) for h in offer.held
                   if h.waiting and h.resource.strategy == "mps" and h.resource.name not in except_)
    served += tuple(mps.served(r) for r in offer.resources if r.strategy == "mps" and r.name not in except_)
    part = replace(nvidia_part(inventory), mps=MpsReadiness(served=served))
    return replace(inventory, parts=tuple(part if isinstance(p, NvidiaInventory) else p for p in inventory.parts))


# --- NVIDIA profile sections (simulated through the fake NVML) ----------------------------------

# nvidia-smi figures: H100 SXM 81559 MiB, A100-SXM4-40GB 40536 MiB, T4 15109 MiB.
H100_BYTES = 85520809984
A100_40GB_BYTES = 42505273344
A100_80GB_BYTES = 85899345920
T4_BYTES = 15843721216


def h100(**overrides: Any) -> dict[str, Any]:
    gpu = {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-00000000-0000-4000-8000-0000000000{i:02d}",
           "pci_bus_id": "0000:{i:02x}:00.0", "memory_bytes": H100_BYTES, "compute_capability": [9, 0],
           "mig_mode": "disabled"}
    return gpu | overrides


def a100(**overrides: Any) -> dict[str, Any]:
    gpu = {"name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-a1000000-0000-4000-8000-0000000000{i:02d}",
           "pci_bus_id": "0000:{i:02x}:00.0", "memory_bytes": A100_40GB_BYTES, "compute_capability": [8, 0],
           "mig_mode": "disabled"}
    return gpu | overrides


def mig_1g5gb(repeat: int = 1) -> dict[str, Any]:
    """nvidia-smi mig -lgip on an A100-SXM4-40GB: 1g.5gb has 4.75 GiB, 14 SMs, 1 copy engine."""
    return {"profile": "1g.5gb", "repeat": repeat, "uuid": "MIG-00000000-0000-4000-8000-00000000{gpu:02d}{i:02d}",
            "memory_mib": 4864, "multiprocessors": 14, "engines_copy": 1}


def section(*gpus: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"driver_version": "550.54.15", "cuda_driver_version": 12040, "gpus": list(gpus)} | extra


def build(tmp_path: Path, nvidia_section: dict[str, Any]) -> tuple[Path, ModuleType]:
    """A host root with the section's GPUs on its PCI bus, and the fake pynvml that describes them."""
    root = tmp_path / "root"
    root.mkdir(parents=True, exist_ok=True)
    return root, fake_nvml.build(nvidia_section, root)


def inventory_of(tmp_path: Path, nvidia_section: dict[str, Any], config: Config | None = None) -> Inventory:
    root, nvml = build(tmp_path, nvidia_section)
    return discover_node(root, nvml, config)


def labels_of(tmp_path: Path, nvidia_section: dict[str, Any], config: dict[str, Any] | None = None) -> dict[str, str]:
    parsed = _config(config)
    label_set = label_set_of(inventory_of(tmp_path, nvidia_section, parsed), parsed)
    assert label_set.conflicts == [] and label_set.dropped == {}
    return label_set.labels


# --- AMD inventories ------------------------------------------------------------------------------

MI300X_SPX_VRAM = 206141652992


def amd_node(kfd: int, location: int | None = None, *, render: int | None = None, card: int | None = None,
             simd: int = 1216, per_cu: int = 4, vram: int | None = MI300X_SPX_VRAM, numa: int | None = 0,
             links: tuple[tuple[int, int], ...] = ()) -> AmdComputeNode:
    """KFD node ``kfd`` (an MI300X in SPX unless told otherwise): location ``kfd << 8`` and render
    minor ``127 + kfd`` by default."""
    return AmdComputeNode(kfd_node=kfd, gpu_id=kfd, render_minor=127 + kfd if render is None else render, card=card,
                          simd_count=simd, simd_per_cu=per_cu, vram_bytes=vram, gfx_target_version=90402,
                          location_id=kfd << 8 if location is None else location, domain=0, numa_node=numa, links=links)


def amd_gpu(where: int | str, *nodes: AmdComputeNode, device_id: int = 0x74A1,
            name: str | None = "AMD Instinct MI300X OAM", family: str | None = "AI", numa: int | None = 0,
            **extra: Any) -> AmdGpu:
    """An AMD GPU at PCI address ``where`` (or ``0000:<where>:00.0``); without ``nodes``, one KFD
    node numbered ``where + 1``."""
    bdf = where if isinstance(where, str) else f"0000:{where:02x}:00.0"
    nodes = extra.pop("nodes", nodes)
    if not nodes:
        nodes = (amd_node(int(bdf.split(":")[1], 16) + 1),)
    return AmdGpu(bdf=bdf, device_id=device_id, revision=0, product_name=name, family=family, nodes=nodes,
                  numa_node=numa, **extra)


def amd(*gpus: AmdGpu, driver: str = "6.8.5", src: str = "ABC123") -> Inventory:
    if not gpus:
        return Inventory()
    return Inventory(parts=(AmdInventory(driver_version=driver, driver_src_version=src, gpus=gpus),))


def amd_part(inventory: Inventory) -> AmdInventory:
    part = inventory.part(AmdInventory)
    assert part is not None, "the AMD backend described no GPU"
    return part


def amd_pci(bdf: str, device_id: int = 0x74A1, driver: str | None = "amdgpu") -> PciGpu:
    return PciGpu(bdf=bdf, vendor_id=0x1002, device_id=device_id, class_code=0x038000, revision=0, driver=driver)


# --- AMD captures (real sysfs trees in tests/fixtures/amd) --------------------------------------

FIXTURES = Path(__file__).resolve().parent / "fixtures/amd"
MI300X_CPX = FIXTURES / "mi300x-x8-cpx-rocm-k8s-dp"
MI210 = FIXTURES / "mi210-x8-xgmi-rocm-k8s-dp"
RX7900XTX = FIXTURES / "rx7900xtx-navi31-tinygrad"
VEGA10 = FIXTURES / "vega10-mi25-rocm-k8s-dp"
FIRMWARE_INFO = FIXTURES / "debugfs-firmware-info/amdgpu_firmware_info"
TOPOLOGY = "sys/class/kfd/kfd/topology/nodes"


def kfd_node_goes(host_root: Path, node: int | str) -> Callable[[], None]:
    """A KFD topology node goes as amdkfd removes one (``kfd_topology_remove_device``): its directory
    goes, then the topology's ``generation_id`` moves (where the tree has one; a capture may not).
    The function returned brings it back the same way (``kfd_topology_add_device``)."""
    topology = host_root / TOPOLOGY
    path, saved = topology / str(node), topology.with_name(f"gone-{node}")
    path.rename(saved)
    _bump_generation(topology.parent)

    def back() -> None:
        saved.rename(path)
        _bump_generation(topology.parent)

    return back


def _bump_generation(topology: Path) -> None:
    generation = topology / "generation_id"
    if generation.exists():
        generation.write_text(f"{int(generation.read_text()) + 1}\n")


def copy_capture(capture: Path, tmp_path: Path) -> Path:
    root = tmp_path / "host"
    shutil.copytree(capture, root)
    return root


def pci_gpus_of(root: Path) -> tuple[PciGpu, ...]:
    """The PCI scan of a simulated root; the raw captures have no PCI tree, and their AMD backend
    is tested on its own."""
    return pci_scan(root)[0] if pci.devices_dir(root).is_dir() else ()


def amd_probe_of(root: Path, firmware: bool = False) -> tuple[AmdInventory | None, BackendReport]:
    return amd_probe.probe(root, pci_gpus_of(root), groups(firmware=firmware), enricher=no_enrichment)


def amd_labels_of(root: Path, config: Config | None = None) -> dict[str, str]:
    config = config or Config()
    pci_gpus = pci_gpus_of(root)
    part, report = amd_probe.probe(root, pci_gpus, config, enricher=no_enrichment)
    inventory = Inventory(pci_gpus=pci_gpus, parts=(part,) if part is not None else (), reports=(report,))
    return label_set_of(inventory, config).labels


# --- named configs (a mounted ConfigMap) ---------------------------------------------------------

def config_map_volume(directory: Path, configs: dict[str, Any]) -> Path:
    """Write ``configs`` (name -> config document, or its text) as the kubelet lays out a ConfigMap
    volume, and replace them the way it updates one: the files of each version live in a hidden
    timestamped directory, ``..data`` points at the current one and is swapped with one rename,
    and each key is a symlink ``<name> -> ..data/<name>`` (keys no longer present lose theirs)."""
    import os
    import time

    import yaml

    directory.mkdir(parents=True, exist_ok=True)
    version = directory / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.monotonic_ns()}"
    version.mkdir()
    for name, document in configs.items():
        (version / name).write_text(document if isinstance(document, str)
                                    else yaml.safe_dump(document, sort_keys=False))
    link = directory / "..data"
    try:
        old: str | None = os.readlink(link)
    except FileNotFoundError:
        old = None
    (directory / "..data_tmp").symlink_to(version.name)
    os.replace(directory / "..data_tmp", link)
    for name in configs:
        key = directory / name
        if not key.is_symlink():
            key.symlink_to(f"..data/{name}")
    for key in directory.iterdir():
        if not key.name.startswith(".") and key.name not in configs:
            key.unlink()
    if old is not None:
        shutil.rmtree(directory / old)
    return directory
