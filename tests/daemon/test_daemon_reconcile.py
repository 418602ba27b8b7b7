"""The real daemon against the fake API server over real HTTP: labels, drift, probes and faults."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog.testing

from labeller.model.inventory import ProbeError
from labeller.model.labels import FIELD_MANAGER
from tests.builders import AT_ONCE_S, wait_for
from tests.daemon.conftest import GPU_LABELS, NODE, OTHERS, FakeProbe, Running
from tests.fakes.apiserver import FakeApiServer, Fault

Start = Callable[..., Running]


def ours(api: FakeApiServer, node: str = NODE) -> dict[str, str]:
    return {k: v for k, v in api.labels(node).items() if k not in OTHERS}


def test_first_apply_is_one_server_side_apply_of_owned_labels(api: FakeApiServer, start: Start) -> None:
    api.create_node(NODE, OTHERS)
    daemon = start()
    wait_for(lambda: ours(api) == GPU_LABELS)
    [write] = api.log.writes()
    assert write.content_type.startswith("application/apply-patch+yaml")
    assert write.query["fieldManager"] == FIELD_MANAGER and write.query["force"] == "true"
    assert write.body["metadata"] == {"name": NODE, "labels": GPU_LABELS}
    assert api.managers_of(NODE, "nvidia.com/gpu.count") == {(FIELD_MANAGER, "Apply")}
    wait_for(lambda: daemon.daemon.ready)


def test_unchanged_hardware_makes_no_writes_over_many_intervals(api: FakeApiServer, start: Start) -> None:
    api.create_node(NODE, OTHERS)
    daemon = start(interval_s=0.02)
    wait_for(lambda: ours(api) == GPU_LABELS)
    since, calls = time.monotonic(), daemon.probe.calls
    wait_for(lambda: daemon.probe.calls > calls + 20)
    assert api.log.writes(since) == []
    assert api.log.by_verb(since) == {} or set(api.log.by_verb(since)) <= {"watch"}
    assert api.max_open_watches == 1


def test_drift_is_repaired_within_a_second(api: FakeApiServer, start: Start) -> None:
    api.create_node(NODE, OTHERS)
    start(interval_s=60)
    wait_for(lambda: ours(api) == GPU_LABELS)
    for drift in ({"nvidia.com/gpu.count": None}, {"nvidia.com/gpu.product": "Tampered"}):
        api.set_labels(NODE, drift)
        began = time.monotonic()
        wait_for(lambda: ours(api) == GPU_LABELS)
        assert time.monotonic() - began < AT_ONCE_S  # on the watch event, not at the next probe (60 s)


def test_users_and_gpu_operator_labels_are_never_touched(api: FakeApiServer, start: Start) -> None:
    api.create_node(NODE, OTHERS)
    probe = FakeProbe()
    start(probe)
    wait_for(lambda: ours(api) == GPU_LABELS)
    api.set_labels(NODE, {"team": "infra", "nvidia.com/gpu.deploy.driver": "false"})
    probe.labels = {}
    wait_for(lambda: ours(api) == {"nvidia.com/gpu.deploy.driver": "false"})
    assert api.labels(NODE) == {**OTHERS, "team": "infra", "nvidia.com/gpu.deploy.driver": "false"}
    for write in api.log.writes():
        if write.content_type.startswith("application/apply-patch"):
            assert all(key.startswith("nvidia.com/gpu.") and "deploy" not in key
                       for key in write.body["metadata"]["labels"])


def test_labels_no_longer_wanted_are_removed(api: FakeApiServer, start: Start) -> None:
    api.create_node(NODE, OTHERS)
    probe = FakeProbe()
    start(probe)
    wait_for(lambda: ours(api) == GPU_LABELS)
    probe.labels = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "4"}
    wait_for(lambda: ours(api) == probe.labels)


def test_a_failed_probe_keeps_the_labels(api: FakeApiServer, start: Start) -> None:
    api.create_node(NODE, OTHERS)
    probe = FakeProbe()
    daemon = start(probe, interval_s=0.05)
    wait_for(lambda: ours(api) == GPU_LABELS)
    probe.error = RuntimeError("NVML: driver/library version mismatch")
    calls = probe.calls
    wait_for(lambda: probe.calls > calls + 5)
    assert ours(api) == GPU_LABELS
    assert daemon.metric("gpu_labeller_probes_total", outcome="failed") >= 5


def test_a_failed_probe_at_start_keeps_what_is_live(api: FakeApiServer, start: Start) -> None:
    api.create_node(NODE, {**OTHERS, **GPU_LABELS})
    probe = FakeProbe(error=RuntimeError("sysfs unreadable"))
    daemon = start(probe, interval_s=0.05)
    wait_for(lambda: probe.calls > 5)
    assert ours(api) == GPU_LABELS and api.log.writes() == []
    assert not daemon.daemon.ready  # the labels are kept, but nothing vouches for them


def test_a_partial_probe_adds_but_never_removes(api: FakeApiServer, start: Start) -> None:
    api.create_node(NODE, OTHERS)
    probe = FakeProbe()
    daemon = start(probe, interval_s=0.05)
    wait_for(lambda: ours(api) == GPU_LABELS)
    probe.labels, probe.partial = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "7",
                                   "nvidia.com/gpu.clique": "new"}, True
    wait_for(lambda: ours(api) == {**GPU_LABELS, "nvidia.com/gpu.clique": "new"})
    wait_for(lambda: daemon.metric("gpu_labeller_probes_total", outcome="partial") >= 3)  # more partial probes
    assert ours(api)["nvidia.com/gpu.count"] == "8"


def test_a_node_without_gpus_ends_with_none_of_ours_even_after_a_restart(api: FakeApiServer, start: Start) -> None:
    api.create_node(NODE, OTHERS)
    first = start()
    wait_for(lambda: ours(api) == GPU_LABELS)
    first.stop()
    start(FakeProbe(labels={}))  # a fresh process that never applied before
    wait_for(lambda: api.labels(NODE) == OTHERS)


def test_api_down_at_start_then_up(api: FakeApiServer, start: Start) -> None:
    api.create_node(NODE, OTHERS)
    api.faults.add(Fault(drop=True))
    daemon = start()
    wait_for(lambda: daemon.metric("gpu_labeller_reconciles_total", outcome="failed") >= 2)
    assert ours(api) == {} and not daemon.daemon.ready
    api.faults.clear()
    wait_for(lambda: ours(api) == GPU_LABELS)
    wait_for(lambda: daemon.daemon.ready)


@pytest.mark.parametrize("fault", [Fault(verb="patch", status=503, times=3), Fault(verb="patch", status=409, times=2),
                                   Fault(verb="patch", delay_s=1.5, times=1)], ids=["5xx", "409", "timeout"])
def test_write_faults_back_off_then_catch_up(api: FakeApiServer, start: Start, fault: Fault) -> None:
    api.create_node(NODE, OTHERS)
    api.faults.add(fault)
    # the delayed answer must come after the client gave up: a 1 s read timeout against the fault's 1.5 s
    daemon = start(request_timeout=(1.0, 1.0)) if fault.delay_s else start()
    wait_for(lambda: ours(api) == GPU_LABELS)
    assert daemon.metric("gpu_labeller_writes_total", outcome="error") >= 1
    assert len(api.log.writes()) <= 5


def test_forbidden_gives_one_clear_log_line(api: FakeApiServer, start: Start) -> None:
    api.create_node(NODE, OTHERS)
    api.forbid("patch")
    with structlog.testing.capture_logs() as logs:
        start()
        wait_for(lambda: api.log.count("patch") >= 3)
    lines = [entry for entry in logs if "permission missing" in entry["event"]]
    assert len(lines) == 1
    assert lines[0]["event"] == "permission missing: grant verb 'patch' on resource 'nodes' to user labeller"
    assert lines[0]["reason"] == "forbidden" and lines[0]["node"] == NODE
    api.allow("patch")
    wait_for(lambda: ours(api) == GPU_LABELS)


def test_node_not_found_waits_then_labels_it(api: FakeApiServer, start: Start) -> None:
    daemon = start()
    wait_for(lambda: daemon.metric("gpu_labeller_reconciles_total", outcome="node-missing") >= 1)
    api.create_node(NODE, OTHERS)
    wait_for(lambda: ours(api) == GPU_LABELS)


def test_watch_resumes_after_410_and_dropped_streams(api: FakeApiServer, start: Start) -> None:
    api.create_node(NODE, OTHERS)
    start(interval_s=60)
    wait_for(lambda: ours(api) == GPU_LABELS)
    api.store.compact()
    dropped = time.monotonic()
    api.drop_watches.set()
    wait_for(lambda: api.log.count("watch", since=dropped) >= 2)  # the stream broke, and its successor too
    api.drop_watches.clear()
    wait_for(lambda: api.open_watches == 1)
    api.set_labels(NODE, {"nvidia.com/gpu.count": None})
    wait_for(lambda: ours(api) == GPU_LABELS)
    assert api.max_open_watches == 1


def test_once_reports_a_failed_probe_as_a_failure(api: FakeApiServer, kubeconfig: Path) -> None:
    from labeller.apps.daemon.service import Daemon
    from labeller.apps.daemon.sinks import NodeSink
    from labeller.apps.daemon.run import _run_once
    from labeller.cluster.kube import Kube
    from labeller.apps.daemon.metrics import Metrics

    api.create_node(NODE, {**OTHERS, **GPU_LABELS})
    kube = Kube(str(kubeconfig))
    failing = Daemon(NODE, FakeProbe(error=RuntimeError("NVML gone")), NodeSink(kube, NODE), Metrics())
    assert _run_once(failing) == 1 and ours(api) == GPU_LABELS
    untrusted = Daemon(NODE, FakeProbe(error=ProbeError("/x/sys/bus/pci/devices is empty")),
                       NodeSink(kube, NODE), Metrics())
    assert _run_once(untrusted) == 1 and ours(api) == GPU_LABELS and api.log.writes() == []
    assert _run_once(Daemon(NODE, FakeProbe(), NodeSink(kube, NODE), Metrics())) == 0
