"""Reading the files users write: config files and simulated-node profiles (YAML, or JSON by suffix).

One loader for both, so both get the same rules: the file must be UTF-8 text, and a key given twice
in one mapping is an error (PyYAML and ``json`` would silently keep the last value). Every problem is
a DocumentError whose message is one line naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when PyYAML was built with it


class DocumentError(ValueError):
    """A file that cannot be read as a document; the message is one line naming the file."""


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
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DocumentError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"{path}: not a {what}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                            f"{exc.start})") from None
    try:
        return _json(text) if path.suffix == ".json" else _yaml(text)
    except DocumentError as exc:
        raise DocumentError(f"{path}: {exc}") from None
