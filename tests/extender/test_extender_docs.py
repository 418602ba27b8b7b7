"""The KubeSchedulerConfiguration examples of docs/memory-sharing.md call this extender as it serves, and the e2e run
uses the v1beta3 one."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from labeller.extender.server import PREFIX
from tests.e2e.e2e_gpushare import SCHEDULER_CONFIG

PAGE = Path(__file__).resolve().parents[2] / "docs" / "memory-sharing.md"


def scheduler_configs() -> dict[str, dict[str, Any]]:
    blocks = re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), re.S)
    docs = [yaml.safe_load(block) for block in blocks if "KubeSchedulerConfiguration" in block]
    return {doc["apiVersion"]: doc for doc in docs}


def test_the_docs_have_v1beta3_and_v1_examples_that_call_the_extender_as_it_serves() -> None:
    configs = scheduler_configs()
    assert set(configs) == {"kubescheduler.config.k8s.io/v1beta3", "kubescheduler.config.k8s.io/v1"}
    for config in configs.values():
        (extender,) = config["extenders"]
        assert extender["urlPrefix"].endswith(PREFIX)
        verbs = (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"])
        assert verbs == ("filter", "prioritize", "bind")
        assert extender["nodeCacheCapable"] is True and extender["ignorable"] is False
        assert extender["managedResources"] == [{"name": "aliyun.com/gpu-mem", "ignoredByScheduler": False}]
        assert float(extender["httpTimeout"].rstrip("s")) > 4  # above the default --bind-wait


def test_the_e2e_run_uses_the_docs_example() -> None:
    documented = scheduler_configs()["kubescheduler.config.k8s.io/v1beta3"]
    e2e = yaml.safe_load(SCHEDULER_CONFIG.format(port=32766))
    documented.pop("clientConnection")
    assert e2e == documented
