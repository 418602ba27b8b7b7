"""The suite's tiers (tests/tiers.py): what the reading calls integration, what the guard fails in the unit
tier, and what a plain ``python -m pytest`` runs, on a small project made for each test."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests import tiers
from tests.builders import PATIENCE_S

HERE = Path(__file__).resolve().parent


def project(root: Path, files: dict[str, str]) -> Path:
    """A tree of ``tests``/``labeller`` packages under ``root``: each file, and an ``__init__.py`` per folder."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        for folder in path.relative_to(root).parents:
            if folder != Path("."):
                (root / folder / "__init__.py").touch()
    return root


def why(root: Path, dotted: str) -> list[str] | None:
    return tiers.Classifier(tiers.Reader(root)).why(dotted)


# --- reading -------------------------------------------------------------------------------------------

PRODUCT = {
    "labeller/runner.py": "import subprocess\n\n"
                          "def run_tool(args):\n    return subprocess.run(args)\n\n"
                          "def pure(x):\n    return x + 1\n",
    "labeller/server.py": "import socket as sockets\n\n"
                          "class Server:\n    def __init__(self):\n        self.port = 0\n\n"
                          "    def serve(self):\n        sockets.create_server(('127.0.0.1', self.port))\n",
    "labeller/table.py": "from labeller.runner import run_tool\n\nTOOLS = {'tool': run_tool}\n\n"
                         "def lookup(name):\n    return TOOLS[name]\n",
    "labeller/types.py": "import subprocess\n\n"
                         "def wrap(code: int, out: str) -> subprocess.CompletedProcess[str]:\n"
                         "    return subprocess.CompletedProcess(['x'], code, out, '')\n",
}


def test_a_process_started_two_calls_away_is_integration_with_the_chain_that_leads_there(tmp_path: Path) -> None:
    root = project(tmp_path, {**PRODUCT, "tests/helpers.py": "from labeller import runner\n\n"
                                                               "def tool():\n    return runner.run_tool(['x'])\n",
                              "tests/test_a.py": "from tests.helpers import tool\n\ndef test_it():\n    tool()\n"})
    assert why(root, "tests.test_a.test_it") == ["tests.test_a.test_it", "tests.helpers.tool",
                                                 "labeller.runner.run_tool", "starts a process (subprocess.run)"]


def test_pure_code_types_and_annotations_are_unit(tmp_path: Path) -> None:
    root = project(tmp_path, {**PRODUCT, "tests/test_a.py": "import socket\nfrom labeller.runner import pure\n"
                                                             "from labeller.types import wrap\n\n"
                                                             "def test_it(s: socket.socket) -> None:\n"
                                                             "    assert pure(1) == wrap(0, '').returncode + 2\n"})
    assert why(root, "tests.test_a.test_it") is None


def test_a_class_counts_with_every_method_and_a_lazy_import_is_followed(tmp_path: Path) -> None:
    root = project(tmp_path, {**PRODUCT, "tests/test_a.py": "def test_it():\n"
                                                             "    from labeller.server import Server\n"
                                                             "    assert Server().port == 0\n"})
    assert why(root, "tests.test_a.test_it") == ["tests.test_a.test_it", "labeller.server.Server",
                                                 "opens a socket (socket.create_server)"]


def test_a_call_through_a_table_is_not_seen(tmp_path: Path) -> None:
    """The reading's known limit, which the guard covers (test_the_guard_fails_what_the_reading_missed)."""
    root = project(tmp_path, {**PRODUCT, "tests/test_a.py": "from labeller.table import lookup\n\n"
                                                             "def test_it():\n    lookup('tool')(['x'])\n"})
    assert why(root, "tests.test_a.test_it") is None


@pytest.mark.parametrize(("use", "what"), [
    ("import time\n\ndef test_it():\n    time.sleep(1)\n", "waits on real time (time.sleep)"),
    ("import threading\n\ndef test_it():\n    threading.Thread(target=print).start()\n",
     "starts a thread (threading.Thread)"),
    ("import grpc\n\ndef test_it():\n    grpc.insecure_channel('unix:x')\n", "opens a socket (grpc.insecure_channel)"),
    ("import os\n\ndef test_it():\n    os.fork()\n", "starts a process (os.fork)"),
])
def test_each_kind_of_live_name(tmp_path: Path, use: str, what: str) -> None:
    assert why(project(tmp_path, {"tests/test_a.py": use}), "tests.test_a.test_it") == ["tests.test_a.test_it", what]


# --- the guard -----------------------------------------------------------------------------------------

@pytest.fixture
def guard(request: pytest.FixtureRequest) -> tiers.Guard:
    return request.config.stash[tiers.GUARD]  # the session's: its trip wires are already in place


def tripped_by(guard: tiers.Guard, action: object) -> list[str]:
    with guard.armed() as tripped:
        try:
            action()  # type: ignore[operator]
        except tiers.Tripped:
            pass
    return tripped


def test_the_guard_stops_a_process_before_it_starts(guard: tiers.Guard, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    [what] = tripped_by(guard, lambda: subprocess.run(["touch", str(marker)], check=False))
    assert what.startswith("starts a process (subprocess.Popen 'touch'), at tests/test_tiers.py:")
    assert not marker.exists()


def test_the_guard_stops_a_bind_and_a_connect_but_not_a_socketpair(guard: tiers.Guard) -> None:
    with socket.socket() as sock:
        [bound] = tripped_by(guard, lambda: sock.bind(("127.0.0.1", 0)))
        [connected] = tripped_by(guard, lambda: sock.connect(("127.0.0.1", 9)))
    assert bound.startswith("opens a socket (socket.bind ('127.0.0.1', 0))")
    assert connected.startswith("opens a socket (socket.connect ('127.0.0.1', 9))")

    def pair() -> None:
        left, right = socket.socketpair()
        left.sendall(b"x")
        assert right.recv(1) == b"x"
        left.close()
        right.close()
    assert tripped_by(guard, pair) == []


def test_the_guard_stops_a_thread_and_a_wait_without_end(guard: tiers.Guard) -> None:
    started = threading.Thread(target=print)
    [thread] = tripped_by(guard, started.start)
    assert thread.startswith(f"starts a thread ({started.name})")
    [forever] = tripped_by(guard, lambda: threading.Event().wait())
    assert forever.startswith("waits on real time (a Condition/Event wait without a timeout)")


def test_the_guard_allows_short_waits_up_to_its_budget_in_all(guard: tiers.Guard) -> None:
    began = time.monotonic()
    assert tripped_by(guard, lambda: [time.sleep(0.01) for _ in range(5)]) == []
    [sleeps] = tripped_by(guard, lambda: [time.sleep(0.03) for _ in range(5)])
    assert sleeps.startswith(f"waits on real time (time.sleep: 0.12 s in all, more than {tiers.UNIT_WAIT_S} s)")
    [waits] = tripped_by(guard, lambda: threading.Event().wait(5))
    assert waits.startswith("waits on real time (a Condition/Event wait: 5.00 s in all")
    assert time.monotonic() - began < 5  # the wait over the budget was stopped, not waited out


def test_the_guard_watches_only_the_test_s_thread_and_only_while_armed(guard: tiers.Guard) -> None:
    other = threading.Thread(target=time.sleep, args=(0.2,))
    other.start()
    with guard.armed() as tripped:
        other.join()  # its sleep, on another thread, is not this test's
    assert tripped == []
    time.sleep(0.2)  # disarmed: nothing is counted


def test_guards_nest_and_the_outer_one_is_left_as_it_was(guard: tiers.Guard) -> None:
    with guard.armed() as outer:
        time.sleep(0.06)
        assert tripped_by(guard, lambda: time.sleep(0.06)) == []  # the inner block counts from 0
        with pytest.raises(tiers.Tripped):
            time.sleep(0.06)  # the outer one's count, 0.12 s, is over the budget
    assert len(outer) == 1 and "0.12 s in all" in outer[0]


# --- the hooks, in a pytest run of their own -------------------------------------------------------------

def run_pytest(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "1000"}  # summary lines in full
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE", *args], cwd=root,
                          env=env, capture_output=True, text=True, timeout=PATIENCE_S, check=False)


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project with this suite's tier hooks and four tests: pure, a process, a process reached through a
    table (the reading misses it), and a socket."""
    root = project(tmp_path_factory.mktemp("suite"), {**PRODUCT,
        "pyproject.toml": '[tool.pytest.ini_options]\ntestpaths = ["tests"]\naddopts = "--strict-markers"\n'
                          'markers = ["integration: tiers.py"]\n',
        "tests/conftest.py": "from tests.tiers import (pytest_collection_modifyitems, pytest_configure, "
                             "pytest_report_collectionfinish, pytest_runtest_call, pytest_runtest_setup, "
                             "pytest_runtest_teardown)\n",
        "tests/test_a.py": "from labeller.runner import pure, run_tool\nfrom labeller.table import lookup\n"
                           "import socket\n\n"
                           "def test_pure():\n    assert pure(1) == 2\n\n"
                           "def test_process():\n    assert run_tool(['true']).returncode == 0\n\n"
                           "def test_through_a_table():\n    assert lookup('tool')(['true']).returncode == 0\n\n"
                           "def test_socket():\n    socket.create_connection(('127.0.0.1', 9), timeout=1)\n"})
    shutil.copy(HERE / "tiers.py", root / "tests" / "tiers.py")
    return root


def test_a_plain_run_is_the_unit_tier_and_the_guard_fails_what_the_reading_missed(suite: Path) -> None:
    result = run_pytest(suite)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "tiers: 2 unit, 0 integration tests selected" in result.stdout
    assert "1 failed, 1 passed, 2 deselected" in result.stdout
    assert ("FAILED tests/test_a.py::test_through_a_table - Failed: a unit test must not start a process, open a "
            "socket or wait on real time; this one starts a process (subprocess.Popen 'true'), at "
            "labeller/runner.py:4.") in result.stdout


def test_m_integration_runs_the_rest_and_a_path_runs_both_tiers(suite: Path) -> None:
    integration = run_pytest(suite, "-m", "integration")
    assert "tiers: 0 unit, 2 integration tests selected" in integration.stdout
    assert "1 failed, 1 passed, 2 deselected" in integration.stdout  # nothing listens on port 9: refused
    assert "FAILED tests/test_a.py::test_socket - ConnectionRefusedError" in integration.stdout
    named = run_pytest(suite, "tests/test_a.py::test_pure", "tests/test_a.py::test_process")
    assert "tiers: 1 unit, 1 integration tests selected" in named.stdout and "2 passed" in named.stdout
    everything = run_pytest(suite, "-m", "", "--collect-only", "-vv")
    assert "tiers: 2 unit, 2 integration tests selected" in everything.stdout
    assert ("tests/test_a.py::test_process: tests.test_a.test_process -> labeller.runner.run_tool -> "
            "starts a process (subprocess.run)") in everything.stdout
