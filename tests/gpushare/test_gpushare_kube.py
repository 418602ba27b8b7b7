"""The Kube adapter's pod, node and ConfigMap calls against the fake API server over real HTTP."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from labeller.model.gpushare import RESOURCE_MEM
from labeller.cluster.kube import Conflict, Gone, Kube, KubeError, NotFound
from tests.builders import PATIENCE_S, wait_for
from tests.fakes.apiserver import FakeApiServer


@pytest.fixture
def kube(kubeconfig: Path) -> Iterator[Kube]:
    client = Kube(str(kubeconfig))
    yield client
    client.close()


def names(items: list[dict[str, object]]) -> list[str]:
    return [f"{item['metadata']['namespace']}/{item['metadata']['name']}" for item in items]  # type: ignore[index]


def test_list_pods_spans_namespaces_in_pages_and_filters_by_field_and_label(api: FakeApiServer, kube: Kube) -> None:
    for i in range(7):
        api.create_pod(f"p{i}", "team-a" if i % 2 else "team-b", node="n1" if i < 3 else None,
                       labels={"app": "train" if i < 5 else "serve"})
    api.set_pod_phase("p0", "Running", "team-b")
    items, rv = kube._list("pods", "/api/v1/pods", page_size=2)
    assert len(items) == 7 and rv
    assert api.log.count("list", "pods") == 4  # 2 + 2 + 2 + 1
    assert names(kube.list_pods(field_selector="spec.nodeName=n1")[0]) == ["team-a/p1", "team-b/p0", "team-b/p2"]
    assert names(kube.list_pods(field_selector="spec.nodeName=n1,status.phase!=Running")[0]) == ["team-a/p1",
                                                                                                 "team-b/p2"]
    assert names(kube.list_pods(field_selector="spec.nodeName=")[0]) == ["team-a/p3", "team-a/p5",
                                                                         "team-b/p4", "team-b/p6"]
    assert names(kube.list_pods(label_selector="app in (serve)")[0]) == ["team-a/p5", "team-b/p6"]
    assert names(kube.list_pods(label_selector="app!=train,app")[0]) == ["team-a/p5", "team-b/p6"]
    assert names(kube.list_pods(field_selector="metadata.name=p3")[0]) == ["team-a/p3"]


def test_an_unknown_field_selector_is_a_400_as_on_a_real_server(kube: Kube) -> None:
    with pytest.raises(KubeError) as caught:
        kube.list_pods(field_selector="spec.gpu=1")
    assert caught.value.status == 400 and "not a known field selector" in caught.value.message


def test_annotation_patch_with_a_stale_resource_version_is_a_conflict(api: FakeApiServer, kube: Kube) -> None:
    created = api.create_pod("p", annotations={"keep": "me", "drop": "me"})
    rv = created["metadata"]["resourceVersion"]
    patched = kube.patch_pod_annotations("default", "p", {"new": "1", "drop": None}, resource_version=rv)
    assert patched["metadata"]["annotations"] == {"keep": "me", "new": "1"}
    with pytest.raises(Conflict):
        kube.patch_pod_annotations("default", "p", {"late": "1"}, resource_version=rv)
    assert "late" not in kube.get_pod("default", "p")["metadata"]["annotations"]
    with pytest.raises(NotFound):
        kube.patch_pod_annotations("default", "missing", {"a": "b"})


def test_binding_sets_the_node_once(api: FakeApiServer, kube: Kube) -> None:
    uid = api.create_pod("p")["metadata"]["uid"]
    kube.bind_pod("default", "p", uid, "n1")
    assert kube.get_pod("default", "p")["spec"]["nodeName"] == "n1"
    with pytest.raises(Conflict) as caught:
        kube.bind_pod("default", "p", uid, "n2")
    assert "already assigned" in caught.value.message
    other = api.create_pod("q")["metadata"]["uid"]
    with pytest.raises(Conflict):
        kube.bind_pod("default", "q", uid, "n1")  # the uid of another pod: a precondition failure
    assert "nodeName" not in api.pod("q")["spec"] and other
    with pytest.raises(NotFound):
        kube.bind_pod("default", "missing", "u", "n1")


def test_pod_watch_sees_binding_as_added_to_a_node_filter_and_deletion(api: FakeApiServer, kube: Kube) -> None:
    _, rv = kube.list_pods(field_selector="spec.nodeName=n1")
    seen: list[tuple[str, str]] = []

    def follow() -> None:
        for kind, obj in kube.watch_pods(rv, field_selector="spec.nodeName=n1", timeout_s=int(PATIENCE_S)):
            if kind != "BOOKMARK":
                seen.append((kind, obj["metadata"]["name"]))
            if kind == "DELETED":
                return
    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    uid = api.create_pod("p")["metadata"]["uid"]
    api.create_pod("elsewhere", node="n2")
    kube.bind_pod("default", "p", uid, "n1")
    api.set_pod_annotations("p", {"a": "b"})
    api.delete_pod("p")
    thread.join(timeout=PATIENCE_S)
    assert seen == [("ADDED", "p"), ("MODIFIED", "p"), ("DELETED", "p")]


def test_watch_from_a_compacted_version_is_gone(api: FakeApiServer, kube: Kube) -> None:
    api.create_pod("p")
    _, rv = kube.list_pods()
    api.create_pod("q")
    api.store.compact()
    with pytest.raises(Gone):
        list(kube.watch_pods(rv, timeout_s=1))


def test_nodes_list_in_pages_with_status_and_watch(api: FakeApiServer, kube: Kube) -> None:
    for i in range(5):
        api.create_node(f"n{i}", labels={"gpushare": "true"} if i % 2 else {})
    api.set_node_status("n1", capacity={RESOURCE_MEM: "32", "aliyun.com/gpu-count": "2"})
    items, rv = kube._list("nodes", "/api/v1/nodes", page_size=2)
    assert [n["metadata"]["name"] for n in items] == ["n0", "n1", "n2", "n3", "n4"]
    shared, rv = kube.list_nodes(label_selector="gpushare=true")
    assert [n["metadata"]["name"] for n in shared] == ["n1", "n3"]
    assert shared[0]["status"]["allocatable"][RESOURCE_MEM] == "32"
    events: list[tuple[str, str]] = []

    def follow() -> None:
        for kind, obj in kube.watch_nodes(rv, timeout_s=int(PATIENCE_S)):
            events.append((kind, obj["metadata"]["name"]))
            return
    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    api.create_pod("not-a-node")
    api.set_node_status("n3", capacity={RESOURCE_MEM: "8"})
    thread.join(timeout=PATIENCE_S)
    assert events == [("MODIFIED", "n3")]


def test_config_maps_get_list_and_missing(api: FakeApiServer, kube: Kube) -> None:
    assert kube.get_config_map("kube-system", "unhealthy-gpu-n1") is None
    api.set_config_map("unhealthy-gpu-n1", {"gpus": "0,2"})
    assert kube.get_config_map("kube-system", "unhealthy-gpu-n1")["data"] == {"gpus": "0,2"}  # type: ignore[index]
    api.set_config_map("unhealthy-gpu-n1", {"gpus": "1"})
    items, rv = kube.list_config_maps("kube-system")
    assert [i["data"] for i in items] == [{"gpus": "1"}] and rv
    assert kube.list_config_maps("default")[0] == []


def test_forbidden_pod_list_names_the_resource(api: FakeApiServer, kube: Kube) -> None:
    api.forbid("list", "pods")
    with pytest.raises(KubeError) as caught:
        kube.list_pods(field_selector="spec.nodeName=n1")
    assert caught.value.status == 403 and 'cannot list resource "pods"' in caught.value.message
    wait_for(lambda: api.log.count("list", "pods") == 1)


def test_pods_are_created_and_deleted_over_http(api: FakeApiServer) -> None:
    import json
    import urllib.request

    def call(method: str, path: str, body: object = None) -> dict[str, object]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(api.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request) as answer:
            return json.loads(answer.read())  # type: ignore[no-any-return]
    created = call("POST", "/api/v1/namespaces/ns/pods", {"metadata": {"name": "p"}, "spec": {"containers": []}})
    assert created["status"] == {"phase": "Pending"}
    assert [p["metadata"]["name"] for p in api.pods.list("ns")[0]] == ["p"]
    deleted = call("DELETE", "/api/v1/namespaces/ns/pods/p")
    assert deleted["metadata"]["name"] == "p"  # type: ignore[index]
    assert api.pods.list(None)[0] == []
