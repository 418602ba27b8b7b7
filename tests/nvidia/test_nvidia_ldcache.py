"""The host's linker cache, read for the driver's library directories (vendors/nvidia/ldcache.py).

``gke-layout.ld.so.cache`` was written by glibc's own ``ldconfig -r ROOT`` (Debian GLIBC 2.36) over a
tree with ``libcuda.so.580.159.04`` and ``libnvidia-ml.so.580.159.04`` (sonames ``.so.1``) in
``/usr/local/nvidia/lib64`` and a ``libz.so.1`` in ``/usr/lib/x86_64-linux-gnu``, both listed in its
``ld.so.conf``: the layout of the H200 machine in tests/fixtures/nvidia/h200-passthrough/layout.txt."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest

from labeller.model.config import parse_config
from tests.builders import nvidia, nvidia_gpu, offer_of
from vendors import RESOURCE_NAMES
from vendors.nvidia import cdi as nvidia_cdi
from vendors.nvidia import ldcache
from vendors.nvidia.ldcache import driver_library_dirs, libraries

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia" / "ldcache" / "gke-layout.ld.so.cache"


def test_a_cache_ldconfig_wrote_lists_its_libraries_as_ldconfig_p_does() -> None:
    assert libraries(FIXTURE.read_bytes()) == [
        ("libz.so.1", "/usr/lib/x86_64-linux-gnu/libz.so.1"),
        ("libnvidia-ml.so.1", "/usr/local/nvidia/lib64/libnvidia-ml.so.1"),
        ("libcuda.so.1", "/usr/local/nvidia/lib64/libcuda.so.1"),
    ]


def test_an_old_format_table_before_the_new_one_is_skipped() -> None:
    new = FIXTURE.read_bytes()
    old = b"ld.so-1.7.0\0" + struct.pack("<I", 1) + struct.pack("<iII", 1, 0, 0)  # one old entry, 28 bytes
    assert libraries(old + b"\0" * 4 + new)[2] == ("libcuda.so.1", "/usr/local/nvidia/lib64/libcuda.so.1")


@pytest.mark.parametrize("damage", [
    lambda data: data[:40],  # cut in the header
    lambda data: data[:100],  # cut in the entries
    lambda data: b"not a cache" + data,
    lambda data: data[:20] + struct.pack("<I", 10**6) + data[24:],  # more entries than bytes
    lambda data: data[:0x34] + struct.pack("<I", 10**6) + data[0x38:],  # a key far outside the cache
    lambda data: b"",
])
def test_a_cache_ldconfig_did_not_write_gives_nothing(damage: object) -> None:
    assert callable(damage)
    assert libraries(damage(FIXTURE.read_bytes())) == []


def test_a_32_bit_entry_is_not_a_driver_directory() -> None:
    data = bytearray(FIXTURE.read_bytes())
    struct.pack_into("<i", data, 48 + 2 * 24, 0x0003)  # libcuda.so.1 as a 32-bit libc6 library
    assert [name for name, _ in libraries(bytes(data))] == ["libz.so.1", "libnvidia-ml.so.1"]


def _gke_host(root: Path) -> None:
    lib = root / "usr/local/nvidia/lib64"
    lib.mkdir(parents=True)
    for name in ("libcuda.so.580.159.04", "libnvidia-ml.so.580.159.04"):
        (lib / name).write_text("ELF")
    (lib / "libcuda.so.1").symlink_to("libcuda.so.580.159.04")
    (root / "etc").mkdir()
    (root / "etc/ld.so.cache").write_bytes(FIXTURE.read_bytes())


def test_the_driver_directories_are_those_of_libcuda_and_libnvidia_ml(tmp_path: Path) -> None:
    _gke_host(tmp_path)
    assert driver_library_dirs(tmp_path) == ["usr/local/nvidia/lib64"]
    assert driver_library_dirs(tmp_path / "elsewhere") == []


def test_a_fifo_or_a_huge_file_as_the_cache_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    os.mkfifo(tmp_path / "etc/ld.so.cache")
    assert driver_library_dirs(tmp_path) == []  # and it did not wait for a writer


def _cdi_spec(host: Path) -> dict[str, Any]:
    """The NVIDIA CDI spec of one GPU on ``host`` (a CDI strategy)."""
    config = parse_config({"flags": {"plugin": {"deviceListStrategy": "cdi-cri"}}}, RESOURCE_NAMES)
    (resource,) = offer_of(nvidia(nvidia_gpu(0)), config).resources
    spec = nvidia_cdi.spec(resource.physical_devices, config, host)
    assert spec is not None
    return spec


def _mounts(spec: dict[str, Any]) -> set[tuple[str, str]]:
    return {(m["hostPath"], m["containerPath"]) for m in spec["containerEdits"]["mounts"]}


def test_a_cache_is_parsed_once_until_ldconfig_replaces_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim's spec is built at every prepare: the cache is not parsed again while it is the same file."""
    _gke_host(tmp_path)
    parsed: list[int] = []
    real = ldcache.libraries
    monkeypatch.setattr(ldcache, "libraries", lambda data: parsed.append(len(data)) or real(data))
    for _ in range(3):
        assert driver_library_dirs(tmp_path) == ["usr/local/nvidia/lib64"]
    assert len(parsed) == 1
    (tmp_path / "etc/ld.so.cache.new").write_bytes(b"not a cache, written as ldconfig writes: then renamed")
    os.replace(tmp_path / "etc/ld.so.cache.new", tmp_path / "etc/ld.so.cache")
    assert driver_library_dirs(tmp_path) == []
    assert len(parsed) == 2
    (tmp_path / "etc/ld.so.cache").unlink()
    assert driver_library_dirs(tmp_path) == []


def test_a_gke_layout_driver_is_mounted_into_cdi_containers(tmp_path: Path) -> None:
    """The CDI spec of a host whose driver is in /usr/local/nvidia/lib64 (found on a real H200's
    machine: the spec had its binaries and none of its libraries) mounts its libraries."""
    _gke_host(tmp_path)
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "usr/bin/nvidia-ctk").write_text("ELF")
    spec = _cdi_spec(tmp_path)
    lib = "/usr/local/nvidia/lib64"
    assert _mounts(spec) == {
        (f"{lib}/libcuda.so.580.159.04", f"{lib}/libcuda.so.580.159.04"),
        (f"{lib}/libnvidia-ml.so.580.159.04", f"{lib}/libnvidia-ml.so.580.159.04"),
        (f"{lib}/libcuda.so.580.159.04", f"{lib}/libcuda.so.1"),
    }
    assert spec["containerEdits"]["hooks"][0]["args"][-2:] == ["--folder", lib]
    json.dumps(spec)


def test_a_debian_packaged_driver_in_nvidia_current_is_mounted_without_a_cache(tmp_path: Path) -> None:
    """Debian's nvidia-driver packages put the libraries in <multiarch>/nvidia/current, which nvidia-ctk
    searches before it reads any cache; so does the spec, with no cache on the host."""
    lib = tmp_path / "usr/lib/x86_64-linux-gnu/nvidia/current"
    lib.mkdir(parents=True)
    (lib / "libcuda.so.535.216.01").write_text("ELF")
    (lib / "libcuda.so.1").symlink_to("libcuda.so.535.216.01")
    current = "/usr/lib/x86_64-linux-gnu/nvidia/current"
    assert _mounts(_cdi_spec(tmp_path)) == {
        (f"{current}/libcuda.so.535.216.01", f"{current}/libcuda.so.535.216.01"),
        (f"{current}/libcuda.so.535.216.01", f"{current}/libcuda.so.1"),
    }
