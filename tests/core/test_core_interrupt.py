"""Ctrl-C (SIGINT) ends any command with exit code 130 and no traceback, however early it comes."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.builders import PATIENCE_S


ROOT = Path(__file__).resolve().parents[2]
INTERRUPTED = 130
F_SETPIPE_SZ = 1031  # fcntl: set a pipe's capacity (Linux)


def entry_point() -> list[str]:
    """The installed ``gpu-labeller`` script's import and call, as pyproject.toml declares it."""
    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["gpu-labeller"]
    module, attribute = target.split(":")
    return [sys.executable, "-c", f"import sys; from {module} import {attribute}; sys.exit({attribute}())"]


def write_kubeconfig(path: Path, server: str) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    return path


def test_ctrl_c_while_the_program_is_still_loading_is_exit_130_without_a_traceback(tmp_path: Path) -> None:
    """The interrupt lands among the imports: ``-X importtime`` writes a line per module imported to a
    pipe of one page that the test stops reading after click's line, so the program stalls mid-import."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, F_SETPIPE_SZ, 4096)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:1")
    command = [entry_point()[0], "-X", "importtime", *entry_point()[1:], "nodes", "--kubeconfig", str(kubeconfig)]
    proc = subprocess.Popen(command, stderr=write_end, stdout=subprocess.PIPE, text=True)
    os.close(write_end)
    with os.fdopen(read_end) as stderr:
        try:
            for line in stderr:
                if line.split("|")[-1].strip() == "click":
                    break
            proc.send_signal(signal.SIGINT)
            rest = stderr.read()
            code = proc.wait(PATIENCE_S)
        finally:
            proc.kill()
            proc.wait()
    not_imports = [line for line in rest.splitlines() if not line.startswith("import time:")]
    assert not_imports == [] and code == INTERRUPTED, rest
    loaded = {line.split("|")[-1].strip() for line in rest.splitlines()}
    assert "kubernetes" not in loaded  # it was interrupted before it had loaded everything


def test_ctrl_c_while_a_command_waits_on_the_cluster_is_exit_130_without_a_traceback(tmp_path: Path) -> None:
    with socket.socket() as server:  # an API server that takes the connection and never answers
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(PATIENCE_S)
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{server.getsockname()[1]}")
        proc = subprocess.Popen([*entry_point(), "nodes", "--kubeconfig", str(kubeconfig)],
                                stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            connection, _ = server.accept()  # the command is waiting for its answer now
            with connection:
                proc.send_signal(signal.SIGINT)
                out, err = proc.communicate(timeout=PATIENCE_S)
        finally:
            proc.kill()
            proc.wait()
    assert (proc.returncode, out) == (INTERRUPTED, "")
    assert len(err.splitlines()) <= 1 and "Traceback" not in err and "Aborted" not in err, err
