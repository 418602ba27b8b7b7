"""The one socket server both plugins serve on: it tells its own socket file from a new one at the
same path, which is how a plugin sees that a restarting kubelet emptied its directory."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from labeller.process import sockets
from labeller.process.sockets import SocketServer, SocketUnavailable


class UnixListener:
    """What the plugins' gRPC server does with a unix socket, with the standard library."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.stopped = False

    def add_insecure_port(self, address: str) -> int:
        try:
            self.sock.bind(address.removeprefix("unix://"))
        except OSError as exc:
            raise RuntimeError(str(exc)) from None
        return 1

    def start(self) -> None:
        self.sock.listen()

    def stop(self, grace: float | None) -> SimpleNamespace:
        self.stopped = True
        self.sock.close()
        return SimpleNamespace(wait=lambda timeout: True)


def new_socket_file(path: Path) -> socket.socket:
    path.unlink()
    other = socket.socket(socket.AF_UNIX)
    other.bind(str(path))
    return other


def test_its_own_socket_is_ok_and_a_deleted_or_replaced_one_is_not(tmp_path: Path) -> None:
    path = tmp_path / "gpu.sock"
    server = SocketServer(path, UnixListener)
    server.start()
    assert server.socket_ok()
    other = new_socket_file(path)  # someone else's socket where ours was
    assert not server.socket_ok()
    other.close()
    path.unlink()
    assert not server.socket_ok()
    server.stop()
    server.start()  # re-created
    assert server.socket_ok() and path.exists()
    server.stop()
    assert not path.exists()  # its own socket is removed on stop


def test_a_new_socket_file_that_got_the_old_inode_number_is_seen_as_new(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """ext4 hands a freed inode number to the next file made: the number alone cannot tell them apart."""
    path = tmp_path / "gpu.sock"
    server = SocketServer(path, UnixListener)
    server.start()
    ours = os.stat(path)
    other = new_socket_file(path)
    real_stat = os.stat

    def stat_with_the_old_number(target: Path) -> os.stat_result:
        st = real_stat(target)
        return os.stat_result((st.st_mode, ours.st_ino, *st[2:]), {"st_ctime_ns": st.st_ctime_ns + 1})

    monkeypatch.setattr(sockets, "os", SimpleNamespace(stat=stat_with_the_old_number))
    assert not server.socket_ok()
    monkeypatch.undo()
    other.close()
    server.stop()
    assert path.exists()  # not ours: a stopping server never removes another's socket


def test_a_socket_that_cannot_listen_is_socket_unavailable_and_nothing_is_left_running(tmp_path: Path) -> None:
    made: list[UnixListener] = []

    def build() -> UnixListener:
        made.append(UnixListener())
        return made[-1]

    path = tmp_path / "gone" / "gpu.sock"  # its directory does not exist: bind fails
    server = SocketServer(path, build)
    with pytest.raises(SocketUnavailable, match=f"^{path}: cannot listen there"):
        server.start()
    assert made[0].stopped and not server.socket_ok()


def test_a_directory_at_the_path_is_never_removed(tmp_path: Path) -> None:
    path = tmp_path / "gpu.sock"
    path.mkdir()
    with pytest.raises(SocketUnavailable, match="a directory, not a socket; remove it"):
        SocketServer(path, UnixListener).start()
    assert path.is_dir()
