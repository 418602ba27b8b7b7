"""The KFD topology stamp the health poll reads every second (vendors/amd/generation.py): it sees
every change amdkfd makes, follows a replaced file, and never blocks on or believes a file that is
not a sysfs attribute."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.builders import TOPOLOGY, kfd_node_goes
from vendors.amd import generation
from vendors.amd.generation import TopologyStamp


def _topology(root: Path, generation: str | None = "7") -> Path:
    nodes = root / TOPOLOGY
    for node in ("0", "1", "2"):
        (nodes / node).mkdir(parents=True)
    if generation is not None:
        (nodes.parent / "generation_id").write_text(f"{generation}\n")
    return nodes.parent


def test_a_generation_bumped_in_place_is_seen_on_the_open_file(tmp_path: Path) -> None:
    topology = _topology(tmp_path)
    stamp = TopologyStamp(tmp_path)
    first = stamp.read()
    assert first == b"7\n"
    with open(topology / "generation_id", "r+") as file:  # amdkfd's counter: the same file, a new value
        file.write("8\n")
    assert stamp.read() == b"8\n"
    assert stamp.read() == b"8\n"


def test_a_kfd_node_that_goes_and_comes_back_moves_the_stamp_each_time(tmp_path: Path) -> None:
    _topology(tmp_path)
    stamp = TopologyStamp(tmp_path)
    before = stamp.read()
    back = kfd_node_goes(tmp_path, 1)
    gone = stamp.read()
    back()
    assert len({before, gone, stamp.read()}) == 3


def test_a_replaced_file_is_opened_again(tmp_path: Path) -> None:
    topology = _topology(tmp_path)
    stamp = TopologyStamp(tmp_path)
    assert stamp.read() == b"7\n"
    (topology / "new").write_text("9\n")
    os.replace(topology / "new", topology / "generation_id")  # a driver reload: a new attribute
    assert stamp.read() == b"9\n"


def test_without_a_generation_the_nodes_directory_is_the_stamp(tmp_path: Path) -> None:
    _topology(tmp_path, generation=None)  # a capture that left generation_id out
    stamp = TopologyStamp(tmp_path)
    before = stamp.read()
    back = kfd_node_goes(tmp_path, 2)
    gone = stamp.read()
    back()
    assert before != gone != stamp.read()


def test_a_node_without_kfd_has_no_stamp(tmp_path: Path) -> None:
    assert TopologyStamp(tmp_path).read() is None


def test_a_fifo_in_place_of_the_generation_is_refused_without_blocking(tmp_path: Path) -> None:
    topology = _topology(tmp_path, generation=None)
    os.mkfifo(topology / "generation_id")  # nobody writes it: opening it to read would block
    said = TopologyStamp(tmp_path).read()
    assert isinstance(said, str) and "generation_id" in said and "not a regular file" in said


def test_a_generation_larger_than_any_real_one_is_refused(tmp_path: Path) -> None:
    topology = _topology(tmp_path, generation=None)
    (topology / "generation_id").write_text("1" * 1000)
    said = TopologyStamp(tmp_path).read()
    assert isinstance(said, str) and "more than any real one" in said


def test_a_symlink_to_elsewhere_is_followed_only_to_a_regular_file(tmp_path: Path) -> None:
    topology = _topology(tmp_path, generation=None)
    (topology / "generation_id").symlink_to("/dev/zero")  # a character device: never read
    said = TopologyStamp(tmp_path).read()
    assert isinstance(said, str) and "not a regular file" in said


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_stamp_dropped_closes_its_file(tmp_path: Path) -> None:
    _topology(tmp_path)
    before = _open_fds()
    stamps = [TopologyStamp(tmp_path) for _ in range(20)]
    for stamp in stamps:
        assert stamp.read() == b"7\n"
    assert _open_fds() == before + 20
    del stamps, stamp
    assert _open_fds() == before


def test_a_stamp_collected_at_interpreter_exit_closes_its_file_quietly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # At interpreter exit a module's globals can be set to None before the objects holding stamps
    # are collected: CI saw "Exception ignored in TopologyStamp.__del__ ... 'NoneType' object has
    # no attribute 'close'" on every test worker's stderr.
    _topology(tmp_path)
    stamp = TopologyStamp(tmp_path)
    assert stamp.read() == b"7\n"
    before = _open_fds()
    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    monkeypatch.setattr(generation, "os", None)
    del stamp
    monkeypatch.undo()
    assert unraisable == []
    assert _open_fds() == before - 1
