"""Named configs: choosing a node's config from a directory (a mounted ConfigMap) by a node label,
keeping the last good one when the choice fails, and following label and files while running."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import structlog.testing
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from labeller.cli.root import main
from labeller.model.config import Config, ConfigError, parse_document
from labeller.process.follow import ConfigFollower, ConfigMetrics
from labeller.model.labels import owns
from labeller.model.namedconfigs import (APPLIED_LABEL, CONFIG_LABEL, STATE_LABEL, Chooser, ConfigDir, NoConfig,
                                         Selection)
from labeller.host.machine import NodeOptions, open_host
from tests.builders import AT_ONCE_S, PATIENCE_S, config_map_volume, label_set_of, promptly
from tests.core.cli import in_process
from vendors import RESOURCE_NAMES

WHOLE = {"version": "v1"}
TS4 = {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
MIXED = {"version": "v1", "flags": {"migStrategy": "mixed"}}
BROKEN = "version: v1\nflags:\n  migStrategy: sometimes\n"


def volume(tmp_path: Path, **configs: Any) -> ConfigDir:
    return ConfigDir(config_map_volume(tmp_path / "configs", configs), RESOURCE_NAMES)


def test_a_config_map_volume_lists_its_keys_and_nothing_the_kubelet_adds(tmp_path: Path) -> None:
    directory = volume(tmp_path, default=WHOLE, ts4=TS4)
    assert len(list(directory.path.iterdir())) == 4  # ..data, the version directory, and the two keys
    assert directory.names() == ["default", "ts4"]
    assert directory.load("ts4") == parse_document(TS4, RESOURCE_NAMES)


@pytest.mark.parametrize("name", ["..data", "../configs/ts4", "ts4/", "", "nope"])
def test_only_a_listed_name_is_a_config(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match=r"no config named .* \(there: default, ts4\)"):
        volume(tmp_path, default=WHOLE, ts4=TS4).load(name)


def test_a_config_that_does_not_load_names_its_file_and_key(tmp_path: Path) -> None:
    directory = volume(tmp_path, broken=BROKEN)
    with pytest.raises(ConfigError, match=r"configs/broken: flags.migStrategy: must be one of"):
        directory.load("broken")


def test_the_signature_changes_when_the_kubelet_swaps_the_files(tmp_path: Path) -> None:
    directory = volume(tmp_path, default=WHOLE)
    before = directory.signature()
    assert directory.signature() == before
    config_map_volume(directory.path, {"default": TS4})
    assert directory.signature() != before


def test_a_plain_directory_changes_its_signature_when_a_file_is_replaced(tmp_path: Path) -> None:
    (tmp_path / "default").write_text("version: v1\n")
    directory = ConfigDir(tmp_path, RESOURCE_NAMES)
    before = directory.signature()
    (tmp_path / ".default.tmp").write_text("version: v1\nflags: {migStrategy: mixed}\n")
    (tmp_path / ".default.tmp").replace(tmp_path / "default")
    assert directory.signature() != before


@pytest.mark.parametrize(("configs", "default", "chosen"), [
    ({"default": WHOLE, "ts4": TS4}, None, "default"),  # NVIDIA's "named" fallback
    ({"ts4": TS4}, None, "ts4"),  # "single"
    ({"whole": WHOLE, "ts4": TS4}, "ts4", "ts4"),  # --config-name / config.default
], ids=["named-default", "only-one", "given"])
def test_a_node_without_the_label_gets_the_default(tmp_path: Path, configs: dict[str, Any], default: str | None,
                                                    chosen: str) -> None:
    selection = Chooser(volume(tmp_path, **configs), default).choose(None)
    assert (selection.name, selection.ok) == (chosen, True)
    assert selection.config == parse_document(configs[chosen], RESOURCE_NAMES)


def test_no_default_among_several_configs_is_an_error_that_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(NoConfig, match=r"no default config among 2 \(mixed, ts4\): give --config-name"):
        Chooser(volume(tmp_path, ts4=TS4, mixed=MIXED)).choose(None)


def test_the_label_picks_the_config(tmp_path: Path) -> None:
    chooser = Chooser(volume(tmp_path, default=WHOLE, ts4=TS4, mixed=MIXED))
    assert chooser.choose("mixed") == Selection("mixed", parse_document(MIXED, RESOURCE_NAMES), "mixed")
    assert chooser.choose("") == chooser.choose(None) == Selection("default", Config(), None)


def test_an_unknown_or_broken_name_keeps_the_last_good_config(tmp_path: Path) -> None:
    chooser = Chooser(volume(tmp_path, default=WHOLE, ts4=TS4, broken=BROKEN))
    good = chooser.choose("ts4")
    unknown = chooser.choose("ts8", previous=good)
    assert (unknown.name, unknown.config, unknown.wanted) == ("ts4", good.config, "ts8")
    assert unknown.problem == f"no config named 'ts8' in {chooser.directory.path} (there: broken, default, ts4)"
    broken = chooser.choose("broken", previous=good)
    assert broken.name == "ts4" and broken.problem is not None and "broken: flags.migStrategy" in broken.problem


def test_a_starting_process_takes_what_the_applied_label_names_then_the_default(tmp_path: Path) -> None:
    chooser = Chooser(volume(tmp_path, default=WHOLE, ts4=TS4))
    assert chooser.choose("ts8", hint="ts4").name == "ts4"  # what the labeller put in force before
    assert chooser.choose("ts8", hint="gone").name == "default"
    assert chooser.choose("ts8", hint="ts4", previous=chooser.choose(None)).name == "ts4"  # agree with the labeller
    with pytest.raises(NoConfig, match="ts8"):
        Chooser(volume(tmp_path / "b", ts4=TS4, mixed=MIXED)).choose("ts8")


def test_state_labels_say_what_is_in_force_and_are_ours_while_the_asking_label_is_not(tmp_path: Path) -> None:
    chooser = Chooser(volume(tmp_path, default=WHOLE, ts4=TS4))
    assert chooser.choose("ts4").labels().labels == {STATE_LABEL: "success", APPLIED_LABEL: "ts4"}
    assert chooser.choose("x", previous=chooser.choose("ts4")).labels().labels == {STATE_LABEL: "failed",
                                                                                   APPLIED_LABEL: "ts4"}
    assert owns(STATE_LABEL) and owns(APPLIED_LABEL) and not owns(CONFIG_LABEL)


MATRIX = [{"version": "v1", "flags": {"migStrategy": mig}, **({} if replicas is None else {"sharing": {"timeSlicing": {
    "renameByDefault": rename, "resources": [{"name": "nvidia.com/gpu", "replicas": replicas},
                                             {"name": "nvidia.com/mig-1g.5gb", "replicas": replicas}]}}})}
          for mig, replicas, rename in itertools.product(("none", "single", "mixed"), (None, 2, 4), (False, True))
          if replicas is not None or not rename]


def test_a_node_labelled_with_any_config_gets_exactly_what_that_file_gives(tmp_path: Path) -> None:
    """The mechanism carries whatever the parser accepts: no sharing kind is special."""
    chooser = Chooser(volume(tmp_path, **{f"c{i}": document for i, document in enumerate(MATRIX)}, default=WHOLE))
    for i, document in enumerate(MATRIX):
        selection = chooser.choose(f"c{i}")
        with open_host(NodeOptions(simulate="dgx-a100-mig-mixed"), selection) as node:
            inventory = node.probe()
            labels = node.labels(inventory, node.offer(inventory)).labels
        assert labels == {**label_set_of(inventory, parse_document(document, RESOURCE_NAMES)).labels,
                          STATE_LABEL: "success", APPLIED_LABEL: f"c{i}"}


# --- following a label and the files ------------------------------------------------------------

class Following:
    """A follower as ``run`` builds one, with what it reported."""

    def __init__(self, tmp_path: Path, poll_s: float = 0.02, **configs: Any) -> None:
        self.directory = volume(tmp_path, **configs)
        self.registry = CollectorRegistry()
        self.events: list[tuple[str, str, str]] = []
        self.changes = 0
        self.news = threading.Event()
        self.follower = ConfigFollower(Chooser(self.directory), CONFIG_LABEL, ConfigMetrics(self.registry, "t"),
                                       events=lambda *event: self.events.append(event), poll_s=poll_s,
                                       on_change=self._changed)
        self.node = open_host(NodeOptions(simulate="dgx-h100"), self.follower.selection).__enter__()

    def _changed(self) -> None:
        self.changes += 1
        self.news.set()

    def await_news(self) -> None:
        assert self.news.wait(PATIENCE_S), "the follower saw no change"
        self.news.clear()

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels or None) or 0.0


def test_a_label_change_is_news_once_and_apply_puts_it_in_force(tmp_path: Path) -> None:
    run = Following(tmp_path, default=WHOLE, ts4=TS4)
    run.follower.apply(run.node)
    run.follower.observe({CONFIG_LABEL: "ts4", "team": "ml"})
    run.follower.observe({CONFIG_LABEL: "ts4", "team": "other"})  # another label: no news
    assert run.changes == 1 and run.node.config == Config()  # nothing changes until the consumer applies it
    assert run.follower.apply(run.node) is True
    assert run.node.config == parse_document(TS4, RESOURCE_NAMES) and run.node.selection is not None
    assert run.metric("t_config_changes_total", outcome="applied") == 1 and run.metric("t_config_failed") == 0
    assert run.events == [("Normal", "GPUConfigApplied", "gpu-labeller: config 'ts4' in force (was 'default')")]
    run.follower.observe({})  # label removed: back to the default
    assert run.follower.apply(run.node) is True and run.node.config == Config()


def test_an_unknown_name_is_reported_once_and_changes_nothing(tmp_path: Path) -> None:
    run = Following(tmp_path, default=WHOLE, ts4=TS4)
    run.follower.observe({CONFIG_LABEL: "ts4"})
    run.follower.apply(run.node)
    with structlog.testing.capture_logs() as logs:
        run.follower.observe({CONFIG_LABEL: "ts8"})
        assert run.follower.apply(run.node) is False
        run.follower.apply(run.node)
    assert run.node.config == parse_document(TS4, RESOURCE_NAMES)
    failures = [entry for entry in logs if entry.get("reason") == "config-failed"]
    assert len(failures) == 1 and failures[0]["config"] == "ts4" and failures[0]["asked"] == "ts8"
    assert failures[0]["error"].startswith(f"node label {CONFIG_LABEL}=ts8: no config named 'ts8'")
    assert run.metric("t_config_failed") == 1 and run.metric("t_config_changes_total", outcome="failed") == 1
    assert run.events[-1][:2] == ("Warning", "GPUConfigFailed") and "'ts4' stays in force" in run.events[-1][2]
    assert run.node.selection is not None and run.node.selection.labels().labels[STATE_LABEL] == "failed"


def test_a_file_edit_is_seen_by_the_poll_and_a_broken_edit_keeps_the_config(tmp_path: Path) -> None:
    run = Following(tmp_path, default=WHOLE, ts4=TS4)
    run.follower.observe({CONFIG_LABEL: "ts4"})
    run.follower.apply(run.node)
    stop = threading.Event()
    run.follower.poll(stop)
    try:
        ts2 = {**TS4, "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}
        run.news.clear()
        config_map_volume(run.directory.path, {"default": WHOLE, "ts4": ts2})
        run.await_news()
        assert run.follower.apply(run.node) is True and run.node.config == parse_document(ts2, RESOURCE_NAMES)
        config_map_volume(run.directory.path, {"default": WHOLE, "ts4": BROKEN})
        run.await_news()
        assert run.follower.apply(run.node) is False and run.node.config == parse_document(ts2, RESOURCE_NAMES)
        assert run.metric("t_config_failed") == 1
    finally:
        stop.set()


def test_a_config_map_update_is_seen_at_once_without_polling(tmp_path: Path) -> None:
    """inotify tells the follower that the kubelet swapped the volume's ``..data``: no look every second."""
    run = Following(tmp_path, poll_s=3600, default=WHOLE, ts4=TS4)
    run.follower.observe({CONFIG_LABEL: "ts4"})
    run.follower.apply(run.node)
    stop = threading.Event()
    run.follower.poll(stop)
    try:
        ts2 = {**TS4, "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}
        run.news.clear()
        updated = time.monotonic()
        config_map_volume(run.directory.path, {"default": WHOLE, "ts4": ts2})
        run.await_news()
        assert time.monotonic() - updated < AT_ONCE_S
        assert run.follower.apply(run.node) is True and run.node.config == parse_document(ts2, RESOURCE_NAMES)
    finally:
        stop.set()


def test_bootstrap_reads_the_label_before_the_first_probe_and_gives_up_in_time(tmp_path: Path) -> None:
    run = Following(tmp_path, default=WHOLE, ts4=TS4)
    assert run.follower.bootstrap(lambda: {CONFIG_LABEL: "ts4"}, threading.Event()) is True
    assert run.follower.selection.name == "ts4"

    def unreachable() -> dict[str, str]:
        raise OSError("connection refused")

    # gives up after its 0.3 s and one more wait of at most 2 s, not never
    assert promptly(lambda: run.follower.bootstrap(unreachable, threading.Event(), timeout_s=0.3), AT_ONCE_S) is False
    assert run.follower.selection.name == "ts4"


# --- the dry run: what a node with a given label would get ---------------------------------------

def test_labels_and_resources_show_what_a_node_labelled_with_the_name_gets(tmp_path: Path) -> None:
    configs = config_map_volume(tmp_path / "configs", {"default": WHOLE, "ts4": TS4})
    named = in_process("labels", "--simulate", "dgx-h100", "--config-dir", str(configs), "--config-name", "ts4")
    direct = in_process("labels", "--simulate", "dgx-h100", "--config", str(configs / "ts4"))
    assert named.returncode == direct.returncode == 0, named.stderr + direct.stderr
    assert sorted(named.stdout.splitlines()) == sorted([*direct.stdout.splitlines(), f"{APPLIED_LABEL}=ts4",
                                                        f"{STATE_LABEL}=success"])
    assert "nvidia.com/gpu.replicas=4" in named.stdout.splitlines()
    resources = in_process("resources", "--simulate", "dgx-h100", "--config-dir", str(configs))  # the default
    assert resources.returncode == 0 and resources.stdout.startswith("nvidia.com/gpu: 8 devices (8 physical)")


@pytest.mark.parametrize(("args", "message"), [
    (["--config-name", "ts8"], "no config named 'ts8' in {configs} (there: default, ts4)"),
    (["--config", "{configs}/ts4"], "give --config FILE or --config-dir DIR, not both"),
    (["--config-name", "broken"], "{configs}/broken: flags.migStrategy: must be one of none, single, mixed"),
], ids=["unknown", "both", "broken"])
def test_a_bad_choice_on_the_dry_run_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    configs = config_map_volume(tmp_path / "configs", {"default": WHOLE, "ts4": TS4, "broken": BROKEN})
    args = [arg.format(configs=configs) for arg in args]
    if "broken" not in args:
        config_map_volume(configs, {"default": WHOLE, "ts4": TS4})
    result = CliRunner().invoke(main, ["labels", "--simulate", "dgx-h100", "--config-dir", str(configs), *args])
    assert result.exit_code == 2
    assert result.output.startswith("Error: ") and result.output.count("\n") == 1
    assert message.format(configs=configs) in result.output


def test_a_node_without_gpus_gets_no_state_labels_either(tmp_path: Path) -> None:
    selection = Chooser(volume(tmp_path, default=WHOLE)).choose(None)
    (tmp_path / "none.yaml").write_text("name: none\n")
    with open_host(NodeOptions(simulate=str(tmp_path / "none.yaml")), selection) as node:
        inventory = node.probe()
        assert node.labels(inventory, node.offer(inventory)).labels == {}
