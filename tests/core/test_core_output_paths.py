"""Where `gpu-labeller labels` writes: never clobbering a path, and failing in one line when it cannot.

Every test runs the real CLI. ``-o PATH`` replaces a regular file atomically, follows a symlink to its
target, writes through to a device, FIFO or /dev/stdout, and refuses a missing directory (exit 2).
A full disk or a closed stdout is one line on stderr and exit code 1.
"""

from __future__ import annotations

import os
import stat
import subprocess
import threading
from pathlib import Path

from tests.builders import PATIENCE_S
from tests.core.cli import COMMAND, error_line, gpu_labeller, in_process


PROFILE = "t4-time-slicing"
FIRST_LABEL = "nvidia.com/cuda.driver-version.full=535.183.01"


def labels_to(path: Path | str) -> subprocess.CompletedProcess[str]:
    """``labels -o PATH``, in this process (what is written where, and the exit code, are the same)."""
    return in_process("labels", "--simulate", PROFILE, "-o", str(path))


# As root, a regression that replaced the output file instead of writing through would replace
# the machine's /dev/null, /dev/full or /dev/stdout (it happened once while these tests were
# written). So the tests write to stand-ins of the same kind in tmp_path, and to /dev itself only
# where /dev is not ours to replace.


def char_device(tmp_path: Path, name: str, major: int, minor: int) -> Path:
    """A node for the character device /dev/<name> in tmp_path, else /dev/<name> if it is safe."""
    node = tmp_path / name
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(major, minor))
        with open(node, "a"):
            return node
    except OSError:  # not root, or a nodev filesystem
        node.unlink(missing_ok=True)
    assert not os.access("/dev", os.W_OK), f"no safe stand-in for /dev/{name}: cannot use a device node in {tmp_path}"
    return Path("/dev", name)


def stdout_link(tmp_path: Path) -> Path:
    """What /dev/stdout is: a symlink to /proc/self/fd/1, the process's own standard output."""
    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    return link


def expected_text() -> str:
    result = in_process("labels", "--simulate", PROFILE)
    assert result.returncode == 0 and result.stdout.startswith(FIRST_LABEL + "\n"), result.stderr
    return result.stdout


def test_a_regular_file_is_replaced_whole_and_keeps_its_permissions(tmp_path: Path) -> None:
    out = tmp_path / "labels.txt"
    out.write_text("old content that is much longer than nothing\n" * 100)
    out.chmod(0o600)
    result = labels_to(out)
    assert result.returncode == 0 and result.stdout == "", result.stderr
    assert out.read_text() == expected_text()
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["labels.txt"]  # no temporary file left behind


def test_a_symlink_stays_a_link_and_its_target_gets_the_labels(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "labels.txt"
    target.write_text("old\n")
    link = tmp_path / "current"
    link.symlink_to("real/labels.txt")
    dangling = tmp_path / "next"
    dangling.symlink_to("real/not-yet.txt")
    assert labels_to(link).returncode == 0
    assert labels_to(dangling).returncode == 0
    assert link.is_symlink() and os.readlink(link) == "real/labels.txt"
    assert dangling.is_symlink() and os.readlink(dangling) == "real/not-yet.txt"
    assert target.read_text() == (tmp_path / "real" / "not-yet.txt").read_text() == expected_text()


def test_a_symlink_loop_is_refused_and_left_alone(tmp_path: Path) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to("loop")
    result = labels_to(loop)
    assert result.returncode == 2
    assert error_line(result) == f"Error: {loop}: cannot write: Too many levels of symbolic links"
    assert os.readlink(loop) == "loop"


def test_a_missing_directory_is_refused_not_created(tmp_path: Path) -> None:
    out = tmp_path / "missing" / "labels.txt"
    result = labels_to(out)
    assert result.returncode == 2 and result.stdout == ""
    assert error_line(result) == f"Error: {out}: cannot write: directory {tmp_path / 'missing'} does not exist"
    assert not (tmp_path / "missing").exists()


def test_dev_null_is_written_through_not_replaced(tmp_path: Path) -> None:
    null = char_device(tmp_path, "null", 1, 3)
    before = null.stat()
    result = labels_to(null)
    assert result.returncode == 0, result.stderr
    after = null.stat()
    assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)


def test_a_fifo_is_written_through_to_its_reader(tmp_path: Path) -> None:
    fifo = tmp_path / "labels.fifo"
    os.mkfifo(fifo)
    received: list[str] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()), daemon=True)
    reader.start()
    result = labels_to(fifo)
    reader.join(timeout=PATIENCE_S)
    assert result.returncode == 0, result.stderr
    assert received == [expected_text()]
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_dev_stdout_goes_where_the_shell_sent_it(tmp_path: Path) -> None:
    expected = expected_text()
    for name in (stdout_link(tmp_path), "/dev/fd/1", "/proc/self/fd/1"):
        piped = gpu_labeller("labels", "--simulate", PROFILE, "-o", str(name))  # this process's fd 1 is not a shell's
        assert piped.returncode == 0 and piped.stdout == expected, name
        # `>> log`: the shell opened the file for appending; replacing it would lose what was there.
        log = tmp_path / "log"
        log.write_text("earlier line\n")
        with log.open("a") as append:
            appended = gpu_labeller("labels", "--simulate", PROFILE, "-o", str(name), stdout=append)
        assert appended.returncode == 0, appended.stderr
        assert log.read_text() == "earlier line\n" + expected, name
    assert os.readlink(tmp_path / "stdout") == "/proc/self/fd/1"


def test_a_full_disk_is_one_line_and_exit_code_1(tmp_path: Path) -> None:
    full = char_device(tmp_path, "full", 1, 7)  # every write fails with ENOSPC
    with full.open("w") as stdout:
        printed = gpu_labeller("labels", "--simulate", PROFILE, stdout=stdout)
    assert printed.returncode == 1
    assert error_line(printed) == "Error: cannot write to standard output: No space left on device"
    written = labels_to(full)
    assert written.returncode == 1 and written.stdout == ""
    assert error_line(written) == f"Error: {full}: cannot write: No space left on device"
    assert stat.S_ISCHR(full.stat().st_mode)


def test_a_closed_pipe_is_one_line_and_exit_code_1_without_interpreter_noise() -> None:
    for command in (["labels", "--simulate", PROFILE], ["probe", "--simulate", PROFILE], ["profiles"]):
        read_end, write_end = os.pipe()
        os.close(read_end)  # the reader is gone before anything is written, as with `| head -c0`
        try:
            result = gpu_labeller(*command, stdout=write_end)
        finally:
            os.close(write_end)
        assert result.returncode == 1, command
        # error_line also rules out "Exception ignored ... BrokenPipeError" and tracebacks
        assert error_line(result) == "Error: cannot write to standard output: Broken pipe"


def test_a_closed_stdout_is_one_line_and_exit_code_1() -> None:
    result = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", *COMMAND, "labels", "--simulate", PROFILE],
                            capture_output=True, text=True, timeout=PATIENCE_S, check=False)
    assert result.returncode == 1
    assert error_line(result) == "Error: cannot write to standard output: standard output is closed"

