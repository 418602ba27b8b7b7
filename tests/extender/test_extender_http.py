"""The extender over real HTTP against the fake API server: filter, prioritize, bind, the allocation
lock, concurrency, deletions, restart, unhealthy GPUs, resync after 410 Gone, passthrough."""

from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from labeller.model import gpushare
from tests.builders import PATIENCE_S, wait_for
from tests.extender.conftest import Client, PluginStandIn, Start, mem_pod, share_node
from labeller.apps.extender.app import Running
from tests.fakes.apiserver import FakeApiServer, Fault


def test_filter_keeps_nodes_where_one_gpu_fits_not_where_the_sum_does(api: FakeApiServer, extender: Running,
                                                                      client: Client) -> None:
    share_node(api, "half-full")
    share_node(api, "empty")
    api.create_node("plain")
    for i, gpu in enumerate((0, 1)):
        mem_pod(api, f"old{i}", 8, node="half-full", annotations={gpushare.ANN_IDX: str(gpu)})
    wait_for(lambda: extender.cache.free("half-full") == [8, 8])
    answer = client.filter(mem_pod(api, "p", 12), ["half-full", "empty", "plain"])
    assert answer["NodeNames"] == ["empty"]
    assert answer["FailedNodes"] == {
        "half-full": "no GPU has 12 aliyun.com/gpu-mem free (most free on one GPU: 8 of 16)"}
    assert answer["FailedAndUnresolvableNodes"] == {
        "plain": "node does not share GPU memory (no aliyun.com/gpu-mem capacity)"}
    assert answer["Error"] == ""


def test_a_pod_larger_than_any_gpu_is_unschedulable_with_the_reason(api: FakeApiServer, client: Client,
                                                                    extender: Running) -> None:
    share_node(api, "n1")
    share_node(api, "n2", gpus=8, units=24)
    wait_for(lambda: extender.cache.counts[0] == 2)
    answer = client.filter(mem_pod(api, "big", 20, 12), ["n1", "n2"])
    assert answer["NodeNames"] == []
    assert answer["FailedAndUnresolvableNodes"]["n2"] == ("pod asks 32 aliyun.com/gpu-mem but one GPU of this node "
                                                          "has 24: a pod's GPU memory must fit on a single GPU")
    assert extender.metrics.requests.labels(verb="filter", outcome="unschedulable")._value.get() == 1


def test_pods_without_gpu_mem_pass_through_untouched(api: FakeApiServer, client: Client) -> None:
    plain = api.create_pod("web", containers={"c": {"cpu": "1"}})
    names = [f"node-{i}" for i in range(500)]
    started = time.perf_counter()
    answer = client.filter(plain, names)
    elapsed = time.perf_counter() - started
    assert answer == {"NodeNames": names, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}
    assert client.prioritize(plain, names[:2]) == {"node-0": 0, "node-1": 0}
    # The scheduler binds such a pod itself (the extender's managedResources): /bind refuses it.
    assert client.bind(plain, "anywhere") == "pod default/web: asks no aliyun.com/gpu-mem; not bound"
    assert "nodeName" not in api.pod("web")["spec"]
    assert api.pod("web")["metadata"]["annotations"] == {}  # no gpushare annotations on a pod that asks none
    assert api.log.count("patch", "pods", since=0) == 0 and api.log.count("get", "pods", since=0) == 1
    # Milliseconds: nothing per node (the requests are counted above). The bound is the kube-scheduler's
    # extender httpTimeout (5 s), which a loaded machine does not come near either.
    assert elapsed < 5.0


def test_full_node_objects_are_answered_in_kind(api: FakeApiServer, client: Client, extender: Running) -> None:
    share_node(api, "n1", gpus=1, units=4)
    share_node(api, "n2", gpus=1, units=16)
    wait_for(lambda: extender.cache.counts[0] == 2)
    nodes = [api.store.get("n1"), api.store.get("n2")]
    status, answer = client.call("POST", "/gpushare-scheduler/filter",
                                 {"Pod": mem_pod(api, "p", 8), "Nodes": {"items": nodes}})
    assert status == 200
    assert [n["metadata"]["name"] for n in answer["Nodes"]["items"]] == ["n2"]
    assert "NodeNames" not in answer and list(answer["FailedAndUnresolvableNodes"]) == ["n1"]


def test_prioritize_packs_by_default_and_spreads_on_request(api: FakeApiServer, start_extender: Start) -> None:
    share_node(api, "busy")
    share_node(api, "idle")
    mem_pod(api, "old", 10, node="busy", annotations={gpushare.ANN_IDX: "0"})
    pod = mem_pod(api, "p", 4)
    packing = Client(start_extender().http.port)
    spreading = Client(start_extender(policy="spread").http.port)
    wait_for(lambda: packing.inspect("busy")[0]["usedGPU"] == 10 and spreading.inspect("busy")[0]["usedGPU"] == 10)
    assert packing.prioritize(pod, ["busy", "idle"]) == {"busy": 4, "idle": 1}
    assert spreading.prioritize(pod, ["busy", "idle"]) == {"busy": 6, "idle": 9}


def test_bind_writes_gpushares_annotations_then_the_binding(api: FakeApiServer, client: Client,
                                                            extender: Running) -> None:
    share_node(api, "n1")
    mem_pod(api, "old", 10, node="n1", annotations={gpushare.ANN_IDX: "1", gpushare.ANN_ASSIGNED: "true"})
    pod = mem_pod(api, "p", 2, 3)
    wait_for(lambda: extender.cache.free("n1") == [16, 6])
    before_ns = time.time_ns()
    assert client.bind(pod, "n1") == ""
    bound = api.pod("p")
    notes = bound["metadata"]["annotations"]
    assert bound["spec"]["nodeName"] == "n1"
    assert {k: notes[k] for k in (gpushare.ANN_IDX, gpushare.ANN_POD, gpushare.ANN_DEV, gpushare.ANN_ASSIGNED)} == {
        gpushare.ANN_IDX: "1", gpushare.ANN_POD: "5", gpushare.ANN_DEV: "16", gpushare.ANN_ASSIGNED: "false"}
    assert before_ns <= int(notes[gpushare.ANN_ASSUME_TIME]) <= time.time_ns()
    patch = next(r for r in api.log.requests if r.verb == "patch" and r.resource == "pods")
    assert patch.body["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]  # a precondition
    assert extender.cache.free("n1") == [16, 1]  # counted at once, before the watch says so
    assert client.inspect("n1")[0]["devs"][1]["pods"] == [
        {"name": "old", "namespace": "default", "usedGPU": 10, "assumed": False},
        {"name": "p", "namespace": "default", "usedGPU": 5, "assumed": True}]


def test_a_conflicting_annotation_write_is_retried_on_the_fresh_pod(api: FakeApiServer, client: Client,
                                                                    extender: Running) -> None:
    share_node(api, "n1")
    pod = mem_pod(api, "p", 4)
    api.set_pod_annotations("p", {"someone": "else"})  # the scheduler's copy is now stale
    wait_for(lambda: extender.cache.counts[0] == 1)
    assert client.bind(pod, "n1") == ""
    assert api.pod("p")["metadata"]["annotations"]["someone"] == "else"
    assert api.pod("p")["metadata"]["annotations"][gpushare.ANN_IDX] == "0"


def test_one_pod_per_node_awaits_allocation(api: FakeApiServer, start_extender: Start) -> None:
    extender = start_extender(wait_s=2.0)  # the waiting bind below must see the allocation within it, loaded or not
    client = Client(extender.http.port)
    share_node(api, "n1")
    share_node(api, "n2")
    first, second, elsewhere = mem_pod(api, "first", 4), mem_pod(api, "second", 4), mem_pod(api, "elsewhere", 4)
    wait_for(lambda: extender.cache.counts[0] == 2)
    assert client.bind(first, "n1") == ""
    assert client.bind(elsewhere, "n2") == ""  # another node is not held
    error = client.bind(second, "n1")
    assert error.startswith("node n1: pod default/first still awaits its GPU from the device plugin, bound ")
    assert error.endswith("one pod per node at a time awaits Allocate, the scheduler will try again")
    assert "nodeName" not in api.pod("second")["spec"]
    asked = time.monotonic()
    waiting = threading.Thread(target=lambda: setattr(waiting, "error", client.bind(second, "n1")))
    waiting.start()
    wait_for(lambda: api.log.count("get", "pods", since=asked) == 1)  # the bind has begun: it read the pod
    api.set_pod_annotations("first", {gpushare.ANN_ASSIGNED: "true"})  # the plugin's Allocate
    waiting.join(timeout=PATIENCE_S)
    assert getattr(waiting, "error") == ""
    assert api.pod("second")["spec"]["nodeName"] == "n1"


def test_binds_queued_on_one_node_all_answer_within_the_bind_wait(api: FakeApiServer, start_extender: Start) -> None:
    extender = start_extender(wait_s=1.0)
    client = Client(extender.http.port)
    share_node(api, "n1")
    pods = [mem_pod(api, f"p{i}", 1) for i in range(6)]
    wait_for(lambda: extender.cache.counts[0] == 1)

    def bind(pod: dict[str, Any]) -> tuple[str, float]:
        began = time.monotonic()
        return client.bind(pod, "n1"), time.monotonic() - began

    with ThreadPoolExecutor(max_workers=6) as pool:  # nobody allocates: the first pod holds the node
        errors, seconds = zip(*pool.map(bind, pods))
    # Each answer within the 1 s bind wait, plus what a loaded machine adds: the queue and the wait share
    # one deadline. Waiting for the binds queued before it would take the last one up to 6 x 1 s.
    assert max(seconds) < 3.0
    assert errors.count("") == 1
    assert all("still awaits its GPU" in e or "other binds to this node are still waiting" in e for e in errors if e)


def test_a_stale_or_finished_assumed_pod_does_not_hold_the_node(api: FakeApiServer, start_extender: Start) -> None:
    extender = start_extender(wait_s=0.3, stale_s=1.0)
    client = Client(extender.http.port)
    share_node(api, "n1")
    stale = str(time.time_ns() - 5 * 10**9)
    mem_pod(api, "stuck", 4, node="n1", annotations={gpushare.ANN_IDX: "0", gpushare.ANN_ASSIGNED: "false",
                                                     gpushare.ANN_ASSUME_TIME: stale})
    mem_pod(api, "failed", 4, node="n1", phase="Failed", annotations={
        gpushare.ANN_IDX: "0", gpushare.ANN_ASSIGNED: "false", gpushare.ANN_ASSUME_TIME: str(time.time_ns())})
    pod = mem_pod(api, "p", 4)
    wait_for(lambda: extender.cache.counts == (1, 1))
    assert client.bind(pod, "n1") == ""


def test_concurrent_binds_never_overcommit_a_gpu(api: FakeApiServer, client: Client, extender: Running) -> None:
    share_node(api, "n1")
    share_node(api, "n2")
    pods = [mem_pod(api, f"p{i:02}", 5) for i in range(30)]
    wait_for(lambda: extender.cache.counts[0] == 2)
    with PluginStandIn(api), ThreadPoolExecutor(max_workers=30) as pool:
        errors = list(pool.map(lambda i: client.bind(pods[i], "n1" if i % 2 else "n2"), range(30)))
    placed: collections.Counter[tuple[str, int]] = collections.Counter()
    for pod in api.pods.list(None)[0]:
        if pod["spec"].get("nodeName"):
            placed[(pod["spec"]["nodeName"], int(pod["metadata"]["annotations"][gpushare.ANN_IDX]))] += 5
    assert placed == {("n1", 0): 15, ("n1", 1): 15, ("n2", 0): 15, ("n2", 1): 15}  # 3 pods of 5 on each GPU of 16
    assert sum(error == "" for error in errors) == 12
    assert all(e == "" or e.startswith("node n") and "no GPU has 5 aliyun.com/gpu-mem free" in e for e in errors)


def test_deleted_and_finished_pods_free_their_memory(api: FakeApiServer, client: Client, extender: Running) -> None:
    share_node(api, "n1", gpus=1)
    for name in ("a", "b", "c"):
        mem_pod(api, name, 5, node="n1", annotations={gpushare.ANN_IDX: "0"})
    wait_for(lambda: extender.cache.free("n1") == [1])
    api.delete_pod("a")
    wait_for(lambda: extender.cache.free("n1") == [6])
    api.set_pod_phase("b", "Succeeded")
    wait_for(lambda: extender.cache.free("n1") == [11])
    api.start_deleting_pod("c")
    wait_for(lambda: extender.cache.free("n1") == [16])
    assert client.filter(mem_pod(api, "p", 16), ["n1"])["NodeNames"] == ["n1"]


def test_a_restarted_extender_rebuilds_everything_from_the_api(api: FakeApiServer, start_extender: Start) -> None:
    share_node(api, "n1")
    api.set_config_map("unhealthy-gpu-n1", {"gpus": "1"})
    first = start_extender()
    with PluginStandIn(api):
        for i in range(3):
            assert Client(first.http.port).bind(mem_pod(api, f"p{i}", 4), "n1") == ""
        # the stand-in marks each pod assigned after its bind: wait for the last, in the API and in the cache
        wait_for(lambda: all(api.pod(f"p{i}")["metadata"]["annotations"].get(gpushare.ANN_ASSIGNED) == "true"
                             for i in range(3)))
        wait_for(lambda: [pod["assumed"] for dev in Client(first.http.port).inspect("n1")[0]["devs"]
                          for pod in dev["pods"]] == [False] * 3)
    seen = Client(first.http.port).inspect()
    first.close()
    second = start_extender()
    wait_for(lambda: Client(second.http.port).inspect() == seen)
    assert seen[0]["devs"][0]["usedGPU"] == 12 and seen[0]["devs"][1]["healthy"] is False


def test_unhealthy_gpus_from_gpushares_config_map(api: FakeApiServer, client: Client, extender: Running) -> None:
    share_node(api, "n1")
    pod = mem_pod(api, "p", 10)
    wait_for(lambda: extender.cache.counts[0] == 1)
    api.set_config_map("unhealthy-gpu-n1", {"gpus": "0,1"})
    wait_for(lambda: extender.cache.free("n1") == [None, None])
    assert client.filter(pod, ["n1"])["FailedNodes"] == {"n1": "all 2 GPUs are unhealthy"}
    api.set_config_map("unhealthy-gpu-n1", {"gpus": "0"})
    wait_for(lambda: extender.cache.free("n1") == [None, 16])
    assert client.bind(pod, "n1") == ""
    assert api.pod("p")["metadata"]["annotations"][gpushare.ANN_IDX] == "1"


def test_a_watch_too_old_to_resume_lists_again(api: FakeApiServer, extender: Running) -> None:
    share_node(api, "n1", gpus=1)
    mem_pod(api, "a", 4, node="n1", annotations={gpushare.ANN_IDX: "0"})
    wait_for(lambda: extender.cache.free("n1") == [12])
    relists = extender.feed.relists
    down = time.monotonic()
    api.faults.add(Fault(verb="watch", resource="pods", drop=True))  # no pod watch gets through ...
    api.drop_watches.set()  # ... once the open one breaks
    wait_for(lambda: api.log.count("watch", "pods", since=down) >= 1)  # it broke: the extender tries again
    api.delete_pod("a")  # while the pods watch is down, history is lost
    mem_pod(api, "b", 6, node="n1", annotations={gpushare.ANN_IDX: "0"})
    api.store.compact()
    api.faults.clear()
    api.drop_watches.clear()
    wait_for(lambda: extender.cache.free("n1") == [10])
    assert extender.feed.relists > relists


def test_health_metrics_and_bad_requests(api: FakeApiServer, client: Client, extender: Running) -> None:
    assert client.call("GET", "/healthz")[0] == 200
    assert client.call("GET", "/readyz") == (200, "ready\n")
    client.filter(api.create_pod("web"), ["n"])
    status, text = client.call("GET", "/metrics")
    assert status == 200 and 'gpu_labeller_extender_requests_total{outcome="passthrough",verb="filter"} 1.0' in text
    assert client.call("POST", "/gpushare-scheduler/filter", "not json")[0] == 400
    assert client.call("POST", "/gpushare-scheduler/bind", {"PodName": "x"}) == (
        400, {"Error": "ExtenderBindingArgs without PodNamespace"})
    assert client.call("POST", "/gpushare-scheduler/nope", {})[0] == 404
    assert client.call("POST", "/gpushare-scheduler/filter", [])[1] == {"Error": "body is not a JSON object"}
    assert client.call("POST", "/gpushare-scheduler/filter", {"NodeNames": []})[1] == {
        "Error": "ExtenderArgs without a Pod"}


def test_bind_refuses_a_pod_recreated_under_the_same_name(api: FakeApiServer, client: Client,
                                                          extender: Running) -> None:
    share_node(api, "n1")
    old = mem_pod(api, "p", 4)
    api.delete_pod("p")
    mem_pod(api, "p", 4)
    wait_for(lambda: extender.cache.counts[0] == 1)
    assert client.bind(old, "n1") == "pod default/p: its uid changed (deleted and created again); not bound"
    assert "nodeName" not in api.pod("p")["spec"]
    gone = mem_pod(api, "gone", 4)
    api.delete_pod("gone")
    assert client.bind(gone, "n1").startswith("pod default/gone: cannot read it: 404")
