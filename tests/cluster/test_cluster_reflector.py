"""The one list-then-watch loop, against the fake API server over real HTTP: it lists then follows
every change, resumes a watch that ends, lists again after a 410 or a broken watch, reports a
missing permission once (and again only after it worked), logs an outage once, and stops."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog.testing

from labeller.cluster.kube import Kube
from labeller.cluster.permissions import PermissionLog
from labeller.cluster.reflector import Obj, Reflector, Watcher
from tests.builders import AT_ONCE_S, wait_for
from tests.fakes.apiserver import FakeApiServer, Fault


class View:
    """What a holder of the view sees: every list's names, every event, and each ``stale`` call."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lists: list[list[str]] = []
        self.events: list[tuple[str, str]] = []
        self.stale = 0
        self.nodes: dict[str, Obj] = {}

    def replace(self, items: list[Obj], resource_version: str) -> None:
        assert resource_version
        with self.lock:
            self.lists.append(sorted(item["metadata"]["name"] for item in items))
            self.nodes = {item["metadata"]["name"]: item for item in items}

    def changed(self, kind: str, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        with self.lock:
            self.events.append((kind, name))
            if kind == "DELETED":
                self.nodes.pop(name, None)
            else:
                self.nodes[name] = obj

    def mark_stale(self) -> None:
        with self.lock:
            self.stale += 1

    def names(self) -> list[str]:
        with self.lock:
            return sorted(self.nodes)

    def label(self, name: str, key: str) -> str | None:
        with self.lock:
            return (self.nodes.get(name, {}).get("metadata", {}).get("labels") or {}).get(key)


class Following:
    """A Reflector of every Node on its own thread, with the view it keeps. ``hold`` wraps its watches."""

    def __init__(self, kube: Kube, hold: Callable[[Watcher], Watcher] = lambda watcher: watcher,
                 watch_timeout_s: int = 30) -> None:
        self.view, self.stop = View(), threading.Event()
        watcher = hold(lambda rv, timeout_s: kube.watch_nodes(rv, timeout_s=timeout_s))
        self.reflector = Reflector("nodes", kube.list_nodes, watcher, replace=self.view.replace,
                                   changed=self.view.changed, stale=self.view.mark_stale, stop=self.stop,
                                   permissions=PermissionLog(), watch_timeout_s=watch_timeout_s)
        self.thread = self.reflector.start()


Follow = Callable[..., Following]


def follow_with(api: FakeApiServer, tmp_path: Path) -> Iterator[Follow]:
    kube = Kube(str(api.write_kubeconfig(tmp_path / "kubeconfig")), request_timeout=(1.0, 1.0))
    started: list[Following] = []

    def follow(**options: Any) -> Following:
        started.append(Following(kube, **options))
        return started[-1]

    yield follow
    for following in started:
        following.stop.set()
    api.store.close()  # ends the open watches, so each thread sees ``stop``
    for following in started:
        following.thread.join(timeout=5)
        assert not following.thread.is_alive()
    kube.close()


@pytest.fixture
def follow(api: FakeApiServer, tmp_path: Path) -> Iterator[Follow]:
    yield from follow_with(api, tmp_path)


def server_ending_watches_after(seconds: float, tmp_path: Path) -> Iterator[tuple[FakeApiServer, Follow]]:
    """A fake API server that ends every watch after ``seconds``, as a proxy or the server's own timeout would."""
    with FakeApiServer(max_watch_s=seconds) as api:
        yield from ((api, follow) for follow in follow_with(api, tmp_path))


@pytest.fixture
def short_watches(tmp_path: Path) -> Iterator[tuple[FakeApiServer, Follow]]:
    yield from server_ending_watches_after(0.2, tmp_path)


@pytest.fixture
def instant_watches(tmp_path: Path) -> Iterator[tuple[FakeApiServer, Follow]]:
    yield from server_ending_watches_after(0.0, tmp_path)


def test_lists_then_follows_every_change(api: FakeApiServer, follow: Follow) -> None:
    api.create_node("a")
    api.create_node("b")
    following = follow()
    wait_for(lambda: following.view.lists == [["a", "b"]])
    api.create_node("c")
    api.set_labels("a", {"team": "ml"})
    api.delete_node("b")
    wait_for(lambda: following.view.names() == ["a", "c"])
    assert following.view.events == [("ADDED", "c"), ("MODIFIED", "a"), ("DELETED", "b")]
    assert following.view.label("a", "team") == "ml"
    assert following.reflector.lists == 1 and api.log.count("list") == 1


def test_a_watch_that_ends_is_resumed_without_listing_again(short_watches: tuple[FakeApiServer, Follow]) -> None:
    api, follow = short_watches
    api.create_node("a")
    following = follow()
    wait_for(lambda: api.log.count("watch") >= 4)
    api.create_node("b")
    wait_for(lambda: following.view.names() == ["a", "b"])
    assert following.view.events == [("ADDED", "b")]
    assert following.reflector.lists == 1 and following.view.stale == 0


def test_watches_that_end_at_once_are_not_resumed_in_a_tight_loop(
        instant_watches: tuple[FakeApiServer, Follow]) -> None:
    api, follow = instant_watches
    follow()
    first = wait_for(lambda: api.log.count("watch"))
    began = time.monotonic()
    wait_for(lambda: api.log.count("watch") >= first + 4, timeout=10)
    assert time.monotonic() - began >= 0.4  # four waits of at least 0.1 s each
    assert api.log.count("list") == 1


def test_a_watch_too_old_to_resume_lists_again(short_watches: tuple[FakeApiServer, Follow]) -> None:
    api, follow = short_watches
    api.create_node("a")
    resumed, proceed = threading.Event(), threading.Event()

    def hold_the_resume(watcher: Watcher) -> Watcher:
        calls: list[str] = []

        def watch(rv: str, timeout_s: int) -> Iterable[tuple[str, Obj]]:
            calls.append(rv)
            if len(calls) == 2:  # the first watch ended: resume only once the history is lost
                resumed.set()
                proceed.wait(5)
            return watcher(rv, timeout_s)

        return watch

    with structlog.testing.capture_logs() as logs:
        following = follow(hold=hold_the_resume)
        assert resumed.wait(5)
        api.create_node("b")
        api.store.compact()  # the resourceVersion the watch resumes from is too old now
        proceed.set()
        wait_for(lambda: following.view.lists == [["a"], ["a", "b"]])
    assert following.reflector.lists == 2 and following.view.events == []
    [line] = [entry for entry in logs if entry.get("reason") == "gone"]
    assert line["log_level"] == "info" and line["resource"] == "nodes"


def test_a_broken_watch_lists_again_and_what_changed_meanwhile_arrives(api: FakeApiServer, follow: Follow) -> None:
    api.create_node("a")
    following = follow()
    wait_for(lambda: following.view.lists == [["a"]] and api.open_watches == 1)
    api.drop_watches.set()  # every watch breaks
    wait_for(lambda: following.view.stale >= 1)
    api.create_node("b")
    api.set_labels("a", {"team": "ml"})
    api.drop_watches.clear()
    wait_for(lambda: following.view.names() == ["a", "b"] and following.view.label("a", "team") == "ml")
    assert following.reflector.lists >= 2
    api.create_node("c")
    wait_for(lambda: following.view.names() == ["a", "b", "c"])


def test_an_outage_is_one_warning_then_one_line_when_it_ends_about_a_second_later(api: FakeApiServer,
                                                                             follow: Follow) -> None:
    api.create_node("a")
    following = follow()
    wait_for(lambda: following.view.lists == [["a"]] and api.open_watches == 1)
    with structlog.testing.capture_logs() as logs:
        api.faults.add(Fault(drop=True))  # the API server stops answering
        api.drop_watches.set()
        def quiet_retries() -> int:
            return [entry["event"] for entry in logs if entry["log_level"] == "debug"].count("watch failed again")

        wait_for(lambda: api.log.count("list") >= 5 and quiet_retries() >= 3, timeout=30)  # retried, about 1 s apart
        api.faults.clear()
        api.drop_watches.clear()
        began = time.monotonic()
        wait_for(lambda: [entry for entry in logs if entry.get("reason") == "api-recovered"])
        back_in = time.monotonic() - began
    # retries come at most 1 s apart in an outage's first minute (then up to 10 s): every retry it
    # chose says so, and on a quiet machine it is back about a second after the API answers
    failures = [entry for entry in logs if entry.get("reason") == "api-error"]
    assert failures and all(entry["retry_in_s"] <= 1.0 for entry in failures)
    assert back_in < AT_ONCE_S
    warnings = [entry for entry in logs if entry["log_level"] == "warning"]
    assert [(entry["event"], entry["reason"], entry["resource"]) for entry in warnings] == [
        ("watch failed, retrying", "api-error", "nodes")]
    [recovered] = [entry for entry in logs if entry.get("reason") == "api-recovered"]
    assert recovered["log_level"] == "info" and recovered["down_s"] > 0
    assert following.view.stale >= 4


def test_a_403_is_reported_once_then_again_only_after_the_request_worked(api: FakeApiServer, follow: Follow) -> None:
    api.create_node("a")
    api.forbid("list")
    with structlog.testing.capture_logs() as refused:
        following = follow()
        wait_for(lambda: api.log.count("list") >= 4, timeout=10)
    api.allow("list")
    wait_for(lambda: following.view.lists == [["a"]] and api.open_watches == 1)
    with structlog.testing.capture_logs() as refused_again:
        api.forbid("list")
        api.drop_watches.set()  # the watch breaks: the reflector lists again, and is refused again
        wait_for(lambda: api.log.count("list") >= 7, timeout=10)
    line = "permission missing: grant verb 'list' on resource 'nodes' to user labeller"
    for logs in (refused, refused_again):
        lines = [entry for entry in logs if entry.get("reason") == "forbidden"]
        assert [entry["event"] for entry in lines] == [line]
        assert lines[0]["log_level"] == "error" and lines[0]["verb"] == "list"
    assert not [entry for entry in refused if entry["log_level"] == "warning"]  # a refusal is no outage


def test_stops_when_stop_is_set(api: FakeApiServer, follow: Follow) -> None:
    api.create_node("a")
    following = follow()
    wait_for(lambda: following.view.lists == [["a"]] and api.open_watches == 1)
    following.stop.set()
    api.create_node("b")  # the open watch brings one more event; the reflector ends there
    following.thread.join(timeout=5)
    assert not following.thread.is_alive()
    assert following.view.events == [("ADDED", "b")] and following.reflector.lists == 1


def test_stops_during_an_outage_without_waiting_out_the_backoff(api: FakeApiServer, follow: Follow) -> None:
    api.faults.add(Fault(verb="list", status=503))
    following = follow()
    wait_for(lambda: api.log.count("list") >= 3, timeout=10)
    following.stop.set()
    following.thread.join(timeout=2)
    assert not following.thread.is_alive()
    assert following.view.lists == []
