"""The MIG geometry of each MIG-capable NVIDIA GPU: its GPU instance profiles and where they sit.

Per model: the memory slices and compute slices the GPU has, and per GPU instance profile the
NVML profile it is (pynvml's ``NVML_GPU_INSTANCE_PROFILE_<nvml>``, the index NVML calls take), the
profile id NVML reports (``nvidia-smi mig -lgip`` "ID"), its name, the memory and compute slices it
takes, how many fit on one GPU, the memory slices it may start at (``nvidia-smi mig -lgipp``), its
memory in MiB as NVML reports it, its SM count and its engines. Data only: the simulated NVML reads
it, and so can anything that has to know what a GPU can be split into.

Sources. The profiles, their fractions, instance counts and engines are NVIDIA's Multi-Instance GPU
User Guide (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/, r580: "Supported MIG
Profiles", "Supported GPUs", and "Getting Started with MIG" for the A100-SXM4-40GB's ``-lgip`` and
``-lgipp``); the device names and PCI device ids are those of NVIDIA's driver README (supported
GPUs) and mig-parted's ``config-default.yaml`` device filters. Profile ids, placements, memory and
SM counts are what ``nvidia-smi mig -lgip`` / ``-lgipp`` print; each model's ``source`` says where
its figures were read, and which ones were derived because no such listing of that GPU was found.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Engines:
    copy: int
    decoder: int
    encoder: int
    jpeg: int
    ofa: int


@dataclass(frozen=True)
class GpuInstanceProfile:
    nvml: str  # pynvml's NVML_GPU_INSTANCE_PROFILE_<nvml>
    id: int  # the profile id NVML reports for it on this model
    name: str  # "1g.10gb+me", as NVIDIA's tools name it
    memory_slices: int  # the size of each of its placements
    compute_slices: int  # "1g": its GPU (SM) slices
    instances: int  # how many can exist on one GPU at once
    starts: tuple[int, ...]  # the memory slices a GPU instance of it may start at
    memory_mib: int
    multiprocessors: int
    engines: Engines


@dataclass(frozen=True)
class MigModel:
    model: str  # for messages: "B200"
    names: tuple[str, ...]  # nvmlDeviceGetName of the GPUs it describes
    pci_device_ids: tuple[int, ...]
    memory_mib: int  # the total NVML reports on the GPU the figures are from
    memory_slices: int
    compute_slices: int
    profiles: tuple[GpuInstanceProfile, ...]
    source: str

    def profile(self, name: str) -> GpuInstanceProfile | None:
        return next((profile for profile in self.profiles if profile.name == name), None)


# Layouts: NVML profile -> (profile id, memory slices, compute slices, instances, starts).
# GA100 (A100), GH100 (H100, H200, H20, H800, GH200) and GB100 (B200, GB200): 8 memory slices, 7
# compute slices; the A100-SXM4-40GB's -lgipp in the user guide. The H100 NVL's -lgipp (driver
# 560.35.03) prints the same, and the Hopper and Blackwell tables give the same fractions.
_EIGHT_SLICES = (8, 7, {
    "1_SLICE": (19, 1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
    "1_SLICE_REV1": (20, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
    "1_SLICE_REV2": (15, 2, 1, 4, (0, 2, 4, 6)),
    "2_SLICE": (14, 2, 2, 3, (0, 2, 4)),
    "3_SLICE": (9, 4, 3, 2, (0, 4)),
    "4_SLICE": (5, 4, 4, 1, (0,)),
    "7_SLICE": (0, 8, 7, 1, (0,)),
})
# A30: 4 memory slices, 4 compute slices (-lgip and -lgipp of an A30, driver 535.183.01).
_A30_SLICES = (4, 4, {
    "1_SLICE": (14, 1, 1, 4, (0, 1, 2, 3)),
    "1_SLICE_REV1": (21, 1, 1, 1, (0, 1, 2, 3)),
    "2_SLICE": (5, 2, 2, 2, (0, 2)),
    "2_SLICE_REV1": (6, 2, 2, 1, (0, 2)),
    "4_SLICE": (0, 4, 4, 1, (0,)),
})
# GB202 (RTX PRO 6000 Blackwell): 12 memory slices, 4 compute slices (-lgip and -lgipp of an RTX PRO
# 6000 Blackwell Server Edition).
_GB202_SLICES = (12, 4, {
    "1_SLICE": (14, 3, 1, 4, (0, 3, 6, 9)),
    "1_SLICE_REV1": (21, 3, 1, 1, (0, 3, 6, 9)),
    "1_SLICE_GFX": (47, 3, 1, 4, (0, 3, 6, 9)),
    "1_SLICE_ALL_ME": (65, 3, 1, 1, (0, 3, 6, 9)),
    "1_SLICE_NO_ME": (67, 3, 1, 4, (0, 3, 6, 9)),
    "2_SLICE": (5, 6, 2, 2, (0, 6)),
    "2_SLICE_GFX": (35, 6, 2, 2, (0, 6)),
    "2_SLICE_ALL_ME": (64, 6, 2, 1, (0, 6)),
    "2_SLICE_NO_ME": (66, 6, 2, 2, (0, 6)),
    "4_SLICE": (0, 12, 4, 1, (0,)),
    "4_SLICE_GFX": (32, 12, 4, 1, (0,)),
})

_Layout = tuple[int, int, dict[str, tuple[int, int, int, int, tuple[int, ...]]]]
# A row: NVML profile, name, memory MiB, SMs, (copy, decoder, encoder, jpeg, ofa) engines.
_Row = tuple[str, str, int, int, tuple[int, int, int, int, int]]


def _model(model: str, names: Iterable[str], pci_device_ids: Iterable[int], memory_mib: int, layout: _Layout,
           rows: Iterable[_Row], source: str) -> MigModel:
    memory_slices, compute_slices, geometry = layout
    profiles = []
    for nvml, name, mib, sms, engines in rows:
        profile_id, size, slices, instances, starts = geometry[nvml]
        profiles.append(GpuInstanceProfile(nvml, profile_id, name, size, slices, instances, starts, mib, sms,
                                           Engines(*engines)))
    return MigModel(model, tuple(names), tuple(pci_device_ids), memory_mib, memory_slices, compute_slices,
                    tuple(profiles), source)


def _hopper(names: tuple[str, str, str, str, str, str, str], memory: tuple[int, int, int, int, int, int, int],
            sms: tuple[int, int, int, int, int, int, int]) -> list[_Row]:
    """The seven profiles of a GH100: the engines of the user guide's H100, H200 and GH200 tables."""
    engines = ((1, 1, 0, 1, 0), (1, 1, 0, 1, 1), (1, 1, 0, 1, 0), (2, 2, 0, 2, 0), (3, 3, 0, 3, 0),
               (4, 4, 0, 4, 0), (8, 7, 0, 7, 1))
    nvml = ("1_SLICE", "1_SLICE_REV1", "1_SLICE_REV2", "2_SLICE", "3_SLICE", "4_SLICE", "7_SLICE")
    return list(zip(nvml, names, memory, sms, engines, strict=True))


def _blackwell(names: tuple[str, str, str, str, str, str, str],
               memory: tuple[int, int, int, int, int, int, int]) -> list[_Row]:
    """The seven profiles of a GB100: engines from the user guide's B200 table; SMs from go-nvml's
    B200 mock (18 per compute slice; 18 is what a B200's 1g.23gb reports)."""
    engines = ((2, 1, 0, 1, 0), (2, 1, 0, 1, 1), (2, 1, 0, 1, 0), (3, 1, 0, 1, 0), (6, 1, 0, 1, 0),
               (8, 1, 0, 1, 0), (16, 1, 0, 1, 1))
    nvml = ("1_SLICE", "1_SLICE_REV1", "1_SLICE_REV2", "2_SLICE", "3_SLICE", "4_SLICE", "7_SLICE")
    return list(zip(nvml, names, memory, (18, 18, 18, 36, 54, 72, 126), engines, strict=True))


_H100_80GB_NAMES = ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
_H100_80GB_MEMORY = (9984, 9984, 20096, 20096, 40448, 40448, 81152)
_H100_96GB_NAMES = ("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb")
_H100_96GB_MEMORY = (11264, 11264, 23552, 23552, 47616, 47616, 95232)
_GH100_SMS = (16, 16, 26, 32, 60, 64, 132)

MIG_MODELS: tuple[MigModel, ...] = (
    _model("A30", ["NVIDIA A30"], [0x20B7], 24576, _A30_SLICES, [
        ("1_SLICE", "1g.6gb", 5952, 14, (1, 1, 0, 0, 0)),
        ("1_SLICE_REV1", "1g.6gb+me", 5952, 14, (1, 1, 0, 1, 1)),
        ("2_SLICE", "2g.12gb", 11968, 28, (2, 2, 0, 0, 0)),
        ("2_SLICE_REV1", "2g.12gb+me", 11968, 28, (2, 2, 0, 1, 1)),
        ("4_SLICE", "4g.24gb", 24000, 56, (4, 4, 0, 1, 1)),
    ], "nvidia-smi mig -lgip/-lgipp on an A30, driver 535.183.01 (NVML reports a decoder on 1g.6gb, "
       "where the guide's table says 0 NVDECs)"),
    _model("A100 40GB", ["NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"], [0x20B0, 0x20F1], 40960, _EIGHT_SLICES, [
        ("1_SLICE", "1g.5gb", 4864, 14, (1, 0, 0, 0, 0)),
        ("1_SLICE_REV1", "1g.5gb+me", 4864, 14, (1, 1, 0, 1, 1)),
        ("1_SLICE_REV2", "1g.10gb", 9856, 14, (1, 1, 0, 0, 0)),
        ("2_SLICE", "2g.10gb", 9856, 28, (2, 1, 0, 0, 0)),
        ("3_SLICE", "3g.20gb", 19968, 42, (3, 2, 0, 0, 0)),
        ("4_SLICE", "4g.20gb", 19968, 56, (4, 2, 0, 0, 0)),
        ("7_SLICE", "7g.40gb", 40192, 98, (7, 5, 0, 1, 1)),
    ], "the user guide's -lgip and -lgipp of an A100-SXM4-40GB (drivers before R525 report 9984, 20096 "
       "and 40448 MiB for the 2, 4 and 8 slice profiles)"),
    _model("A100 80GB", ["NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"], [0x20B2, 0x20B5], 81920, _EIGHT_SLICES, [
        ("1_SLICE", "1g.10gb", 9728, 14, (1, 0, 0, 0, 0)),
        ("1_SLICE_REV1", "1g.10gb+me", 9728, 14, (1, 1, 0, 1, 1)),
        ("1_SLICE_REV2", "1g.20gb", 19968, 14, (1, 1, 0, 0, 0)),
        ("2_SLICE", "2g.20gb", 19968, 28, (2, 1, 0, 0, 0)),
        ("3_SLICE", "3g.40gb", 40192, 42, (3, 2, 0, 0, 0)),
        ("4_SLICE", "4g.40gb", 40192, 56, (4, 2, 0, 0, 0)),
        ("7_SLICE", "7g.80gb", 80896, 98, (7, 5, 0, 1, 1)),
    ], "nvidia-smi mig -lgip on an A100 80GB PCIe, driver 515.86.01; 1g.20gb (R525 and later) as the "
       "A100 40GB's 1g.10gb: the memory of the two-slice profiles, one compute slice, one decoder"),
    _model("H100 80GB HBM3", ["NVIDIA H100 80GB HBM3"], [0x2330], 81559, _EIGHT_SLICES,
           _hopper(_H100_80GB_NAMES, _H100_80GB_MEMORY, _GH100_SMS),
           "nvidia-smi mig -lgip on an H100 SXM5 80GB"),
    _model("H800", ["NVIDIA H800"], [0x2324], 81559, _EIGHT_SLICES,
           _hopper(_H100_80GB_NAMES, _H100_80GB_MEMORY, _GH100_SMS),
           "as the H100 SXM5 80GB (the same GH100 with 132 SMs and 81559 MiB; NVIDIA's vGPU guide lists "
           "the same MIG profiles for it); no listing of an H800 found"),
    _model("H100 PCIe", ["NVIDIA H100 PCIe"], [0x2331], 81559, _EIGHT_SLICES,
           _hopper(_H100_80GB_NAMES, _H100_80GB_MEMORY, (14, 14, 14, 30, 46, 62, 114)),
           "nvidia-smi mig -lgip on an H100 PCIe, driver 570.169"),
    _model("H100 NVL", ["NVIDIA H100 NVL"], [0x2321], 95830, _EIGHT_SLICES,
           _hopper(("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"),
                   (11008, 11008, 22144, 22144, 47488, 47488, 95360), _GH100_SMS),
           "nvidia-smi mig -lgip/-lgipp on an H100 NVL, driver 560.35.03"),
    _model("GH200 96GB", ["NVIDIA GH200 480GB", "NVIDIA GH200 120GB"], [0x2342], 97871, _EIGHT_SLICES,
           _hopper(_H100_96GB_NAMES, _H100_96GB_MEMORY, _GH100_SMS),
           "nvidia-smi mig -lgip on a GH200 480GB"),
    _model("H20", ["NVIDIA H20"], [0x2329], 97871, _EIGHT_SLICES,
           _hopper(_H100_96GB_NAMES, _H100_96GB_MEMORY, (11, 11, 11, 22, 33, 44, 78)),
           "the user guide lists the H20 with the H100 96GB; mig-parted gives it the 96GB profiles. No "
           "listing of an H20 found: memory as the GH200 96GB's (the same 97871 MiB), SMs derived from "
           "its 78 SMs (78 x compute slices / 7)"),
    _model("H200", ["NVIDIA H200", "NVIDIA H200 NVL"], [0x2335, 0x233B], 143771, _EIGHT_SLICES,
           _hopper(("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
                   (16384, 16384, 33280, 33280, 71424, 71424, 143360), _GH100_SMS),
           "NVML on a real H200, driver 580.159.04 (tests/fixtures/nvidia/h200-passthrough/nvml.json): "
           "every profile's id, memory, SMs, engines, instances and placements (an nvidia-smi mig -lgip "
           "listing found before said 32.25 GiB for 1g.35gb and 69.50 for 3g.71gb and 4g.71gb)"),
    _model("B200", ["NVIDIA B200"], [0x2901, 0x2909], 183359, _EIGHT_SLICES,
           _blackwell(("1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"),
                      (22656, 22656, 45312, 45312, 90624, 90624, 181248)),
           "the user guide's B200 table; 2g.45gb holds 45312 MiB (44.25 GiB) on a B200. The other sizes "
           "are derived: the same share of the GPU's memory per slice, in 128 MiB steps"),
    _model("GB200", ["NVIDIA GB200"], [0x2941], 189471, _EIGHT_SLICES,
           _blackwell(("1g.23gb", "1g.23gb+me", "1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb", "7g.186gb"),
                      (23296, 23296, 46720, 46720, 93568, 93568, 187264)),
           "the GB100 of the B200 with 189471 MiB: the user guide lists the GB200 (186GB, 7 instances) "
           "and mig-parted its profile names; memory derived as the B200's, SMs and engines the B200's"),
    _model("RTX PRO 6000 Blackwell",
           ["NVIDIA RTX PRO 6000 Blackwell Server Edition", "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
            "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"], [0x2BB5, 0x2BB1, 0x2BB4], 97887,
           _GB202_SLICES, [
               ("1_SLICE", "1g.24gb", 24192, 46, (1, 1, 1, 1, 0)),
               ("1_SLICE_REV1", "1g.24gb+me", 24192, 46, (1, 1, 1, 1, 1)),
               ("1_SLICE_GFX", "1g.24gb+gfx", 24192, 46, (1, 1, 1, 1, 0)),
               ("1_SLICE_ALL_ME", "1g.24gb+me.all", 24192, 46, (1, 4, 4, 4, 1)),
               ("1_SLICE_NO_ME", "1g.24gb-me", 24192, 46, (1, 0, 0, 0, 0)),
               ("2_SLICE", "2g.48gb", 48512, 94, (2, 2, 2, 2, 0)),
               ("2_SLICE_GFX", "2g.48gb+gfx", 48512, 94, (2, 2, 2, 2, 0)),
               ("2_SLICE_ALL_ME", "2g.48gb+me.all", 48512, 94, (2, 4, 4, 4, 1)),
               ("2_SLICE_NO_ME", "2g.48gb-me", 48512, 94, (2, 0, 0, 0, 0)),
               ("4_SLICE", "4g.96gb", 97408, 188, (4, 4, 4, 4, 1)),
               ("4_SLICE_GFX", "4g.96gb+gfx", 97408, 188, (4, 4, 4, 4, 1)),
           ], "nvidia-smi mig -lgip/-lgipp on an RTX PRO 6000 Blackwell Server Edition"),
)


def mig_model(name: str, pci_device_id: int) -> MigModel | None:
    """The model a GPU is, by its PCI device id, else by the name NVML gives it; None if unknown."""
    by_id = next((model for model in MIG_MODELS if pci_device_id in model.pci_device_ids), None)
    return by_id or next((model for model in MIG_MODELS if name in model.names), None)
