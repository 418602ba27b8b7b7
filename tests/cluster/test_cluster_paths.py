"""The adapter builds every API path from names it escapes whole, and refuses a name that would
name another path ('/', '.', '..', ''), whatever its caller checked: no request is made."""

from __future__ import annotations

from pathlib import Path

import pytest

from labeller.cluster.kube import InvalidName, Kube, NotFound
from tests.fakes.apiserver import FakeApiServer

PATHS = ["c1/../../../../../../../api/v1/namespaces/default/pods/p1", "..", ".", "", "a/b"]


@pytest.mark.parametrize("name", PATHS)
def test_a_name_that_would_name_another_path_is_refused_without_a_request(api: FakeApiServer, tmp_path: Path,
                                                                          name: str) -> None:
    api.create_node("p1")
    kube = Kube(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    try:
        with pytest.raises(InvalidName, match="cannot be an object's name in an API path"):
            kube.get_resource_claim("default", name)
        with pytest.raises(InvalidName):
            kube.get_resource_claim(name, "c1")
        with pytest.raises(InvalidName):
            kube.get_node(name)
        with pytest.raises(InvalidName):
            kube.delete_resource_slice(name)
        assert api.log.requests == []
    finally:
        kube.close()


def test_a_name_is_sent_as_one_segment(api: FakeApiServer, tmp_path: Path) -> None:
    """'%2F' in a name is the name's, not an escaped '/': it is escaped again, and names no other object."""
    api.create_resource_claim("c1")
    kube = Kube(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    try:
        assert kube.get_resource_claim("default", "c1")["metadata"]["name"] == "c1"
        with pytest.raises(NotFound):
            kube.get_resource_claim("default", "x%2F..%2Fc1")
        assert [r.path for r in api.log.requests][-1].endswith("/resourceclaims/x%252F..%252Fc1")
    finally:
        kube.close()
