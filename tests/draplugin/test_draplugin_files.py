"""The DRA plugin's files cannot be turned against the node, and nothing it reads stalls it: a
symlink, FIFO or directory at a claim's CDI spec path is refused and its target never touched;
unprepare removes only regular files; checkpoint records are opened without waiting or following
links, bounded, and must be exactly what the plugin writes, else moved aside and the claim prepared
afresh; stale temporary files go at start; claim names that are not Kubernetes names never reach
the API. Real files, FIFOs and symlinks; the fake API server; the kubelet stand-in over gRPC."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from labeller.apps.draplugin.checkpoint import DIRECTORY, RECORD_LIMIT
from tests.draplugin.conftest import NODE, NVIDIA, Dirs, Running, simulated_plugin
from tests.draplugin.test_draplugin_prepare import KIND, checkpoint, claim_reads, spec_file
from tests.fakes.apiserver import FakeApiServer
from tests.fakes.drakubelet import Claim, FakeDraKubelet

PRECIOUS = "a file the plugin must never write\n"


def record(dirs: Dirs, claim: Claim) -> Path:
    return dirs.plugins / NVIDIA / DIRECTORY / f"{claim.uid}.json"


def victim(tmp_path: Path) -> Path:
    """A file outside every directory of the plugin, that a link at one of its paths leads to."""
    path = tmp_path / "elsewhere" / "victim.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(PRECIOUS)
    return path


@contextmanager
def unblocked(fifo: Path) -> Iterator[None]:
    """Whatever the code under test does, a reader it left waiting in ``open`` on ``fifo`` is let go
    afterwards (a writer opens and closes it), so a failing test ends instead of hanging."""
    try:
        yield
    finally:
        for path in (fifo, fifo.with_name(fifo.name + ".bad")):
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass


# --- CDI spec files ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_something_else_at_a_spec_path_refuses_the_claim_and_is_left_alone(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs, tmp_path: Path, kind: str) -> None:
    target = victim(tmp_path)
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        claim = run.claim("trap", "gpu-0")
        path = spec_file(dirs, claim)
        {"symlink": lambda: path.symlink_to(target), "fifo": lambda: os.mkfifo(path),
         "directory": lambda: path.mkdir()}[kind]()
        with unblocked(path):
            error = drakubelet.call_prepare(NVIDIA, [claim])[claim.uid].error
        what = {"symlink": "a symlink", "fifo": "a FIFO", "directory": "a directory"}[kind]
        assert error == (f"gpu.nvidia.com: claim default/trap: cannot write its CDI spec {path}: "
                         f"{path} is {what}, not a regular file; left alone")
        assert target.read_text() == PRECIOUS
        assert checkpoint(dirs) == {}  # not prepared
        assert not drakubelet.call_unprepare(NVIDIA, [claim])[claim.uid].error  # nothing of ours to remove
        assert os.path.lexists(path) and target.read_text() == PRECIOUS
        if kind == "symlink":
            assert os.readlink(path) == str(target)
        later = run.claim("later", "gpu-0")  # the device was not taken by the refused claim
        assert not drakubelet.call_prepare(NVIDIA, [later])[later.uid].error


def test_unprepare_removes_only_the_regular_file_it_wrote(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                         dirs: Dirs, tmp_path: Path) -> None:
    target = victim(tmp_path)
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        claim = run.claim("swapped", "gpu-1")
        assert not drakubelet.call_prepare(NVIDIA, [claim])[claim.uid].error
        path = spec_file(dirs, claim)
        path.unlink()
        path.symlink_to(target)  # someone swapped the spec for a link
        again = drakubelet.call_prepare(NVIDIA, [claim])[claim.uid]  # not in place: written again, refused
        assert again.error.endswith(f"{path} is a symlink, not a regular file; left alone")
        assert not drakubelet.call_unprepare(NVIDIA, [claim])[claim.uid].error
        assert path.is_symlink() and target.read_text() == PRECIOUS
        assert checkpoint(dirs) == {}


def test_stale_temporary_files_of_the_plugin_are_removed_at_start(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                                  dirs: Dirs, tmp_path: Path) -> None:
    target = victim(tmp_path)
    claims, uid = dirs.plugins / NVIDIA / DIRECTORY, "0b7c0e8e-0000-4000-8000-000000000001"
    claims.mkdir(parents=True)
    dirs.cdi.mkdir(parents=True)
    stale = [claims / f".{uid}.json.k3x9q1.tmp", dirs.cdi / f".gpu-labeller-dra_{NVIDIA}_{uid}.json.5f2a.tmp"]
    for path in stale:
        path.write_text("{half")
    kept = [dirs.cdi / ".someone-elses.json.1.tmp", dirs.cdi / "gpu-labeller-nvidia.json", claims / "notes.tmp"]
    for path in kept:
        path.write_text("{}")
    link = dirs.cdi / f".gpu-labeller-dra_{NVIDIA}_{uid}.json.link.tmp"
    link.symlink_to(target)  # matches, but not a regular file: left alone, its target never touched
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100"):
        assert not any(p.exists() for p in stale)
        assert all(p.read_text() == "{}" for p in kept)
        assert link.is_symlink() and target.read_text() == PRECIOUS


# --- checkpoint records ---------------------------------------------------------------------------------


def test_a_fifo_as_a_record_blocks_no_worker(api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        trapped, other = run.claim("trapped", "gpu-2"), run.claim("other", "gpu-3")
        fifo = record(dirs, trapped)
        os.mkfifo(fifo)
        answers: dict[str, Any] = {}
        with unblocked(fifo):
            thread = threading.Thread(target=lambda: answers.update(drakubelet.call_prepare(NVIDIA, [trapped])))
            thread.start()
            assert not drakubelet.call_prepare(NVIDIA, [other])[other.uid].error  # meanwhile, another claim
            thread.join(30)
        assert answers[trapped.uid].error == ""
        assert [list(d.cdi_device_ids) for d in answers[trapped.uid].devices] == [[f"{KIND}={trapped.uid}-gpu-2"]]
        aside = fifo.with_name(fifo.name + ".bad")
        assert aside.is_fifo() and checkpoint(dirs)[trapped.uid]["devices"][0]["device"] == "gpu-2"


def valid_record(uid: str, device: str = "gpu-0", **changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"version": 4, "driver": NVIDIA, "uid": uid, "namespace": "default", "name": "kept",
                           "devices": [{"requests": ["gpu"], "pool": NODE, "device": device,
                                        "cdiDeviceIDs": [f"{KIND}={uid}-{device}"], "shareID": None,
                                        "adminAccess": False, "consumedCapacity": {}}], "configs": []}
    doc.update(changes)
    return doc


def with_device(uid: str, **changes: Any) -> dict[str, Any]:
    doc = valid_record(uid)
    doc["devices"][0].update(changes)
    return doc


def sparse(path: Path, size: int) -> None:
    with path.open("wb") as handle:
        handle.truncate(size)


BAD_RECORDS: dict[str, Callable[[Path, str, Path], None]] = {
    "a directory": lambda path, uid, elsewhere: path.mkdir(),
    # a link to a record that would be right: followed, it would be believed
    "a symlink": lambda path, uid, elsewhere: (elsewhere.write_text(json.dumps(valid_record(uid))),
                                               path.symlink_to(elsewhere)),
    "1 GiB": lambda path, uid, elsewhere: sparse(path, 1 << 30),
    # right in every field, but larger than any record the plugin writes
    "over 64 KiB": lambda path, uid, elsewhere: path.write_text(json.dumps(valid_record(uid, pad="x" * RECORD_LIMIT))),
    "not JSON": lambda path, uid, elsewhere: path.write_text("{not json"),
    "nested beyond the parser": lambda path, uid, elsewhere: path.write_text("[" * 60000),
    "every GPU": lambda path, uid, elsewhere: path.write_text(json.dumps(with_device(uid, cdiDeviceIDs=[
        "nvidia.com/gpu=all"]))),
    "another claim's CDI ID": lambda path, uid, elsewhere: path.write_text(json.dumps(with_device(uid, cdiDeviceIDs=[
        f"{KIND}=5d1f0c7e-0000-4000-8000-000000000000-gpu-0"]))),
    "another node's pool": lambda path, uid, elsewhere: path.write_text(json.dumps(with_device(uid, pool="node-2"))),
    "a device name that is none": lambda path, uid, elsewhere: path.write_text(json.dumps(with_device(
        uid, device="../gpu-0", cdiDeviceIDs=[f"{KIND}={uid}-../gpu-0"]))),
    "another UID": lambda path, uid, elsewhere: path.write_text(json.dumps(valid_record(
        "5d1f0c7e-0000-4000-8000-000000000000"))),
    "no devices": lambda path, uid, elsewhere: path.write_text(json.dumps(valid_record(uid, devices=[]))),
    "version 5": lambda path, uid, elsewhere: path.write_text(json.dumps(valid_record(uid, version=5))),
    "a consumed capacity that is none": lambda path, uid, elsewhere: path.write_text(json.dumps(with_device(
        uid, consumedCapacity={"memory": "lots"}))),
    # a share's CDI ID names its share (version 4)
    "a share without its CDI ID": lambda path, uid, elsewhere: path.write_text(json.dumps(with_device(
        uid, shareID="5d1f0c7e-0000-4000-8000-00000000000b", consumedCapacity={"memory": "4Gi"}))),
    "an applied config that is not one": lambda path, uid, elsewhere: path.write_text(json.dumps(valid_record(
        uid, configs=[{"devices": ["gpu-0"], "applied": {"kind": "GpuConfig", "strategy": "MPS",
                                                         "daemon": f"../../{uid}-00000"}}]))),
}


@pytest.mark.parametrize("kind", sorted(BAD_RECORDS))
def test_a_record_that_is_not_the_plugins_is_moved_aside_and_the_claim_prepared_afresh(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs, tmp_path: Path, kind: str) -> None:
    elsewhere = victim(tmp_path)
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        claim = run.claim("kept", "gpu-0")
        path = record(dirs, claim)
        path.with_name(path.name + ".bad").write_text("an earlier bad record")  # in the way: another name
        BAD_RECORDS[kind](path, claim.uid, elsewhere)
        before = elsewhere.read_bytes()
        answer = drakubelet.call_prepare(NVIDIA, [claim])[claim.uid]
        assert answer.error == ""
        assert [list(d.cdi_device_ids) for d in answer.devices] == [[f"{KIND}={claim.uid}-gpu-0"]]
        assert claim_reads(api) == 1  # prepared from the API, not from the record
        assert path.with_name(path.name + ".bad").read_text() == "an earlier bad record"
        assert os.path.lexists(path.with_name(path.name + ".bad.1"))
        assert checkpoint(dirs)[claim.uid] == valid_record(claim.uid)
        assert elsewhere.read_bytes() == before


def test_a_version_1_record_is_read_and_its_devices_are_exclusive(api: FakeApiServer, drakubelet: FakeDraKubelet,
                                                                  dirs: Dirs) -> None:
    """What the previous release wrote: answered from it after the upgrade, and its device held."""
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        old, rival = run.claim("old", "gpu-4", shared=True), run.claim("rival", "gpu-4", shared=True)
    doc = valid_record(old.uid, "gpu-4", version=1, name="old")
    del doc["devices"][0]["shareID"], doc["devices"][0]["adminAccess"]
    record(dirs, old).write_text(json.dumps(doc))
    dirs.cdi.mkdir(parents=True, exist_ok=True)
    spec_file(dirs, old).write_text("{}")
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100"):
        answer = drakubelet.call_prepare(NVIDIA, [old])[old.uid]
        assert not answer.error and [d.device_name for d in answer.devices] == ["gpu-4"] and claim_reads(api) == 0
        assert drakubelet.call_prepare(NVIDIA, [rival])[rival.uid].error == (
            f"gpu.nvidia.com: claim default/rival: device gpu-4 is prepared for claim default/old ({old.uid}), "
            "and the allocations do not both allow sharing it")


# --- claim names ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("namespace", "name", "problem"), [
    ("default", "c1/../../../../../../../api/v1/namespaces/default/pods/p1",
     "name 'c1/../../../../../../../api/v1/namespaces/default/pods/p1' is not a DNS-1123 subdomain"),
    ("kube-system/secrets", "x", "namespace 'kube-system/secrets' is not a DNS-1123 label"),
    ("default", "..", "name '..' is not a DNS-1123 subdomain"),
    ("default", "", "name '' is not a DNS-1123 subdomain"),
    ("", "c1", "namespace '' is not a DNS-1123 label"),
    ("default", "Claim", "name 'Claim' is not a DNS-1123 subdomain"),
    ("default", "c1\n", "name 'c1\\n' is not a DNS-1123 subdomain"),
    ("default", "c" * 254, f"name '{'c' * 253}' is not a DNS-1123 subdomain"),
    ("a.b", "c1", "namespace 'a.b' is not a DNS-1123 label"),
])
def test_claim_names_that_are_not_kubernetes_names_fail_without_an_api_request(
        api: FakeApiServer, drakubelet: FakeDraKubelet, dirs: Dirs, namespace: str, name: str, problem: str) -> None:
    with simulated_plugin(api, drakubelet, dirs, "dgx-h100") as run:
        api.create_resource_claim("c1", results=[{"request": "gpu", "driver": NVIDIA, "pool": NODE, "device": "gpu-0"}])
        claim = Claim(namespace, name, "0b7c0e8e-0000-4000-8000-000000000002", NVIDIA)
        since = requests_so_far(run)
        error = drakubelet.call_prepare(NVIDIA, [claim])[claim.uid].error
        shown = name[:253].replace("\n", "\\n")  # one line whatever the kubelet sent
        assert error == f"claim {namespace}/{shown}: {problem}"
        assert requests_so_far(run) == since  # not one request, of any kind
        assert checkpoint(dirs) == {} and list(dirs.cdi.iterdir()) == []


def requests_so_far(run: Running) -> list[str]:
    """The paths of every request the API server saw but the slices' own (a watch may reconnect)."""
    with run.api.log.lock:
        return [r.path for r in run.api.log.requests if r.resource != "resourceslices"]
