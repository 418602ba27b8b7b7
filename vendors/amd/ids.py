"""Naming AMD GPUs without libdrm: the family code from the gfx target version or the PCI device id,
and the marketing name from ``amdgpu.ids`` (the host's copy, then the one shipped here).
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from pathlib import Path

from vendors.amd.facts import HOST_AMDGPU_IDS
from vendors.sysfs import TABLE_LIMIT, read_text


def family_of(gfx_target_version: int | None, device_id: int) -> str | None:
    """libdrm's family code (amdgpu_drm.h AMDGPU_FAMILY_*), derived from KFD's gfx target version.

    Without a gfx_target_version (old kernels, or no KFD at all) the PCI device id decides. None
    when unknown (AMD's labeller skips such a GPU too).
    """
    if gfx_target_version is None or gfx_target_version <= 0:
        return family_by_device_id(device_id)
    major, minor, step = gfx_target_version // 10000, gfx_target_version // 100 % 100, gfx_target_version % 100
    if major == 7:
        return "KV" if step in (0, 3, 5) else "CI"
    if major == 8:
        return "CZ" if (minor, step) in ((0, 1), (1, 0)) else "VI"
    if major == 9:
        return "RV" if minor == 0 and step in (2, 9, 12) else "AI"
    if major == 10:
        return _GC10_FAMILIES.get((minor, step), "NV")
    if major == 11:
        if minor == 0:
            return "GC_11_0_1" if step == 3 else "GC_11_0_0"
        return "GC_11_5_0" if minor == 5 else None
    if major == 12 and minor == 0:
        return "GC_12_0_0"
    return None


_GC10_FAMILIES = {(3, 3): "VGH", (3, 5): "YC", (3, 6): "GC_10_3_6", (3, 7): "GC_10_3_7"}

# PCI device id ranges -> family, for GPUs without a gfx_target_version.
# Up to Navi2x the kernel names each device's chip in its PCI id table (Linux
# drivers/gpu/drm/amd/amdgpu/amdgpu_drv.c, pciidlist: device id -> CHIP_*) and sets the family per
# chip (si.c; cik.c: Bonaire/Hawaii CI, Kaveri/Kabini/Mullins KV; vi.c: Carrizo/Stoney CZ, the
# rest VI; soc15: AI, APUs RV; nv: NV, Van Gogh VGH, Yellow Carp YC). Each range spans one run of
# that table. Later parts are bound by PCI class as CHIP_IP_DISCOVERY and get their family from
# the GC IP version (amdgpu_discovery.c); their ids are the ones libdrm's amdgpu.ids names.
_FAMILY_BY_DEVICE_RANGE = (
    (0x6600, 0x6631, "SI"),  # Oland
    (0x6660, 0x666F, "SI"),  # Hainan
    (0x6780, 0x679F, "SI"),  # Tahiti
    (0x6800, 0x684F, "SI"),  # Pitcairn, Verde (684C FirePro: radeon's drm_pciids.h only)
    (0x6640, 0x665F, "CI"),  # Bonaire
    (0x67A0, 0x67BE, "CI"),  # Hawaii
    (0x1304, 0x131D, "KV"),  # Kaveri
    (0x9830, 0x983F, "KV"),  # Kabini
    (0x9850, 0x985F, "KV"),  # Mullins
    (0x6900, 0x6907, "VI"),  # Topaz
    (0x6920, 0x6939, "VI"),  # Tonga
    (0x7300, 0x730F, "VI"),  # Fiji
    (0x67C0, 0x67FF, "VI"),  # Polaris10, Polaris11
    (0x6FDF, 0x6FDF, "VI"),  # Polaris10 (RX 580 2048SP)
    (0x6980, 0x699F, "VI"),  # Polaris12
    (0x694C, 0x694F, "VI"),  # VegaM
    (0x9870, 0x9877, "CZ"),  # Carrizo
    (0x98E4, 0x98E4, "CZ"),  # Stoney
    (0x6860, 0x687F, "AI"),  # Vega10 (MI25, RX Vega)
    (0x69A0, 0x69AF, "AI"),  # Vega12
    (0x66A0, 0x66AF, "AI"),  # Vega20 (MI50/MI60, Radeon VII)
    (0x7388, 0x7390, "AI"),  # Arcturus (MI100)
    (0x7408, 0x7410, "AI"),  # Aldebaran (MI200)
    (0x74A0, 0x74BF, "AI"),  # Aqua Vanjaram (MI300, GC 9.4.x), IP discovery
    (0x75A0, 0x75BF, "AI"),  # MI350 (GC 9.5.0), IP discovery
    (0x15D8, 0x15DD, "RV"),  # Raven, Picasso
    (0x15E7, 0x15E7, "RV"),  # Renoir
    (0x1636, 0x1638, "RV"),  # Renoir, Cezanne
    (0x164C, 0x164C, "RV"),  # Lucienne
    (0x7310, 0x731F, "NV"),  # Navi10
    (0x7340, 0x734F, "NV"),  # Navi14
    (0x7360, 0x7362, "NV"),  # Navi12
    (0x73A0, 0x73BF, "NV"),  # Navi21 (Sienna Cichlid)
    (0x73C0, 0x73DF, "NV"),  # Navi22 (Navy Flounder)
    (0x73E0, 0x73FF, "NV"),  # Navi23 (Dimgrey Cavefish)
    (0x7420, 0x743F, "NV"),  # Navi24 (Beige Goby)
    (0x13FE, 0x13FE, "NV"),  # Cyan Skillfish
    (0x163F, 0x163F, "VGH"),  # Van Gogh
    (0x1435, 0x1435, "VGH"),  # Van Gogh (Steam Deck OLED), IP discovery
    (0x164D, 0x164D, "YC"),  # Yellow Carp
    (0x1681, 0x1681, "YC"),  # Yellow Carp (Rembrandt)
    (0x164E, 0x164E, "GC_10_3_6"),  # Raphael, IP discovery from here on
    (0x1506, 0x1506, "GC_10_3_7"),  # Mendocino
    (0x7448, 0x749F, "GC_11_0_0"),  # Navi31, Navi32, Navi33 (GC 11.0.0/11.0.3/11.0.2)
    (0x15BF, 0x15BF, "GC_11_0_1"),  # Phoenix1 (GC 11.0.1)
    (0x15C8, 0x15C8, "GC_11_0_1"),  # Phoenix2 (GC 11.0.4)
    (0x1900, 0x1901, "GC_11_0_1"),  # Hawk Point
    (0x150E, 0x150E, "GC_11_5_0"),  # Strix Point (GC 11.5.0)
    (0x1586, 0x1586, "GC_11_5_0"),  # Strix Halo (GC 11.5.1)
    (0x1114, 0x1114, "GC_11_5_0"),  # Krackan Point (GC 11.5.2)
    (0x1902, 0x1902, "GC_11_5_0"),  # Krackan Point 2
    (0x7550, 0x755F, "GC_12_0_0"),  # Navi48 (GC 12.0.1)
    (0x7590, 0x759F, "GC_12_0_0"),  # Navi44 (GC 12.0.0)
)


def family_by_device_id(device_id: int) -> str | None:
    for first, last, family in _FAMILY_BY_DEVICE_RANGE:
        if first <= device_id <= last:
            return family
    return None


_IDS_LINE = re.compile(r"^([0-9A-Fa-f]{4}),\s*([0-9A-Fa-f]{2}),\s*(.+?)\s*$")


@functools.lru_cache(maxsize=4)
def _parse_amdgpu_ids(path: Path) -> dict[tuple[int, int], str]:
    text = read_text(path, TABLE_LIMIT) or ""
    table: dict[tuple[int, int], str] = {}
    for line in text.splitlines():
        match = _IDS_LINE.match(line)
        if match:
            table[(int(match.group(1), 16), int(match.group(2), 16))] = match.group(3)
    return table


def _bundled_amdgpu_ids() -> Path:
    return Path(str(resources.files("vendors") / "data" / "amdgpu.ids"))


def _lookup(table: dict[tuple[int, int], str], device_id: int, revision: int | None) -> str | None:
    if revision is not None:
        return table.get((device_id, revision))
    names = {name for (dev, _), name in table.items() if dev == device_id}
    return names.pop() if len(names) == 1 else None


def marketing_name(host_root: Path, device_id: int, revision: int | None) -> str | None:
    """libdrm's marketing name from amdgpu.ids: the host's copy, then (for GPUs newer than the host's
    libdrm) the one shipped here. Without a revision, only a name every revision shares."""
    for path in (host_root / HOST_AMDGPU_IDS, _bundled_amdgpu_ids()):
        name = _lookup(_parse_amdgpu_ids(path), device_id, revision)
        if name:
            return name
    return None
