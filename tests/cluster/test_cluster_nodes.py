"""The own Node's cache, which two threads feed: the watch (every change) and the writer (the answer
to its own write). What it tells its observers, the config follower above all, must follow the order
in which it stored the views, whichever thread is slower."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from labeller.cluster.nodes import Labels, NodeCache, node_labels
from labeller.model.namedconfigs import APPLIED_LABEL, CONFIG_LABEL, Chooser, ConfigDir
from labeller.process.follow import ConfigFollower, ConfigMetrics
from tests.builders import PATIENCE_S, config_map_volume, stays_true
from vendors import RESOURCE_NAMES


def node(resource_version: int, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": "n1", "resourceVersion": str(resource_version), "labels": labels}}


def test_a_slow_writer_thread_never_hands_the_follower_labels_older_than_the_watch_did(tmp_path: Path) -> None:
    """The daemon stores the answer to its write (the node asks for mig-mixed, now applied) and is
    preempted before telling the follower; meanwhile the user labels the node ts-typo and the watch
    stores and tells that. The follower must end on what the node asks for now: ts-typo."""
    mixed = {"version": "v1", "flags": {"migStrategy": "mixed"}}
    configs = config_map_volume(tmp_path / "configs", {"default": {"version": "v1"}, "mig-mixed": mixed})
    follower = ConfigFollower(Chooser(ConfigDir(configs, RESOURCE_NAMES)), CONFIG_LABEL,
                              ConfigMetrics(CollectorRegistry(), "test"))
    written = node(10, **{CONFIG_LABEL: "mig-mixed", APPLIED_LABEL: "mig-mixed"})
    relabelled = node(11, **{CONFIG_LABEL: "ts-typo", APPLIED_LABEL: "mig-mixed"})
    writer_inside, writer_may_go = threading.Event(), threading.Event()
    told: list[str | None] = []

    def observe(labels: Labels | None) -> None:
        asked = None if labels is None else labels.get(CONFIG_LABEL)
        if asked == "mig-mixed":  # the writer's thread, preempted here
            writer_inside.set()
            assert writer_may_go.wait(PATIENCE_S)
        told.append(asked)
        follower.observe(labels)

    cache = NodeCache(node_labels, observers=(observe,))
    writer = threading.Thread(target=cache.put, args=(written,), daemon=True)
    watch = threading.Thread(target=cache.put, args=(relabelled,), daemon=True)
    writer.start()
    assert writer_inside.wait(PATIENCE_S)
    watch.start()
    stays_true(lambda: told == [], seconds=0.5)  # the newer view waits until the older one was told
    writer_may_go.set()
    writer.join(PATIENCE_S)
    watch.join(PATIENCE_S)
    assert not writer.is_alive() and not watch.is_alive()
    assert told == ["mig-mixed", "ts-typo"]
    selection = follower.selection
    assert selection.wanted == "ts-typo" and selection.name == "mig-mixed"
    assert selection.problem is not None and "no config named 'ts-typo'" in selection.problem
    assert cache.resource_version == 11


def test_a_view_older_than_the_one_stored_is_not_told(tmp_path: Path) -> None:
    told: list[str | None] = []
    cache = NodeCache(node_labels, observers=(lambda labels: told.append(None if labels is None
                                                                         else labels.get(CONFIG_LABEL)),))
    cache.put(node(11, **{CONFIG_LABEL: "ts-typo"}))
    cache.put(node(10, **{CONFIG_LABEL: "mig-mixed"}))  # a write's answer that came back late
    assert told == ["ts-typo"] and cache.resource_version == 11
