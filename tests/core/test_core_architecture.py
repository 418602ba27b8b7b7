"""The layers hold: the model imports nothing above it, vendors import only the model, one adapter
talks to the API, only the plugin speaks gRPC, and nothing on a real node imports a simulation.

Imports are read from the source (function-level and TYPE_CHECKING imports included), so a lazy
import cannot hide a dependency."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = {"labeller.inventory", "labeller.config", "labeller.documents", "labeller.labels", "labeller.offer",
         "labeller.vendor", "labeller.rules", "labeller.gpushare"}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


@cache
def modules() -> dict[str, set[str]]:
    """Every module of the product -> the project and third-party modules it imports."""
    found: dict[str, set[str]] = {}
    for path in sorted([*ROOT.glob("labeller/**/*.py"), *ROOT.glob("vendors/**/*.py")]):
        if "plugin/api/" in str(path.relative_to(ROOT)):
            continue  # generated gRPC code
        imports: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imports.add(node.module)
                imports.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                imports.update(alias.name for alias in node.names)
        found[module_name(path)] = imports
    return found


def ours(imports: set[str]) -> set[str]:
    """The project modules among ``imports`` (a ``from package import module`` counts as the module)."""
    names = set(modules())
    return {name for name in imports if name in names}


def test_every_model_module_exists() -> None:
    assert MODEL <= set(modules())


def test_the_inventory_sits_at_the_bottom() -> None:
    assert ours(modules()["labeller.inventory"]) == set()


@pytest.mark.parametrize("module", sorted(MODEL))
def test_the_model_imports_only_the_model(module: str) -> None:
    assert ours(modules()[module]) - MODEL == set()


def test_vendors_import_only_the_model_and_vendors() -> None:
    wrong = {module: sorted(ours(imports) - MODEL - {m for m in modules() if m.startswith("vendors")})
             for module, imports in modules().items() if module.startswith("vendors")}
    assert {module: found for module, found in wrong.items() if found} == {}


def test_one_vendor_never_imports_another() -> None:
    packages = {m.split(".")[1] for m in modules() if m.count(".") >= 2 and m.startswith("vendors.")}
    assert {"nvidia", "amd"} <= packages
    for module, imports in modules().items():
        own = module.split(".")[1] if module.startswith("vendors.") and module.count(".") >= 1 else None
        others = {f"vendors.{p}" for p in packages if p != own}
        if own in packages:
            assert not {i for i in ours(imports) if i.startswith(tuple(others))}, module


def test_only_the_adapter_imports_the_kubernetes_client() -> None:
    users = {module for module, imports in modules().items()
             if any(i == "kubernetes" or i.startswith(("kubernetes.", "urllib3")) for i in imports)}
    assert users == {"labeller.kube"}


def test_only_the_plugin_speaks_grpc() -> None:
    users = {module for module, imports in modules().items()
             if any(i.startswith(("grpc", "labeller.plugin.api")) for i in imports)}
    assert users and all(module.startswith("labeller.plugin.") for module in users)


def test_nothing_on_a_real_node_imports_a_simulation() -> None:
    simulations = {m for m in modules() if m.endswith(".simulate") or m == "vendors.sim_pci"}
    importers = {module for module, imports in modules().items() if ours(imports) & simulations}
    # the profile replayer imports each vendor's simulator by name; labeller.node imports it only for --simulate;
    # match (its default targets) and completion (--simulate names) list the built-in profiles
    assert importers <= simulations | {"labeller.node", "labeller.cli", "labeller.authoring", "labeller.completion"}


def test_named_configs_read_files_with_the_model_only() -> None:
    """Choosing a named config is part of the dry run: no Kubernetes, no threads, no click."""
    assert ours(modules()["labeller.namedconfigs"]) <= MODEL
    assert not {i for i in modules()["labeller.namedconfigs"]
                if i.split(".")[0] in ("threading", "click", "kubernetes")}


def test_the_gpushare_contract_and_placement_rules_are_pure() -> None:
    """The annotations' meaning and where memory fits are shared by the extender and the plugin:
    plain data, no client, no I/O; the cache adds only a lock."""
    packages = {"labeller", "labeller.extender"}  # ``from labeller import gpushare`` names the package too
    assert ours(modules()["labeller.gpushare"]) == set()
    assert ours(modules()["labeller.extender.placement"]) - packages <= {"labeller.gpushare"}
    assert ours(modules()["labeller.extender.cache"]) - packages <= {"labeller.gpushare", "labeller.extender.placement"}
    for module in ("labeller.gpushare", "labeller.extender.placement", "labeller.extender.cache"):
        assert not {i for i in modules()[module]
                    if i.split(".")[0] in ("kubernetes", "urllib3", "click", "grpc")}, module


@pytest.mark.parametrize("module", ["labeller.explain", "labeller.selectors", "labeller.snippets", "labeller.fleet",
                                    "labeller.completion"])
def test_the_selector_tools_stay_off_the_api(module: str) -> None:
    """explain, match on profiles and the snippets work without a cluster: their modules import
    neither the adapter nor the daemon (completion reaches the adapter only inside the function
    that completes node names, guarded)."""
    above = {m for m in ours(modules()[module]) if m.startswith(("labeller.daemon", "labeller.plugin"))}
    assert above == set()
    clients = {i for i in modules()[module] if i.split(".")[0] in ("kubernetes", "grpc", "urllib3")}
    assert clients == set()
    if module != "labeller.completion":
        assert "labeller.kube" not in modules()[module]
