"""labeller.base.inotify: a directory's changes are told without anyone looking at it, including a directory
that is not there yet, one deleted and made again (a kubelet restarting), and one replaced."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import labeller.base.inotify
from labeller.base.inotify import DirectoryWatch
from tests.builders import wait_for


class Told:
    """A ``changed`` callback that counts the calls."""

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            self.calls += 1

    def after(self, action: object) -> None:
        """Run ``action()`` and wait until it is told."""
        before = self.calls
        action()  # type: ignore[operator]
        wait_for(lambda: self.calls > before)


@pytest.fixture
def told() -> Told:
    return Told()


@pytest.fixture
def watch(told: Told) -> Iterator[DirectoryWatch]:
    directory_watch = DirectoryWatch(told, "test-watch")
    yield directory_watch
    directory_watch.close()


def test_entries_created_rewritten_renamed_and_deleted_are_told(watch: DirectoryWatch, told: Told,
                                                                tmp_path: Path) -> None:
    watch.watch([tmp_path])
    assert watch.available and watch.watching
    file = tmp_path / "profile.yaml"
    told.after(lambda: file.write_text("a"))
    told.after(lambda: file.write_text("b"))  # rewritten in place, closed
    told.after(lambda: file.rename(tmp_path / "moved.yaml"))
    told.after(lambda: (tmp_path / "moved.yaml").unlink())


def test_a_directory_that_is_not_there_yet_is_watched_once_it_appears(watch: DirectoryWatch, told: Told,
                                                                      tmp_path: Path) -> None:
    plugins = tmp_path / "plugins" / "gpu.nvidia.com"
    watch.watch([plugins])
    assert watch.watching  # through its nearest parent that exists
    told.after(lambda: plugins.mkdir(parents=True))
    told.after(lambda: (plugins / "dra.sock").write_text(""))  # inside it: it is watched itself now


def test_a_directory_deleted_and_made_again_is_watched_again(watch: DirectoryWatch, told: Told,
                                                             tmp_path: Path) -> None:
    """A kubelet that restarts may remove its plugin registry directory and make it again."""
    registry = tmp_path / "plugins_registry"
    registry.mkdir()
    (registry / "gpu.nvidia.com-reg.sock").write_text("")
    watch.watch([registry])
    told.after(lambda: shutil.rmtree(registry))
    told.after(registry.mkdir)
    told.after(lambda: (registry / "gpu.nvidia.com-reg.sock").write_text(""))


def test_a_directory_made_while_its_parents_watch_is_added_is_watched_itself(watch: DirectoryWatch, told: Told,
                                                                            tmp_path: Path) -> None:
    """The registry deleted, and made again by a restarting kubelet just as the watch falls back to
    its parent: that watch never hears of it (it was there before the watch), so the watch looks
    again. Before, the socket written in it next went unseen (a CI run failed on this race)."""
    registry = tmp_path / "plugins_registry"
    registry.mkdir()
    watch.watch([registry])
    inotify = watch._inotify
    assert inotify is not None
    add = inotify.add

    def kubelet_is_quicker(path: Path, *args: int) -> int:
        if path == tmp_path and not registry.exists():
            registry.mkdir()  # between the look that found it gone and the parent's watch
        return add(path, *args)

    inotify.add = kubelet_is_quicker  # type: ignore[method-assign]
    told.after(lambda: shutil.rmtree(registry))
    told.after(lambda: (registry / "gpu.nvidia.com-reg.sock").write_text(""))


def test_a_directory_replaced_by_another_is_followed_to_the_new_one(watch: DirectoryWatch, told: Told,
                                                                    tmp_path: Path) -> None:
    configs = tmp_path / "configs"
    configs.mkdir()
    watch.watch([configs])
    told.after(lambda: (configs.rename(tmp_path / "old"), configs.mkdir()))
    told.after(lambda: (configs / "default").write_text("version: v1\n"))


def test_a_callback_that_fails_does_not_end_the_watch(tmp_path: Path) -> None:
    calls: list[int] = []

    def changed() -> None:
        calls.append(1)
        raise RuntimeError("a bug in the caller")

    watch = DirectoryWatch(changed, "test-watch")
    try:
        watch.watch([tmp_path])
        (tmp_path / "a").write_text("")
        wait_for(lambda: calls)
        (tmp_path / "b").write_text("")
        wait_for(lambda: len(calls) >= 2)
    finally:
        watch.close()


def test_close_ends_its_thread(told: Told, tmp_path: Path) -> None:
    watch = DirectoryWatch(told, "test-watch-closing")
    watch.watch([tmp_path])
    assert any(t.name == "test-watch-closing" for t in threading.enumerate())
    watch.close()
    assert not any(t.name == "test-watch-closing" for t in threading.enumerate())
    assert not watch.watching


def test_without_inotify_the_caller_is_told_to_look_itself(told: Told, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable() -> None:
        raise OSError(24, "inotify_init1: Too many open files")

    monkeypatch.setattr(labeller.base.inotify, "Inotify", unavailable)
    watch = DirectoryWatch(told, "test-watch")
    watch.watch([tmp_path])
    assert not watch.available and not watch.watching
    watch.close()
