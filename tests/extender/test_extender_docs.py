"""The KubeSchedulerConfiguration docs/memory-sharing.md shows is the one the chart renders, and a
scheduler set up from it (its tlsConfig holding the chart's client Secret) filters, prioritizes and
binds through the real extender serving the chart's serving Secret over mutual TLS."""

from __future__ import annotations

import base64
import http.client
import json
import re
import socket
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from labeller.apps.extender.server import PREFIX
from labeller.process.httpserver import server_tls
from tests.builders import PATIENCE_S, wait_for
from tests.deploy import one, render
from tests.extender.conftest import Start, mem_pod, share_node
from tests.fakes.apiserver import FakeApiServer

PAGE = Path(__file__).resolve().parents[2] / "docs" / "memory-sharing.md"
NAME = "gpu-labeller-scheduler-extender"
Obj = dict[str, Any]


def documented_configs() -> list[Obj]:
    blocks = re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), re.S)
    return [yaml.safe_load(block) for block in blocks if "kind: KubeSchedulerConfiguration" in block]


def chart_config(objects: list[Obj]) -> Obj:
    config: Obj = yaml.safe_load(one(objects, "ConfigMap", f"{NAME}-scheduler-config")["data"]["scheduler-config.yaml"])
    return config


def test_the_docs_show_the_configuration_the_chart_renders() -> None:
    documented = documented_configs()
    assert documented, f"no KubeSchedulerConfiguration in {PAGE.name}"
    for config in documented:
        rendered = chart_config(render({"extender": {"enabled": True, "schedulerConfig": {
            "apiVersion": config["apiVersion"]}}}))
        assert config == rendered
    # the chart's default apiVersion is among them
    assert chart_config(render({"extender": {"enabled": True}}))["apiVersion"] in {c["apiVersion"] for c in documented}


class SchedulerConnection(http.client.HTTPSConnection):
    """The kube-scheduler's extender client as tlsConfig sets it up: it dials ``address`` and checks the
    extender's certificate against ``tlsConfig.serverName``, presenting its own."""

    def __init__(self, address: tuple[str, int], tls_config: Obj, files: dict[str, Path]) -> None:
        super().__init__(tls_config["serverName"], address[1], timeout=PATIENCE_S)
        self.address = address
        self.tls = ssl.create_default_context(cafile=str(files[tls_config["caFile"]]))
        self.tls.load_cert_chain(str(files[tls_config["certFile"]]), str(files[tls_config["keyFile"]]))

    def connect(self) -> None:
        self.sock = self.tls.wrap_socket(socket.create_connection(self.address, PATIENCE_S), server_hostname=self.host)

    def post(self, path: str, body: Obj) -> Any:
        self.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        answer = self.getresponse()
        assert answer.status == 200, (path, answer.status)
        return json.loads(answer.read())


def secret_files(objects: list[Obj], name: str, directory: Path) -> dict[str, Path]:
    """The Secret's keys written as files under ``directory``: key -> file."""
    directory.mkdir()
    files = {}
    for key, value in one(objects, "Secret", name)["data"].items():
        files[key] = directory / key
        files[key].write_bytes(base64.b64decode(value))
    return files


def test_a_scheduler_configured_as_documented_places_and_binds_through_the_extender(
        api: FakeApiServer, start_extender: Start, tmp_path: Path) -> None:
    (config,) = [c for c in documented_configs() if c["apiVersion"].endswith("/v1")]
    objects = render({"extender": {"enabled": True}})
    serving = secret_files(objects, f"{NAME}-tls", tmp_path / "serving")
    (extender_config,) = config["extenders"]
    # What the docs say to do: the client Secret's files in the scheduler's certDir.
    cert_dir = Path(extender_config["tlsConfig"]["caFile"]).parent
    client = {str(cert_dir / key): path for key, path in secret_files(objects, f"{NAME}-scheduler-client",
                                                                      tmp_path / "client").items()}
    url = urlsplit(extender_config["urlPrefix"])
    assert extender_config["enableHTTPS"] is True and url.scheme == "https"
    assert url.hostname == extender_config["tlsConfig"]["serverName"] == f"{NAME}.gpu-labeller.svc"
    deployment = one(objects, "Deployment", NAME)["spec"]["template"]["spec"]["containers"][0]
    assert url.port == next(p["containerPort"] for p in deployment["ports"] if p["name"] == "https")
    assert url.path == PREFIX
    assert float(extender_config["httpTimeout"].rstrip("s")) > 4  # above the default --bind-wait

    extender = start_extender(tls=server_tls(str(serving["tls.crt"]), str(serving["tls.key"]), str(serving["ca.crt"])))
    share_node(api, "n1")
    share_node(api, "n2")
    wait_for(lambda: extender.cache.counts[0] == 2)
    pod = mem_pod(api, "web", 12)
    scheduler = SchedulerConnection(("127.0.0.1", extender.http.port), extender_config["tlsConfig"], client)
    try:
        def verb(name: str) -> str:
            return f"{url.path}/{name}"
        assert extender_config["nodeCacheCapable"] is True  # node names, not whole nodes
        filtered = scheduler.post(verb(extender_config["filterVerb"]), {"Pod": pod, "NodeNames": ["n1", "n2"]})
        assert filtered["NodeNames"] == ["n1", "n2"] and not filtered.get("Error")
        scores = scheduler.post(verb(extender_config["prioritizeVerb"]), {"Pod": pod, "NodeNames": ["n1", "n2"]})
        assert {entry["Host"] for entry in scores} == {"n1", "n2"}
        metadata = pod["metadata"]
        bound = scheduler.post(verb(extender_config["bindVerb"]), {
            "PodName": metadata["name"], "PodNamespace": metadata["namespace"], "PodUID": metadata["uid"],
            "Node": "n1"})
        assert bound == {"Error": ""}
    finally:
        scheduler.close()
    assert api.pod("web")["spec"]["nodeName"] == "n1"
    # managedResources sends only gpu-mem pods; the extender binds no other.
    assert extender_config["managedResources"] == [{"name": "aliyun.com/gpu-mem", "ignoredByScheduler": False}]
    assert extender_config["ignorable"] is False
