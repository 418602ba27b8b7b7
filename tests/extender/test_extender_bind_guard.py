"""/bind binds only what the scheduler would: a pending, unbound pod of one of the extender's
schedulers that asks gpu-mem, onto a node the extender knows and where it fits now; binds of one pod
are serialised, and a pod is charged to one node only."""

from __future__ import annotations

import collections
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from labeller.model import gpushare
from labeller.apps.extender.app import Running
from tests.builders import wait_for
from tests.extender.conftest import Client, Start, mem_pod, share_node
from tests.fakes.apiserver import FakeApiServer


Obj = dict[str, Any]


def untouched(api: FakeApiServer, name: str, namespace: str = "default") -> bool:
    pod = api.pod(name, namespace)
    return "nodeName" not in pod["spec"] and not set(gpushare.ANNOTATIONS) & set(pod["metadata"]["annotations"])


def test_bind_refuses_what_the_scheduler_would_never_bind(api: FakeApiServer, client: Client,
                                                          extender: Running) -> None:
    share_node(api, "n1", gpus=1, units=16)
    api.create_node("plain")
    wait_for(lambda: extender.cache.counts[0] == 1)
    system = mem_pod(api, "coredns", 4, namespace="kube-system")
    nobody = mem_pod(api, "nobody", 4)
    api.pods.change("default", "nobody", lambda pod: pod["spec"].update({"schedulerName": "nobody"}))
    web = api.create_pod("web", containers={"c": {"cpu": "1"}})
    big = mem_pod(api, "big", 17)
    done = mem_pod(api, "done", 4, phase="Succeeded")
    refusals = {
        "no-such-node": client.bind(system, "no-such-node"),
        "plain node": client.bind(system, "plain"),
        "other scheduler": client.bind(nobody, "n1"),
        "no gpu-mem": client.bind(web, "n1"),
        "does not fit": client.bind(big, "n1"),
        "not pending": client.bind(done, "n1"),
    }
    assert refusals == {
        "no-such-node": "node no-such-node: not a node this extender knows to share GPU memory; not bound",
        "plain node": "node plain: not a node this extender knows to share GPU memory; not bound",
        "other scheduler": ('pod default/nobody: its schedulerName is "nobody", not one of this extender\'s '
                            "(default-scheduler); not bound"),
        "no gpu-mem": "pod default/web: asks no aliyun.com/gpu-mem; not bound",
        "does not fit": ("node n1: pod asks 17 aliyun.com/gpu-mem but one GPU of this node has 16: a pod's GPU "
                         "memory must fit on a single GPU"),
        "not pending": "pod default/done: not pending (phase Succeeded); not bound",
    }
    for name, namespace in (("coredns", "kube-system"), ("nobody", "default"), ("web", "default"),
                            ("big", "default"), ("done", "default")):
        assert untouched(api, name, namespace), name
    assert extender.cache.free("n1") == [16]  # nothing charged
    assert client.bind(system, "n1") == ""  # the same pod, asked as the scheduler would
    assert client.bind(system, "n1") == "pod kube-system/coredns: already bound to node n1; not bound"


def test_bind_serves_each_scheduler_name_it_is_given(api: FakeApiServer, start_extender: Start) -> None:
    extender = start_extender(scheduler_names=("default-scheduler", "gpu-scheduler"))
    share_node(api, "n1")
    wait_for(lambda: extender.cache.counts[0] == 1)
    mem_pod(api, "p", 4)
    pod = api.pods.change("default", "p", lambda pod: pod["spec"].update({"schedulerName": "gpu-scheduler"}))
    other = mem_pod(api, "q", 4)
    api.pods.change("default", "q", lambda pod: pod["spec"].update({"schedulerName": "batch"}))
    client = Client(extender.http.port)
    assert client.bind(pod, "n1") == ""
    assert client.bind(other, "n1") == ('pod default/q: its schedulerName is "batch", not one of this extender\'s '
                                        "(default-scheduler, gpu-scheduler); not bound")


def test_the_lock_map_holds_no_node_that_does_not_exist(api: FakeApiServer, client: Client,
                                                        extender: Running) -> None:
    pod = mem_pod(api, "p", 4)
    for i in range(200):
        assert client.bind(pod, f"ghost-{i}").startswith(f"node ghost-{i}: not a node")
    assert extender.binder.locked_nodes == 0


def test_a_pod_bound_to_two_nodes_at_once_is_charged_to_one(api: FakeApiServer, client: Client,
                                                            extender: Running) -> None:
    """1,000 trials: each pod asks a whole GPU and is bound to two nodes at the same moment. Right after
    the binds answer, the node it went to has no room for another such pod, and the other node is
    untouched: no GPU is ever promised twice."""
    trials = 1000
    for i in range(trials):
        share_node(api, f"a{i}", gpus=1, units=16)
        share_node(api, f"b{i}", gpus=1, units=16)
    pods = [mem_pod(api, f"p{i}", 16) for i in range(trials)]
    probe = mem_pod(api, "probe", 16)
    wait_for(lambda: extender.cache.counts[0] == 2 * trials)

    def trial(i: int) -> str:
        with ThreadPoolExecutor(max_workers=2) as pair:
            errors = list(pair.map(lambda node: client.bind(pods[i], node), (f"a{i}", f"b{i}")))
        if errors.count("") != 1:
            return f"p{i}: {errors}"
        bound, other = (f"a{i}", f"b{i}") if errors[0] == "" else (f"b{i}", f"a{i}")
        answer = client.filter(probe, [bound, other])
        if answer["NodeNames"] != [other]:
            return f"p{i} bound to {bound}: a second whole-GPU pod still fits on {answer['NodeNames']}"
        return ""

    with ThreadPoolExecutor(max_workers=8) as pool:
        problems = [p for p in pool.map(trial, range(trials)) if p]
    assert problems == []
    on_node = collections.Counter(pod["spec"].get("nodeName") for pod in api.pods.list(None)[0])
    assert on_node[None] == 1 and all(count == 1 for node, count in on_node.items() if node)  # only probe unbound
