"""Whose labels the daemon may change: it removes only what its field manager set (managedFields),
takes over the keys it computes, and leaves every other manager's key alone, counted and logged.

Two field managers at work on the fake API server: gpu-labeller (apply) and people or controllers
(updates, as ``kubectl label`` sends them, or applies of their own)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import structlog.testing

from labeller.apps.daemon.sinks import Stale
from labeller.cluster.kube import Kube
from labeller.model.labels import FIELD_MANAGER
from labeller.apps.daemon.reconcile import Live, plan
from labeller.apps.daemon.sinks import NodeSink
from tests.builders import wait_for
from tests.daemon.conftest import GPU_LABELS, NODE, OTHERS, FakeProbe, Running
from tests.fakes.apiserver import FakeApiServer

Start = Callable[..., Running]
US = (FIELD_MANAGER, "Apply")
ADMIN = {"nvidia.com/vgpu.config": "A100-4C", "nvidia.com/vgpu.config.state": "success",
         "nvidia.com/gpu.imex-domain": "x"}


def ours(api: FakeApiServer) -> dict[str, str]:
    return {k: v for k, v in api.labels(NODE).items() if k not in OTHERS and k not in ADMIN}


def test_admin_labels_under_our_prefixes_survive_a_node_with_no_gpus(api: FakeApiServer, start: Start) -> None:
    api.create_node(NODE, OTHERS)
    api.set_labels(NODE, dict(ADMIN), manager="kubectl-label")
    probe = FakeProbe()
    daemon = start(probe)
    wait_for(lambda: ours(api) == GPU_LABELS)
    probe.labels = {}  # a genuine, readable empty node: our own labels go, nobody else's
    wait_for(lambda: ours(api) == {})
    unchanged = daemon.metric("gpu_labeller_reconciles_total", outcome="unchanged")
    wait_for(lambda: daemon.metric("gpu_labeller_reconciles_total", outcome="unchanged") >= unchanged + 2)
    assert api.labels(NODE) == {**OTHERS, **ADMIN}
    assert all(write.content_type.startswith("application/apply-patch") for write in api.log.writes())
    # gpu.imex-domain; vgpu.config* are not even ours by prefix
    assert daemon.metric("gpu_labeller_foreign_labels") == 1


def test_a_foreign_key_is_logged_once_with_its_manager_and_counted(api: FakeApiServer, start: Start) -> None:
    api.create_node(NODE, OTHERS)
    api.set_labels(NODE, {"nvidia.com/gpu.imex-domain": "x"}, manager="kubectl-label")
    with structlog.testing.capture_logs() as logs:
        daemon = start(interval_s=0.05)
        wait_for(lambda: ours(api) == GPU_LABELS)
        wait_for(lambda: daemon.metric("gpu_labeller_reconciles_total", outcome="unchanged") > 10)
    lines = [entry for entry in logs if entry.get("reason") == "foreign-labels"]
    assert len(lines) == 1 and lines[0]["labels"] == {"nvidia.com/gpu.imex-domain": "kubectl-label"}
    assert daemon.metric("gpu_labeller_foreign_labels") == 1
    assert api.labels(NODE)["nvidia.com/gpu.imex-domain"] == "x"


def test_a_computed_key_set_by_kubectl_is_taken_over_then_removed_when_no_longer_computed(
        api: FakeApiServer, start: Start) -> None:
    api.create_node(NODE, OTHERS)
    api.set_labels(NODE, {"nvidia.com/gpu.product": "old-gfd-value"}, manager="kubectl-label")
    probe = FakeProbe()
    with structlog.testing.capture_logs() as logs:
        start(probe)
        wait_for(lambda: ours(api) == GPU_LABELS)
        [adopted] = wait_for(lambda: [entry for entry in logs if entry.get("reason") == "adopted"])
    assert api.managers_of(NODE, "nvidia.com/gpu.product") == {US}
    assert adopted["label"] == "nvidia.com/gpu.product" and adopted["previous_managers"] == "kubectl-label"
    probe.labels = {k: v for k, v in GPU_LABELS.items() if k != "nvidia.com/gpu.product"}
    wait_for(lambda: "nvidia.com/gpu.product" not in api.labels(NODE))


def test_a_computed_key_set_with_the_same_value_is_adopted_and_later_only_relinquished(
        api: FakeApiServer, start: Start) -> None:
    """The same value: the apply makes the key co-owned. Once we stop computing it, the other
    manager still owns it, so it stays (theirs); only our claim goes."""
    api.create_node(NODE, OTHERS)
    api.set_labels(NODE, {"nvidia.com/gpu.count": "8"}, manager="kubectl-label")
    probe = FakeProbe()
    start(probe)
    wait_for(lambda: US in api.managers_of(NODE, "nvidia.com/gpu.count"))
    assert api.managers_of(NODE, "nvidia.com/gpu.count") == {US, ("kubectl-label", "Update")}
    probe.labels = {k: v for k, v in GPU_LABELS.items() if k != "nvidia.com/gpu.count"}
    wait_for(lambda: api.managers_of(NODE, "nvidia.com/gpu.count") == {("kubectl-label", "Update")})
    assert api.labels(NODE)["nvidia.com/gpu.count"] == "8"


def test_another_appliers_key_is_left_even_with_our_prefix(api: FakeApiServer, start: Start) -> None:
    api.create_node(NODE, OTHERS)
    api.apply_as(NODE, "gpu-feature-discovery", {"nvidia.com/gpu.family": "hopper"})
    daemon = start()
    wait_for(lambda: ours(api) == {**GPU_LABELS, "nvidia.com/gpu.family": "hopper"})
    wait_for(lambda: daemon.metric("gpu_labeller_reconciles_total", outcome="unchanged") >= 2)  # later passes too
    assert api.managers_of(NODE, "nvidia.com/gpu.family") == {("gpu-feature-discovery", "Apply")}


def test_keys_an_older_version_merge_patched_are_removed_with_a_guarded_merge_patch(
        api: FakeApiServer, start: Start) -> None:
    """A key in our own Update entry only (an older gpu-labeller's merge patch): SSA cannot drop it."""
    api.create_node(NODE, OTHERS)
    api.set_labels(NODE, {"nvidia.com/gpu.family": "hopper", "nvidia.com/gpu.count": "8"}, manager=FIELD_MANAGER)
    start()
    wait_for(lambda: ours(api) == GPU_LABELS)
    [merge] = [w for w in api.log.writes() if w.content_type.startswith("application/merge-patch")]
    assert merge.body["metadata"]["labels"] == {"nvidia.com/gpu.family": None}
    assert merge.body["metadata"]["resourceVersion"]  # a Node changed since answers 409, nothing removed
    assert api.managers_of(NODE, "nvidia.com/gpu.count") == {US, (FIELD_MANAGER, "Update")}


def test_a_failed_probe_keeps_foreign_and_own_labels(api: FakeApiServer, start: Start) -> None:
    api.create_node(NODE, OTHERS)
    api.set_labels(NODE, {"nvidia.com/gpu.imex-domain": "x"}, manager="kubectl-label")
    probe = FakeProbe()
    start(probe, interval_s=0.05)
    wait_for(lambda: ours(api) == GPU_LABELS)
    probe.error = RuntimeError("boom")
    calls = probe.calls
    wait_for(lambda: probe.calls > calls + 2)
    assert ours(api) == GPU_LABELS and api.labels(NODE)["nvidia.com/gpu.imex-domain"] == "x"


def test_a_key_set_by_someone_else_after_the_plan_is_never_patched_out(api: FakeApiServer, kubeconfig: Path) -> None:
    """Between reading the Node and the merge patch, another manager sets the key: it stays."""
    api.create_node(NODE, OTHERS)
    api.set_labels(NODE, {"nvidia.com/gpu.family": "hopper"}, manager=FIELD_MANAGER)  # only ours, legacy
    api.apply_as(NODE, FIELD_MANAGER, {"nvidia.com/gpu.count": "8"})
    kube = Kube(str(kubeconfig))
    sink = NodeSink(kube, NODE)
    change = plan(sink.live(), {}, probe_ok=True)
    assert set(change.patch_out) == {"nvidia.com/gpu.family"} and change.apply
    api.set_labels(NODE, {"nvidia.com/gpu.family": "ampere"}, manager="kubectl-label")
    sink.write(change)  # the apply's answer shows the new manager: no merge patch is sent
    assert api.labels(NODE)["nvidia.com/gpu.family"] == "ampere" and "nvidia.com/gpu.count" not in api.labels(NODE)
    assert not [w for w in api.log.writes() if w.content_type.startswith("application/merge-patch")]

    stale = NodeSink(kube, NODE)
    api.set_labels(NODE, {"nvidia.com/gpu.memory": "1"}, manager=FIELD_MANAGER)
    change = plan(stale.live(), {}, probe_ok=True)
    api.set_labels(NODE, {"nvidia.com/gpu.imex-domain": "x"}, manager="kubectl-label")  # the Node changes
    with pytest.raises(Stale):  # the merge patch carries the resourceVersion it was planned on
        stale.write(change)
    assert api.labels(NODE)["nvidia.com/gpu.memory"] == "1"


def test_cleanup_reports_a_key_another_manager_set_meanwhile_as_left() -> None:
    from labeller.cli.commands.cleanup import cleanup_report

    def node(manager: str) -> Live:
        return Live.of_node({"metadata": {"labels": {"nvidia.com/gpu.count": "8"}, "managedFields": [
            {"manager": manager, "operation": "Update", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:metadata": {"f:labels": {"f:nvidia.com/gpu.count": {}}}}}]}})

    before, after = node(FIELD_MANAGER), node("kubectl-label")
    change = plan(before, {}, probe_ok=True)
    assert cleanup_report("n", before, before, change, dry_run=True) == [
        "n: would remove nvidia.com/gpu.count (set by gpu-labeller)", "n: 1 to remove, 0 to release, 0 left"]
    assert cleanup_report("n", before, after, change, dry_run=False) == [
        "n: left nvidia.com/gpu.count (set by kubectl-label; --include-foreign removes it)",
        "n: 0 removed, 0 released, 1 left"]
