"""The suite's two tiers, told apart by reading the code: a test is ``integration`` when what it runs can
start a process, open a socket or wait on real time, and ``unit`` otherwise.

**Classifying** (at collection, nothing to mark by hand). For each test, its function, every fixture it
uses (pytest's own closure of the fixture names) and everything those reach are read with ``ast``: the
functions and classes they name, in this repository's packages (``tests``, ``labeller``, ``vendors``),
followed name by name through imports, lazy ones included. A class counts with all its methods. A test
that reaches one of the ``LIVE`` names below (``subprocess``, ``socket.socket``, ``grpc``,
``threading.Thread``, ``time.sleep``, ...) is ``integration``, with the chain that led there as its
reason. Names reached only through data (a module-level table, such as the vendor registry) are not
followed: calling through a table is not seen, which the guard below makes safe.

**Enforcing** (``Guard``). While a unit test runs, the operations themselves are trip wires: starting
a process, binding, connecting or resolving a socket, a gRPC server or channel, starting a thread, and
sleeping or waiting (``time.sleep``, ``Condition``/``Event`` waits) longer than ``UNIT_WAIT_S`` in all.
One of them fails the test with what it did and where, so a test the reading missed never hides in the
fast tier. ``LIVE`` is then where the missing name goes.
"""

from __future__ import annotations

import ast
import socket
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tests", "labeller", "vendors")  # the code read; anything else (the stdlib, libraries) is a leaf

PROCESS, SOCKET, WAIT, THREAD = "starts a process", "opens a socket", "waits on real time", "starts a thread"

LIVE = {
    # dotted name (or prefix) -> what reaching it means
    "subprocess": PROCESS, "multiprocessing": PROCESS, "pty": PROCESS,
    **{f"os.{name}": PROCESS for name in ("fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp",
                                           "execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp",
                                           "spawnv", "spawnve", "spawnl", "spawnlp")},
    **{f"socket.{name}": SOCKET for name in ("socket", "create_connection", "create_server", "getaddrinfo",
                                              "fromfd")},
    "socketserver": SOCKET, "http.server": SOCKET, "http.client": SOCKET, "urllib.request": SOCKET,
    "ssl": SOCKET, "grpc": SOCKET, "kubernetes.client": SOCKET, "kubernetes.watch": SOCKET,
    "prometheus_client.start_http_server": SOCKET, "requests": SOCKET, "urllib3": SOCKET,
    "threading.Thread": THREAD, "threading.Timer": THREAD, "concurrent.futures": THREAD,
    "time.sleep": WAIT, "asyncio": WAIT, "select": WAIT, "selectors": WAIT, "signal.pause": WAIT,
    "signal.sigwait": WAIT,
}
HARMLESS = {
    # names under a LIVE prefix that only name a type, a constant or an error
    "subprocess.CompletedProcess", "subprocess.PIPE", "subprocess.DEVNULL", "subprocess.STDOUT",
    "subprocess.TimeoutExpired", "subprocess.CalledProcessError", "subprocess.SubprocessError",
    "grpc.StatusCode", "grpc.RpcError", "grpc.ServicerContext", "ssl.SSLError", "urllib3.exceptions",
    "requests.exceptions", "kubernetes.client.exceptions", "kubernetes.client.rest.ApiException",
}


def live(dotted: str) -> str | None:
    """What reaching ``dotted`` does, if it is (under) a LIVE name."""
    if dotted in HARMLESS or any(dotted.startswith(name + ".") for name in HARMLESS):
        return None
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        if (what := LIVE.get(".".join(parts[:end]))) is not None:
            return f"{what} ({dotted})"
    return None


# --- reading the code -------------------------------------------------------------------------------

@dataclass
class Symbol:
    """A module-level function or class: what it names directly."""

    name: str
    live: str | None = None  # the first LIVE name it uses itself
    names: set[str] = field(default_factory=set)  # dotted names it uses (resolved through its module's imports)


class Reader:
    """The symbols of this repository's modules, read on demand (only what the tests reach)."""

    def __init__(self, root: Path = ROOT) -> None:
        self.root = root
        self.symbols: dict[str, Symbol] = {}
        self.imports: dict[str, dict[str, str]] = {}  # module -> its local names of what it imports
        self._read: set[str] = set()
        self._paths: dict[str, Path | None] = {}
        self._found: dict[str, Symbol | None] = {}

    def module_path(self, module: str) -> Path | None:
        if module not in self._paths:
            self._paths[module] = None
            if module.split(".")[0] in PACKAGES:
                base = self.root.joinpath(*module.split("."))
                self._paths[module] = next((path for path in (base.with_suffix(".py"), base / "__init__.py")
                                            if path.is_file()), None)
        return self._paths[module]

    def symbol(self, dotted: str) -> Symbol | None:
        """The function or class ``dotted`` names (``pkg.mod.func``, ``pkg.mod.Class.method``), if it is ours."""
        if dotted not in self._found:
            self._found[dotted] = self._symbol(dotted)
        return self._found[dotted]

    def _symbol(self, dotted: str) -> Symbol | None:
        parts = dotted.split(".")
        for end in range(len(parts) - 1, 0, -1):
            module = ".".join(parts[:end])
            if self.module_path(module) is None:
                continue
            self._read_module(module)
            found = self.symbols.get(f"{module}.{parts[end]}")
            if found is not None:
                return found
            # a name the module imported from elsewhere (a re-export): follow it
            return self._reexport(module, parts[end], parts[end + 1:])
        return None

    def _reexport(self, module: str, name: str, rest: list[str]) -> Symbol | None:
        target = self.imports.get(module, {}).get(name)
        if target is None or target == f"{module}.{name}":
            return None
        return self.symbol(".".join([target, *rest]))

    def _read_module(self, module: str) -> None:
        if module in self._read:
            return
        self._read.add(module)
        path = self.module_path(module)
        assert path is not None
        tree = ast.parse(path.read_text(), str(path))
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        imports = self.imports[module] = _imports(tree, package)
        defined = {node.name for node in tree.body
                   if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                symbol = Symbol(f"{module}.{node.name}")
                for dotted in _names(node, module, imports, defined):
                    if symbol.live is None and (what := live(dotted)) is not None:
                        symbol.live = what
                    symbol.names.add(dotted)
                self.symbols[symbol.name] = symbol


def _imports(tree: ast.Module, package: str) -> dict[str, str]:
    """Local name -> dotted name, for every import in the module (function-level ones too)."""
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    found[alias.asname] = alias.name
                else:
                    head = alias.name.split(".")[0]
                    found[head] = head
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for alias in node.names:
                found[alias.asname or alias.name] = f"{base}.{alias.name}"
    return found


def _names(node: ast.AST, module: str, imports: dict[str, str], defined: set[str]) -> Iterator[str]:
    """The dotted names ``node`` uses: ``subprocess.run``, ``labeller.host.machine.open_host``, ``tests.x.helper``.
    Annotations are left out (a type named in a signature runs nothing)."""
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, ast.Attribute | ast.Name):
            chain: list[str] = []
            head: ast.AST = current
            while isinstance(head, ast.Attribute):
                chain.append(head.attr)
                head = head.value
            if not isinstance(head, ast.Name):
                stack.append(head)  # a call's or a subscript's value: read on
                continue
            base = imports.get(head.id) or (f"{module}.{head.id}" if head.id in defined else None)
            if base is not None:
                yield ".".join([base, *reversed(chain)])
            continue
        for name, value in ast.iter_fields(current):
            if name in ("annotation", "returns"):
                continue
            if isinstance(value, list):
                stack.extend(item for item in value if isinstance(item, ast.AST))
            elif isinstance(value, ast.AST):
                stack.append(value)


class Classifier:
    """Why a function (with what it reaches) is integration, or None: memoised over the whole session."""

    def __init__(self, reader: Reader | None = None) -> None:
        self.reader = reader or Reader()
        self._why: dict[str, list[str] | None] = {}

    def why(self, dotted: str) -> list[str] | None:
        """The chain from ``dotted`` to the first LIVE name it reaches (breadth first), or None."""
        if dotted in self._why:
            return self._why[dotted]
        start = self.reader.symbol(dotted)
        if start is None:
            return None
        came_from: dict[str, str | None] = {start.name: None}
        queue = deque([start])
        found: list[str] | None = None
        while queue:
            symbol = queue.popleft()
            known = self._why.get(symbol.name, ...)
            if known is None and symbol is not start:
                continue  # already known to reach nothing
            if symbol.live is not None or isinstance(known, list):
                tail = [symbol.live] if symbol.live is not None else known[1:]  # type: ignore[index]
                path = [symbol.name]
                while (previous := came_from[path[-1]]) is not None:
                    path.append(previous)
                found = [*reversed(path), *tail]
                break
            for dotted_name in sorted(symbol.names):
                target = self.reader.symbol(dotted_name)
                if target is not None and target.name not in came_from:
                    came_from[target.name] = symbol.name
                    queue.append(target)
        self._why[dotted] = found
        if found is None:
            for name in came_from:  # nothing reachable from here is live, so nothing reachable from them is
                self._why[name] = None
        return found


def defined_name(function: Callable[..., Any]) -> str | None:
    """The dotted name of the module-level function or class that holds ``function`` (a test method: its class)."""
    module = getattr(function, "__module__", None)
    qualname = getattr(function, "__qualname__", None)
    if not module or not qualname:
        return None
    return f"{module}.{qualname.split('.')[0]}"


def reason(classifier: Classifier, functions: Iterable[Callable[..., Any]]) -> str | None:
    """The first chain, over the test's function and its fixtures', that reaches a LIVE name."""
    for function in functions:
        name = defined_name(function)
        if name is not None and (chain := classifier.why(name)) is not None:
            return " -> ".join(chain)
    return None


# --- the guard ---------------------------------------------------------------------------------------

UNIT_WAIT_S = 0.1
"""What a unit test may wait in all (sleeps and timed waits, as asked for, summed): enough for a poll
that is met at once or a zero-length sleep, far below any wait for a thread, a process or a clock."""

_AUDITED = {
    "subprocess.Popen": PROCESS, "os.fork": PROCESS, "os.forkpty": PROCESS, "os.posix_spawn": PROCESS,
    "os.exec": PROCESS, "os.system": PROCESS, "os.spawn": PROCESS,
    "socket.bind": SOCKET, "socket.connect": SOCKET, "socket.getaddrinfo": SOCKET, "socket.sendto": SOCKET,
    "socket.sendmsg": SOCKET, "socket.gethostbyname": SOCKET, "socket.gethostbyaddr": SOCKET,
}


class Tripped(BaseException):
    """Raised where a unit test did what a unit test must not: a BaseException, so that a product's
    ``except Exception`` cannot turn it into an error path the test then passes on."""


class Guard:
    """Trip wires for the unit tier: armed for one test at a time, on the thread that runs it."""

    def __init__(self) -> None:
        self._armed_on: int | None = None  # the thread the unit test runs on, while armed
        self._waited = 0.0
        self.tripped: list[str] = []
        sys.addaudithook(self._audit)  # audit hooks cannot be removed: it does nothing while disarmed
        self._patch(time, "sleep", lambda original: self._sleep_wrapper(original))
        self._patch(threading.Condition, "wait", lambda original: self._wait_wrapper(original))
        self._patch(threading.Thread, "start", lambda original: self._start_wrapper(original))
        self._grpc_patched = False

    @staticmethod
    def _patch(owner: Any, name: str, wrap: Callable[[Any], Any]) -> None:
        setattr(owner, name, wrap(getattr(owner, name)))

    @contextmanager
    def armed(self) -> Iterator[list[str]]:
        """Armed on this thread until the block ends; yields the list of what was tripped (one at most:
        the guard disarms at the first, so that what the failure sets off is not reported too).
        Re-entrant: an inner block has its own list and leaves the outer one as it was."""
        self._patch_grpc()
        outer = self._armed_on, self._waited, self.tripped
        self._armed_on, self._waited, self.tripped = threading.get_ident(), 0.0, []
        try:
            yield self.tripped
        finally:
            self._armed_on, self._waited, self.tripped = outer

    def _here(self) -> bool:
        return self._armed_on is not None and threading.get_ident() == self._armed_on

    def _trip(self, what: str) -> None:
        if _importing():
            return  # a module's first import (urllib3 binds a socket to probe for IPv6): not the test's doing
        self._armed_on = None  # what the failure itself does (formatting, cleanup) is not checked again
        where = _caller()
        self.tripped.append(f"{what}, at {where}" if where else what)
        raise Tripped(what)

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if not self._here():
            return
        what = _AUDITED.get(event)
        if what is not None:
            self._trip(f"{what} ({event} {_first(args)})")

    def _sleep_wrapper(self, original: Callable[[float], None]) -> Callable[[float], None]:
        def sleep(seconds: float) -> None:
            self._count_wait(seconds, "time.sleep")
            original(seconds)
        return sleep

    def _wait_wrapper(self, original: Callable[..., bool]) -> Callable[..., bool]:
        def wait(condition: threading.Condition, timeout: float | None = None) -> bool:
            self._count_wait(timeout, "a Condition/Event wait")
            return original(condition, timeout)
        return wait

    def _start_wrapper(self, original: Callable[[threading.Thread], None]) -> Callable[[threading.Thread], None]:
        def start(thread: threading.Thread) -> None:
            if self._here():
                self._trip(f"{THREAD} ({thread.name})")
            original(thread)
        return start

    def _count_wait(self, seconds: float | None, how: str) -> None:
        if not self._here():
            return
        if seconds is None:
            self._trip(f"{WAIT} ({how} without a timeout)")
        self._waited += max(0.0, seconds or 0.0)
        if self._waited > UNIT_WAIT_S:
            self._trip(f"{WAIT} ({how}: {self._waited:.2f} s in all, more than {UNIT_WAIT_S} s)")

    def _patch_grpc(self) -> None:
        grpc: ModuleType | None = sys.modules.get("grpc")
        if grpc is None or self._grpc_patched:
            return
        self._grpc_patched = True
        for name in ("server", "insecure_channel", "secure_channel"):
            setattr(grpc, name, self._grpc_wrapper(getattr(grpc, name), name))

    def _grpc_wrapper(self, original: Callable[..., Any], name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self._here():
                self._trip(f"{SOCKET} (grpc.{name})")
            return original(*args, **kwargs)
        return call


def explain(tripped: list[str]) -> str:
    return (f"a unit test must not start a process, open a socket or wait on real time; this one {tripped[0]}. "
            "tests/tiers.py read it as a unit test: add the name it reaches to LIVE there, so that it runs "
            "in the integration tier")


def _importing() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _first(args: tuple[Any, ...]) -> str:
    shown = repr(args[1] if args and isinstance(args[0], socket.socket) and len(args) > 1 else
                 (args[0] if args else ""))
    return shown if len(shown) <= 80 else shown[:77] + "..."


def _caller() -> str:
    """The innermost frame of this repository's code (tests, labeller, vendors; not this file) on the stack."""
    here = Path(__file__).resolve()
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename).resolve()
        if path != here and path.is_relative_to(ROOT) and path.relative_to(ROOT).parts[0] in PACKAGES:
            return f"{path.relative_to(ROOT)}:{frame.lineno}"
    return ""


# --- the hooks (tests/conftest.py imports them) -------------------------------------------------------

REASON = pytest.StashKey[str]()  # why a test is integration: the chain to the LIVE name it reaches
GUARD = pytest.StashKey[Guard]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[GUARD] = Guard()


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by the marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test by what it reaches; a plain ``python -m pytest`` keeps the unit tier."""
    classifier = Classifier()
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        fixtures = [definition.func for name in item.fixturenames
                    for definition in item._fixtureinfo.name2fixturedefs.get(name, ())]
        why = reason(classifier, [item.function, *fixtures])
        if why is not None:
            item.stash[REASON] = why
            item.add_marker(pytest.mark.integration)
    if _plain_run(config):
        config.hook.pytest_deselected(items=[item for item in items if REASON in item.stash])
        items[:] = [item for item in items if REASON not in item.stash]


def _plain_run(config: pytest.Config) -> bool:
    """``python -m pytest`` with neither paths nor ``-m``: the unit tier. Naming a file or a test runs what
    it names, both tiers; ``-m integration``, ``-m "not integration"`` and ``-m ""`` (all) select as usual."""
    chose = config.option.markexpr or any(arg.startswith("-m") for arg in config.invocation_params.args)
    return not chose and config.args_source == pytest.Config.ArgsSource.TESTPATHS


def pytest_report_collectionfinish(config: pytest.Config, items: list[pytest.Item]) -> list[str]:
    integration = [item for item in items if REASON in item.stash]
    lines = [f"tiers: {len(items) - len(integration)} unit, {len(integration)} integration tests selected"]
    if config.option.collectonly and config.option.verbose > 0:  # --collect-only -v: why each is integration
        lines += [f"  {item.nodeid}: {item.stash[REASON]}" for item in integration]
    return lines


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    return (yield from _guarded(item))


def _guarded(item: pytest.Item) -> Iterator[None]:
    """A unit test's phase under the guard: what it tripped fails it, naming what it did and where."""
    if REASON in item.stash:
        return (yield)
    with item.config.stash[GUARD].armed() as tripped:
        try:
            outcome = yield
        except BaseException:
            if not tripped:
                raise
            outcome = None  # what it tripped on is the failure, whatever became of the exception
    if tripped:
        pytest.fail(explain(tripped), pytrace=False)
    return outcome
