"""Which allocator answers Allocate for a resource: the vendor's (through the sharing rules), or,
for GPUs shared by memory (gpushare), the one that reads the pod the extender placed.

The pod matcher of memory sharing is made the first time such a resource is served: only then
does the plugin load the Kubernetes client and read this node's pods.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from labeller.model.config import Config
from labeller.model.gpushare import RESOURCE_COUNT
from labeller.model.offer import Resource
from labeller.apps.plugin.allocate import Allocator, ResourceAllocator
from labeller.model.vendor import Vendor
from labeller.model.vendor.plugin import Allocate
from labeller.base.log import get_logger

if TYPE_CHECKING:
    from labeller.apps.plugin.gpushare_allocate import PodApi, PodMatcher

log = get_logger(__name__)


class Allocators:
    """Makes each served resource's allocator. ``node_name`` and ``pod_api`` (a factory of the API
    client) are what memory sharing needs to read this node's pods."""

    def __init__(self, vendors: Mapping[str, Vendor], node_name: str,
                 pod_api: Callable[[], PodApi] | None) -> None:
        self.vendors, self.node_name, self.pod_api = vendors, node_name, pod_api
        self._pods: PodMatcher | None = None

    def of(self, resource: Resource, config: Config, host_root: Path) -> ResourceAllocator:
        memory = config.sharing.memory
        if resource.strategy != "memory" or memory is None:
            return Allocator(resource, config.sharing, self._vendor_allocate(resource, config, host_root))
        from labeller.apps.plugin import gpushare_allocate as by_memory  # loaded only where GPUs are shared by memory

        if resource.name == RESOURCE_COUNT:
            return by_memory.CountAllocator(resource)
        return by_memory.MemoryAllocator(resource, self._vendor_allocate(resource, config, host_root),
                                         self._pod_matcher(), memory.unit)

    def _vendor_allocate(self, resource: Resource, config: Config, host_root: Path) -> Allocate:
        parts = self.vendors[resource.vendor].devices.plugin_parts()  # its first call imports the allocation module
        return parts.allocator(config, host_root, resource)

    def _pod_matcher(self) -> PodMatcher:
        """The one matcher of pods to Allocate calls, made when memory sharing is first served."""
        if self._pods is None:
            from labeller.apps.plugin.gpushare_allocate import PodMatcher

            node, factory, problem, api = self.node_name, self.pod_api, None, None
            if not node:
                problem = "this node's name is unknown: give --node-name NAME or set NODE_NAME"
            elif factory is None:
                problem = "no Kubernetes API access configured"
            else:
                try:
                    api = factory()
                except Exception as exc:  # noqa: BLE001 - every Allocate then says why
                    problem = str(exc)
            if problem is not None:
                log.error("GPUs are shared by memory but this node's pods cannot be read; every gpu-mem "
                          "allocation will fail", reason="no-pod-access", node=node, error=problem)
            self._pods = PodMatcher(api, node, problem=problem)
        return self._pods
