"""The layers hold. Each module's tier is the sub-package it lives in (``labeller/<tier>/...``), from
the bottom: base plumbing, the model, the vendors (``vendors/``), the host (probing it, and the tools
that read its labels), the cluster layer, the process layer (one loop), the applications
(``labeller/apps/<process>/``: daemon, device plugin, DRA plugin, extender, MPS supervisor; never one
another), and the command line on top (``labeller/cli/``: every command, each process's too). A module
imports its own tier and those below, never one above. Also: one adapter talks to the API, only the
two kubelet plugins speak gRPC, only the command line imports click, and nothing on a real node imports a simulation.

Imports are read from the source (function-level and TYPE_CHECKING imports included), and so are
the modules named in strings for ``importlib`` (the lazy command table), so a lazy import cannot
hide a dependency."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The tiers, from the bottom, as the sub-packages of labeller/ name them (vendors/ is tier 2).
TIERS = ("base", "model", "vendors", "host", "cluster", "process", "apps", "cli")
TIER = {name: number for number, name in enumerate(TIERS)}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def imported_names(node: ast.AST) -> set[str]:
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        return {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    return set()


# A string that names a module (``labeller.cli.commands.run``) or a module's attribute (``...:run``): imported
# by name, with importlib.
MODULE_STRING = re.compile(r"(?:labeller|vendors)(?:\.\w+)+(?::\w+)?")


def named_in_strings(tree: ast.AST) -> set[str]:
    return {node.value.split(":")[0] for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_STRING.fullmatch(node.value)}


def sources() -> list[Path]:
    return [path for path in sorted([*ROOT.glob("labeller/**/*.py"), *ROOT.glob("vendors/**/*.py")])
            if not str(path.relative_to(ROOT)).startswith(GENERATED)]


GENERATED = ("labeller/apps/plugin/api/", "labeller/apps/draplugin/api/")  # gRPC code protoc wrote


@cache
def modules() -> dict[str, set[str]]:
    """Every module of the product -> the project and third-party modules it imports."""
    found = {}
    for path in sources():
        tree = ast.parse(path.read_text())
        found[module_name(path)] = ({name for node in ast.walk(tree) for name in imported_names(node)}
                                    | named_in_strings(tree))
    return found


def _run_on_import(statements: list[ast.stmt]) -> set[str]:
    """The imports among ``statements`` that run with them: not in a function, nor under TYPE_CHECKING."""
    found: set[str] = set()
    for statement in statements:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(statement, ast.If) and ast.unparse(statement.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            found |= _run_on_import(statement.orelse)
            continue
        found |= imported_names(statement)
        for field in ("body", "orelse", "finalbody", "handlers"):
            found |= _run_on_import(getattr(statement, field, []))
    return found


@cache
def eager_modules() -> dict[str, set[str]]:
    """Every module of the product -> the modules importing it imports (its module-level imports)."""
    return {module_name(path): _run_on_import(ast.parse(path.read_text()).body) for path in sources()}


def ours(imports: set[str]) -> set[str]:
    """The project modules among ``imports`` (a ``from package import module`` counts as the module)."""
    names = set(modules())
    return {name for name in imports if name in names}


def test_every_tier_holds_modules() -> None:
    assert all(in_tier(name) for name in TIERS)
    assert {"labeller.model.inventory", "labeller.model.config", "labeller.model.offer"} <= in_tier("model")


def test_the_inventory_sits_at_the_bottom() -> None:
    assert ours(modules()["labeller.model.inventory"]) <= {"labeller.base.errors"}




def in_tier(name: str) -> set[str]:
    return {module for module in modules() if tier(module) == TIER[name]}


def process_of(module: str) -> str | None:
    """The application package ``module`` belongs to (``labeller.apps.daemon.run`` -> ``labeller.apps.daemon``)."""
    parts = module.split(".")
    return ".".join(parts[:3]) if parts[:2] == ["labeller", "apps"] and len(parts) >= 3 else None


def tier(module: str) -> int:
    """The tier ``module``'s path names."""
    parts = module.split(".")
    if parts == ["labeller"]:
        return TIER["base"]
    if parts[0] == "vendors":
        return TIER["vendors"]
    if len(parts) < 2 or parts[1] not in TIER or parts[1] == "vendors":
        raise AssertionError(f"{module}: not in a tier's sub-package of labeller/ ({', '.join(TIERS)})")
    return TIER[parts[1]]


def test_every_module_has_its_tier() -> None:
    assert {module: tier(module) for module in modules()}


def test_no_module_imports_one_above_its_tier() -> None:
    """Lazy imports count: an import inside a function, under TYPE_CHECKING, or by name through
    importlib (the root's lazy command table names each process's command module)."""
    above = {module: sorted(i for i in ours(imports) if tier(i) > tier(module))
             for module, imports in modules().items()}
    assert {module: found for module, found in above.items() if found} == {}


def test_the_lazy_command_table_is_seen() -> None:
    lazy = {"labeller.cli.commands.run", "labeller.cli.commands.device_plugin", "labeller.cli.commands.selectors"}
    assert lazy <= modules()["labeller.cli.root"]


def test_only_the_command_line_imports_click() -> None:
    users = {module for module, imports in modules().items() if any(i.split(".")[0] == "click" for i in imports)}
    assert users and all(tier(module) == 7 for module in users), sorted(m for m in users if tier(m) != 7)


def precise_imports(path: Path) -> set[str]:
    """The project modules ``path`` imports, where ``from package import module`` counts as the module
    alone (importing the package's ``__init__`` first is Python's doing, not a dependency)."""
    names = set(modules())
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            children = {f"{node.module}.{alias.name}" for alias in node.names} & names
            found |= children if len(children) == len(node.names) else {node.module, *children}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return (found | named_in_strings(tree)) & names


def test_the_whole_house_has_no_import_cycle() -> None:
    """Function-level, TYPE_CHECKING and importlib imports count, as everywhere here."""
    graph = {module_name(path): precise_imports(path) - {module_name(path)} for path in sources()}
    assert cycle(graph) == []


def test_the_model_imports_only_the_model() -> None:
    model, base = in_tier("model"), in_tier("base")
    assert {module: sorted(ours(modules()[module]) - model - base) for module in model
            if ours(modules()[module]) - model - base} == {}


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle in ``graph`` (module -> the modules it imports), as the path that closes it; [] when none."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str]:
        if module in path:
            return [*path[path.index(module):], module]
        if module in done:
            return []
        for imported in sorted(graph[module]):
            found = visit(imported, [*path, module])
            if found:
                return found
        done.add(module)
        return []

    return next((found for module in sorted(graph) if (found := visit(module, []))), [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_the_model_has_no_import_cycle() -> None:
    """TYPE_CHECKING and function-level imports count: a cycle hidden behind them is still one
    module that cannot be read, or changed, without the other."""
    model = in_tier("model")
    graph = {module: ours(modules()[module]) & model for module in model}
    assert cycle(graph) == []


def test_vendors_import_only_the_model_and_vendors() -> None:
    allowed = in_tier("model") | in_tier("base") | in_tier("vendors")
    wrong = {module: sorted(ours(imports) - allowed)
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
    assert users == {"labeller.cluster.kube"}


def test_no_process_package_imports_another() -> None:
    """The daemon, the device plugin, the extender and the MPS supervisor share the layers below
    them (the cluster layer among them), never each other's modules, not even inside a function."""
    assert {process_of(m) for m in modules()} >= {f"labeller.apps.{name}" for name in
                                                  ("daemon", "plugin", "draplugin", "extender", "mps")}
    sideways = {module: sorted(i for i in ours(imports) if process_of(i) not in (None, process_of(module)))
                for module, imports in modules().items() if process_of(module) is not None}
    assert {module: found for module, found in sideways.items() if found} == {}


def test_nothing_outside_the_daemon_imports_it() -> None:
    importers = {module for module, imports in modules().items()
                 if process_of(module) != "labeller.apps.daemon"
                 and any(process_of(i) == "labeller.apps.daemon" for i in imports)}
    importers.discard("labeller.cli.root")  # the root's lazy command table names ``run``
    importers.discard("labeller.cli.commands.run")  # the ``run`` command serves the daemon
    importers.discard("labeller.cli.commands.cleanup")  # ``cleanup`` writes the daemon's empty set with its Node sink
    assert importers == set()


def test_the_cluster_layer_imports_no_process_and_no_command_line() -> None:
    cluster = {m: imports for m, imports in modules().items() if m.startswith("labeller.cluster")}
    assert {"labeller.cluster.kube", "labeller.cluster.connect", "labeller.cluster.reflector"} <= set(cluster)
    for module, imports in cluster.items():
        assert not {i for i in imports if process_of(i) is not None or i.split(".")[0] in ("click", "grpc")}, module
        assert not {i for i in ours(imports)
                    if i in ("labeller.cli.root", "labeller.cli.commands.options", "labeller.process.follow")}, module


def test_only_the_plugins_speak_grpc() -> None:
    """The device plugin and the DRA plugin (each its own generated code: no process imports another).
    ``grpc_tools`` (protoc, for ``labeller.base.grpcgen``, a developer's tool) is no gRPC at run time."""
    users = {module for module, imports in modules().items()
             if any(i.split(".")[0] == "grpc"
                    or i.startswith(("labeller.apps.plugin.api", "labeller.apps.draplugin.api")) for i in imports)}
    assert users and all(module.startswith(("labeller.apps.plugin.", "labeller.apps.draplugin.")) for module in users)
    assert {m for m in users if m.startswith("labeller.apps.draplugin.")}, "the DRA plugin serves gRPC"


def vendor_packages() -> set[str]:
    return {m for m in modules() if m.count(".") == 1 and m.startswith("vendors.") and
            (ROOT / "vendors" / m.split(".")[1] / "__init__.py").exists()}


def test_nothing_on_a_real_node_imports_a_simulation() -> None:
    simulations = {m for m in modules() if m.endswith(".simulate") or m == "vendors.sim_pci"}
    importers = {module for module, imports in modules().items() if ours(imports) & simulations}
    # each vendor package hands its simulator to the profile replayer (Discovery.simulator);
    # labeller.host.machine imports the replayer only for --simulate; match (its default targets) and
    # completion (--simulate names) list the built-in profiles
    assert importers <= simulations | vendor_packages() | {"labeller.host.machine", "labeller.cli.commands.dryrun",
                                                           "labeller.cli.commands.selectors",
                                                           "labeller.cli.commands.completion"}
    assert {p for p in vendor_packages() if ours(eager_modules()[p]) & simulations} == set()


def test_the_vendors_plugin_parts_load_on_first_use() -> None:
    """Allocate, health checks and CDI specs are the device plugin's alone: a vendor package imports
    them in the function it hands over (Devices.plugin_parts), so importing it never loads them."""
    parts = {f"{p}.{name}" for p in vendor_packages() for name in ("allocate", "health", "cdi")}
    assert parts <= set(modules())
    eager = {module for module, imports in eager_modules().items() if ours(imports) & parts}
    assert eager <= parts  # nvidia.cdi builds on nvidia.allocate: both are loaded together anyway
    lazy = {module for module, imports in modules().items() if ours(imports) & parts} - parts
    assert lazy == vendor_packages()


def test_named_configs_read_files_with_the_model_only() -> None:
    """Choosing a named config is part of the dry run: no Kubernetes, no threads, no click."""
    assert ours(modules()["labeller.model.namedconfigs"]) <= in_tier("model")
    assert not {i for i in modules()["labeller.model.namedconfigs"]
                if i.split(".")[0] in ("threading", "click", "kubernetes")}


def test_the_gpushare_contract_and_placement_rules_are_pure() -> None:
    """The annotations' meaning and where memory fits are shared by the extender and the plugin:
    plain data, no client, no I/O; the cache adds only a lock (and its log)."""
    # ``from labeller.model import gpushare`` names the package too
    packages = {"labeller", "labeller.base", "labeller.model", "labeller.apps", "labeller.apps.extender"}
    assert ours(modules()["labeller.model.quantity"]) == set()
    assert ours(modules()["labeller.model.gpushare"]) - packages <= {"labeller.model.quantity"}
    assert ours(modules()["labeller.apps.extender.placement"]) - packages <= {"labeller.model.gpushare"}
    assert ours(modules()["labeller.apps.extender.cache"]) - packages <= {
        "labeller.model.gpushare", "labeller.model.quantity", "labeller.apps.extender.placement", "labeller.base.log"}
    for module in ("labeller.model.quantity", "labeller.model.gpushare", "labeller.apps.extender.placement",
                   "labeller.apps.extender.cache"):
        assert not {i for i in modules()[module]
                    if i.split(".")[0] in ("kubernetes", "urllib3", "click", "grpc")}, module


@pytest.mark.parametrize("module", ["labeller.host.explain", "labeller.host.selectors", "labeller.host.snippets",
                                    "labeller.host.fleet", "labeller.cli.commands.completion"])
def test_the_selector_tools_stay_off_the_api(module: str) -> None:
    """explain, match on profiles and the snippets work without a cluster: their modules import
    neither the adapter nor the daemon (completion reaches the adapter only inside the function
    that completes node names, guarded)."""
    above = {m for m in ours(modules()[module]) if m.startswith(("labeller.apps.daemon", "labeller.apps.plugin"))}
    assert above == set()
    clients = {i for i in modules()[module] if i.split(".")[0] in ("kubernetes", "grpc", "urllib3")}
    assert clients == set()
    if module != "labeller.cli.commands.completion":
        assert "labeller.cluster.kube" not in modules()[module]


def test_vendors_is_marked_as_the_projects_own_code() -> None:
    """GitHub's linguist takes a top-level ``vendors/`` for third-party code and hides it from diffs
    and language statistics; ``.gitattributes`` says it is not."""
    rules = [line.split() for line in (ROOT / ".gitattributes").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert ["vendors/**", "-linguist-vendored"] in rules
