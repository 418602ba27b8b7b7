"""A config past the limits, given to a running device plugin by SIGHUP, is refused at once: the
plugin keeps serving what it served and stays ready (it stalled 120 s at 100% CPU on
``replicas: 1000000`` while /readyz said 200)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.builders import AT_ONCE_S, wait_for
from tests.fakes.kubelet import FakeKubelet
from tests.plugin.profile_files import time_slicing, write_yaml
from tests.plugin.test_plugin_cli import PluginProcess

SHARED = "nvidia.com/gpu"


def test_sighup_with_a_million_replicas_is_refused_at_once_and_the_plugin_stays_ready(
        sock_dir: Path, kubelet: FakeKubelet, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    write_yaml(config, time_slicing(2))
    with PluginProcess("--simulate", "dgx-h100", "--config", str(config), "--socket-dir", str(sock_dir)) as plugin:
        assert kubelet.wait_for(lambda: kubelet.allocatable(SHARED) == 16)
        wait_for(lambda: plugin.status("/readyz") == 200)  # the Register answer comes a moment after the watch
        write_yaml(config, time_slicing(1_000_000))
        sent = time.monotonic()
        plugin.proc.send_signal(signal.SIGHUP)
        failed = plugin.event("config reload failed, keeping the old config")
        assert failed["seen"] - sent < AT_ONCE_S
        assert failed["error"].endswith("replicas: 1000000 is more than 1024, the most replicas of one device")
        assert plugin.status("/readyz") == 200 and kubelet.allocatable(SHARED) == 16
        assert plugin.stop() == 0
