"""Reading the files users write: config files and simulated-node profiles (YAML, or JSON by suffix).

One loader for both, so both get the same rules: the file must be UTF-8 text, and a key given twice
in one mapping is an error (PyYAML and ``json`` would silently keep the last value). Every problem is
a DocumentError whose message is one line naming the file.

No input can exhaust the process (``read_limited``, also used for a kubeconfig before the client
reads it): only a regular file is read (a FIFO would block forever, ``/dev/zero`` would grow
without end), and at most ``DOCUMENT_LIMIT`` bytes of it. A document nests at most ``MAX_DEPTH``
levels and its integers fit in 64 bits; deeper or larger ones are errors, not a RecursionError or
ValueError traceback.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from labeller.base.ownfiles import file_kind, read_at_most

_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when PyYAML was built with it


DOCUMENT_LIMIT = 1024 * 1024  # bytes: as much as one ConfigMap can hold; real configs and profiles are a few KiB
MAX_DEPTH = 64  # levels of nested mappings and lists; a real config has 6
MAX_INTEGER = (1 << 63) - 1  # an integer any consumer (Go's int64, protobuf) can hold


class DocumentError(ValueError):
    """A file that cannot be read as a document; the message is one line naming the file."""


def not_a_regular_file(path: Path) -> str | None:
    """What ``path`` is when it exists and is not a regular file ("a FIFO, not a regular file"), else None."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None  # missing or unreadable: the reader says which
    return None if stat.S_ISREG(mode) else f"{file_kind(mode)}, not a regular file"


def read_limited(path: Path, what: str, limit: int = DOCUMENT_LIMIT) -> bytes:
    """The content of the regular file ``path``, at most ``limit`` bytes; DocumentError (one line
    naming the file) for anything else: missing, unreadable, not a regular file, or larger."""
    try:
        # O_NONBLOCK: a FIFO opened for reading would otherwise wait for a writer before fstat runs
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise DocumentError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise DocumentError(f"{path}: not a {what}: {file_kind(mode)}, not a regular file")
        data = read_at_most(fd, limit)
        if data is None:
            raise DocumentError(f"{path}: not a {what}: larger than the limit of {limit / 1048576:g} MiB")
        return data
    except OSError as exc:
        raise DocumentError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _bounded(document: Any) -> Any:
    """``document``, once no value in it nests deeper than MAX_DEPTH or is an integer beyond 64 bits.

    Iterative, and each container is visited once, so YAML aliases repeating one list cannot make it slow."""
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INTEGER:
            raise DocumentError(f"an integer of {len(str(abs(value)))} digits; the largest allowed is {MAX_INTEGER}")
        if not isinstance(value, Mapping | list) or id(value) in seen:
            continue
        if depth > MAX_DEPTH:
            raise DocumentError(f"nested more than {MAX_DEPTH} levels deep")
        seen.add(id(value))
        children = [*value.keys(), *value.values()] if isinstance(value, Mapping) else value
        stack.extend((child, depth + 1) for child in children)
    return document


def _parsed(text: str, as_json: bool) -> Any:
    """The document in ``text``, bounded; parser errors (and the parsers' own limits) as DocumentError."""
    try:
        return _bounded(_json(text) if as_json else _yaml(text))
    except RecursionError:
        raise DocumentError(f"nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:  # int(): an integer beyond Python's own limit of digits (sys.get_int_max_str_digits)
        if isinstance(exc, DocumentError):
            raise
        raise DocumentError(f"an integer too large to read; the largest allowed is {MAX_INTEGER}") from None


class _UniqueKeyLoader(_BaseLoader):  # type: ignore[misc]
    """yaml.safe_load's loader, except that a key given twice in one mapping is an error."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor` keys may be overridden by design
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key; the constructor below reports it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


def _yaml(text: str) -> Any:
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a safe loader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise DocumentError(f"not valid YAML{where}: {problem}") from None


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    mapping: dict[str, Any] = {}
    for key, value in pairs:
        if key in mapping:
            raise DocumentError(f"not valid JSON: duplicate key {key!r}")
        mapping[key] = value
    return mapping


def _json(text: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs)
    except json.JSONDecodeError as exc:
        raise DocumentError(f"not valid JSON at line {exc.lineno}: {exc.msg}") from None


def read_document(path: Path, what: str) -> Any:
    """The parsed content of ``path`` (JSON for a ``.json`` suffix, else YAML); ``what`` names it in errors."""
    data = read_limited(path, what)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"{path}: not a {what}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                            f"{exc.start})") from None
    try:
        return _parsed(text, as_json=path.suffix == ".json")
    except DocumentError as exc:
        raise DocumentError(f"{path}: {exc}") from None
