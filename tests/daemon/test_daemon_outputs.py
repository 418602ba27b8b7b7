"""The other outputs (features.d file, NodeFeature object), Events, metrics and health endpoints."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import structlog.testing

from labeller.base.outputs import render
from labeller.apps.daemon.sinks import WRITTEN_BY, FeaturesFileSink, NodeFeatureSink
from labeller.cluster.kube import Kube, NotFound
from labeller.process.httpserver import start_http_server
from tests.builders import PATIENCE_S, wait_for
from tests.daemon.conftest import GPU_LABELS, NODE, OTHERS, FakeProbe, Running
from tests.fakes.apiserver import FakeApiServer

Start = Callable[..., Running]


def test_features_file_is_written_atomically_with_expiry_and_only_when_changed(tmp_path: Path, start: Start) -> None:
    path = tmp_path / "features.d" / "gpu-labeller"
    probe = FakeProbe()
    start(probe, sink=lambda kube: FeaturesFileSink(path, expiry_s=300), interval_s=0.05)
    wait_for(path.exists)
    text = path.read_text()
    expiry_line = next(line for line in text.splitlines() if line.startswith("# +expiry-time="))
    expiry = datetime.strptime(expiry_line.split("=", 1)[1], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert 250 < (expiry - datetime.now(UTC)).total_seconds() <= 300
    assert {line for line in text.splitlines() if not line.startswith("#")} == {
        f"{k}={v}" for k, v in GPU_LABELS.items()}
    mtime, calls = path.stat().st_mtime_ns, probe.calls
    wait_for(lambda: probe.calls >= calls + 3)
    assert path.stat().st_mtime_ns == mtime  # unchanged hardware: no rewrite
    assert [p.name for p in path.parent.iterdir()] == ["gpu-labeller"]  # no temporary files left
    probe.labels = {}
    wait_for(lambda: "nvidia.com" not in path.read_text())


def test_node_feature_object_is_created_then_updated_only_when_changed(api: FakeApiServer, start: Start) -> None:
    probe = FakeProbe()
    start(probe, sink=lambda kube: NodeFeatureSink(kube, NODE, "gpu-system"), interval_s=0.05)
    name = f"gpu-labeller-{NODE}"
    obj = wait_for(lambda: api.node_feature("gpu-system", name))
    assert obj["apiVersion"] == "nfd.k8s-sigs.io/v1alpha1" and obj["kind"] == "NodeFeature"
    assert obj["metadata"]["labels"] == {"nfd.node.kubernetes.io/node-name": NODE,
                                         "app.kubernetes.io/managed-by": "gpu-labeller"}
    assert obj["spec"]["labels"] == GPU_LABELS
    wait_for(lambda: api.log.count("get", "nodefeatures") >= 3)  # later passes read it again
    assert api.log.count("update", "nodefeatures") == 0 and api.log.count("create", "nodefeatures") == 1
    probe.labels = {"nvidia.com/gpu.present": "true"}
    wait_for(lambda: (api.node_feature("gpu-system", name) or {})["spec"]["labels"] == probe.labels)
    assert api.log.count("update", "nodefeatures") == 1


def test_a_features_file_gpu_labeller_did_not_write_is_never_replaced(tmp_path: Path, start: Start) -> None:
    path = tmp_path / "features.d" / "gpu-labeller"
    path.parent.mkdir()
    path.write_text("# an admin's own features\nnvidia.com/gpu.product=by-hand\n")
    with structlog.testing.capture_logs() as logs:
        daemon = start(sink=lambda kube: FeaturesFileSink(path, expiry_s=300), interval_s=0.05)
        wait_for(lambda: daemon.metric("gpu_labeller_reconciles_total", outcome="not-ours") >= 5)
    assert path.read_text() == "# an admin's own features\nnvidia.com/gpu.product=by-hand\n"
    assert not daemon.daemon.ready
    [line] = [entry for entry in logs if entry.get("reason") == "not-ours"]
    assert line["log_level"] == "error" and str(path) in line["event"]
    path.unlink()  # the admin moves it away: ours to write from now on
    wait_for(lambda: path.exists() and daemon.daemon.ready)
    assert render(GPU_LABELS, "nfd").startswith(WRITTEN_BY)


def test_a_node_feature_gpu_labeller_did_not_create_is_never_replaced(api: FakeApiServer, start: Start) -> None:
    name = f"gpu-labeller-{NODE}"
    theirs = {"apiVersion": "nfd.k8s-sigs.io/v1alpha1", "kind": "NodeFeature",
              "metadata": {"name": name, "namespace": "gpu-system", "resourceVersion": "1"},
              "spec": {"labels": {"nvidia.com/gpu.product": "by-hand"}}}
    api.store.custom[("nodefeatures", "gpu-system", name)] = theirs
    with structlog.testing.capture_logs() as logs:
        daemon = start(sink=lambda kube: NodeFeatureSink(kube, NODE, "gpu-system"), interval_s=0.05)
        wait_for(lambda: daemon.metric("gpu_labeller_reconciles_total", outcome="not-ours") >= 5)
    assert api.node_feature("gpu-system", name) == theirs and api.log.count("update", "nodefeatures") == 0
    assert not daemon.daemon.ready
    [line] = [entry for entry in logs if entry.get("reason") == "not-ours"]
    assert f"NodeFeature gpu-system/{name}" in line["event"]
    assert "app.kubernetes.io/managed-by=gpu-labeller" in line["event"]


def test_events_are_recorded_when_labels_change(api: FakeApiServer, start: Start) -> None:
    api.create_node(NODE, OTHERS)
    start(events=True)
    event = wait_for(lambda: api.events())[0]
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": NODE}
    assert event["reason"] == "GPULabelsChanged" and "4 added" in event["message"]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=PATIENCE_S) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_health_ready_and_metrics_endpoints(api: FakeApiServer, start: Start) -> None:
    daemon = start()
    server = start_http_server(0, "127.0.0.1", ready=lambda: daemon.daemon.ready, healthy=daemon.loop.healthy,
                               registry=daemon.metrics.registry)
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert get(f"{base}/healthz")[0] == 200
        assert get(f"{base}/readyz")[0] == 503  # the node does not exist yet
        api.create_node(NODE, OTHERS)
        wait_for(lambda: get(f"{base}/readyz")[0] == 200)
        _, text = get(f"{base}/metrics")
        for name in ("gpu_labeller_probe_duration_seconds_bucket", 'gpu_labeller_reconciles_total{outcome="applied"}',
                     'gpu_labeller_api_requests_total{code="200",verb="patch"}',
                     'gpu_labeller_writes_total{outcome="success"}',
                     "gpu_labeller_labels_owned 4.0", "gpu_labeller_last_success_timestamp_seconds",
                     "gpu_labeller_label_fights_total 0.0"):
            assert name in text, name
        assert get(f"{base}/nope")[0] == 404
    finally:
        server.close()


def test_kube_reports_every_request_to_its_observer(api: FakeApiServer, kubeconfig: Path) -> None:
    seen: list[tuple[str, int]] = []
    kube = Kube(str(kubeconfig), observer=lambda verb, code: seen.append((verb, code)))
    api.create_node(NODE)
    kube.get_node(NODE)
    with pytest.raises(NotFound):
        kube.get_node("missing")
    assert seen == [("get", 200), ("get", 404)]


def test_refreshing_the_features_file_expiry_is_not_a_label_change(api: FakeApiServer, tmp_path: Path,
                                                                    start: Start) -> None:
    """The file is rewritten as its expiry draws near, with the same labels: no "labels updated"
    line with every key "added", and no GPULabelsChanged Event, for a mere refresh."""
    api.create_node(NODE, OTHERS)
    path = tmp_path / "features.d" / "gpu-labeller"
    with structlog.testing.capture_logs() as logs:
        start(sink=lambda kube: FeaturesFileSink(path, expiry_s=2), interval_s=0.05, events=True)
        first = wait_for(lambda: path.exists() and path.read_text())
        wait_for(lambda: path.read_text() != first)  # the expiry was refreshed
    assert [line for line in path.read_text().splitlines() if not line.startswith("#")] == \
        [line for line in first.splitlines() if not line.startswith("#")]
    updates = [entry for entry in logs if entry.get("reason") == "labels-changed"]
    assert len(updates) == 1 and updates[0]["added"] == sorted(GPU_LABELS)
    assert [event["message"] for event in api.events()] == ["gpu-labeller: 4 added, 0 changed, 0 removed"]


def test_a_features_file_near_its_expiry_still_reports_its_labels(tmp_path: Path) -> None:
    path = tmp_path / "gpu-labeller"
    sink = FeaturesFileSink(path, expiry_s=300)
    path.write_text(render(GPU_LABELS, "nfd", expiry=datetime.now(UTC)))
    live = sink.live()
    assert live.labels == GPU_LABELS and live.refresh_due
    path.write_text(render(GPU_LABELS, "nfd", expiry=datetime.now(UTC) + timedelta(seconds=300)))
    assert sink.live().labels == GPU_LABELS and not sink.live().refresh_due
