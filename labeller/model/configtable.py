"""The config table: each key of the config file declared once, with what it takes, its default, the upstream
flags and env vars that set it, and what it does. The check of a file, the defaults and values of the parsed
config, the upstream flags that set keys, the warnings for keys read and not honoured, and the reference page
(docs/reference/config.md) all come from the declarations.

A key is declared next to the code that acts on it: the core's in ``labeller.config``, a vendor's in its package
(``vendors/<name>/settings.py``, handed to parsing by the vendor contract, ``Vendor.settings``), as NFD's sources
own theirs. Two ways to declare one:

- ``setting(path, default, doc, ...)`` as the default of a field of a frozen dataclass (a *settings* class): the
  field's type says what the key takes (``bool``, ``int``, ``str``, a ``Literal`` of strings; any other type
  takes what ``check`` accepts, described by ``kind``), its default is the key's, and ``build`` makes the
  dataclass from a file;
- ``Key(path, doc, takes)`` for a key without a field: a block (``BLOCK``), a key read and not honoured, a key
  that another field reads (``read``), or one the parser reads by hand (``ANY``).

``path`` is dotted; ``{a,b}`` stands for sibling blocks that take the same keys, and ``[]`` for each entry of a
list (such keys are documented here and checked by the code that reads the list).
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, Protocol, TypeVar

from labeller.base.errors import InputError
from labeller.model.upstream import KeyFlag, Kind, UpstreamFlag

T = TypeVar("T")


class ConfigError(InputError, ValueError):
    """A configuration problem, with a message that names the offending key."""


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


BLOCK = _Marker("BLOCK")  # a mapping whose keys are declared under it
ANY = _Marker("ANY")  # not checked here: the code that reads it checks it (or every value is accepted)
UNSET = _Marker("UNSET")  # what a file leaves out
NOTHING = _Marker("NOTHING")  # of a key read and not honoured: no value asks for what gpu-labeller does anyway
Takes = type | tuple[str, ...] | _Marker  # bool, int or str; one of these strings; BLOCK; ANY
Check = Callable[[Any, str], Any]  # (the value a file gives, its path) -> the field's value; ConfigError
Read = Callable[[Mapping[str, Any], str], Any]  # (the checked document, the path) -> the field's value
_KEY = "config key"  # where a setting keeps its Key, in its field's metadata
_TYPE_NAMES: dict[Any, str] = {bool: "bool", int: "integer", str: "string"}
_FLAG_KINDS: dict[Any, Kind] = {bool: "bool", int: "int", str: "str"}


def value_at(document: Any, path: str, absent: Any = UNSET) -> Any:
    """The value of the dotted ``path`` in ``document``; ``absent`` when it is not there."""
    where = document
    for part in path.split("."):
        # a parsed document's mappings are dicts; any other Mapping is asked the slower way
        if not (type(where) is dict or isinstance(where, Mapping)) or part not in where:
            return absent
        where = where[part]
    return where


@dataclass(frozen=True)
class Key:
    path: str
    doc: str  # what it does, for people (Markdown)
    takes: Takes | None = None  # None: a setting's, from its field's type
    kind: str = ""  # what it takes, for people, where ``takes`` does not say
    default: Any = UNSET  # the value a file without the key gets (a setting's field default)
    shown: str | None = None  # the default as the docs show it, where not ``default`` ("": none)
    check: Check | None = None  # a given value -> the field's value
    read: Read | None = None
    blank_is_unset: bool = False  # "" is taken as the key left out (a Go zero value, as NVIDIA's plugin reads it)
    flags: tuple[KeyFlag, ...] = ()  # the upstream flags and env vars that set it
    flag_kind: Kind | None = None  # their kind, where the type does not say (a Go duration, a list)
    not_honoured: tuple[Any, str] | None = None  # (the value that asks for what gpu-labeller does, or NOTHING; why)

    def value(self, document: Mapping[str, Any]) -> Any:
        """The field's value, from a document the table has checked."""
        if self.read is not None:
            return self.read(document, self.path)
        value = value_at(document, self.path)
        if value is UNSET or (self.blank_is_unset and value == ""):
            return self.default
        return self.check(value, self.path) if self.check is not None else value

    @property
    def shown_default(self) -> str:
        if self.shown is not None:
            return self.shown
        if self.default is UNSET or self.default is None:
            return ""
        if isinstance(self.default, bool):
            return str(self.default).lower()
        return "[]" if self.default == () else str(self.default)

    @property
    def kind_text(self) -> str:
        if self.kind:
            return self.kind
        if self.takes is BLOCK:
            return "mapping"
        if isinstance(self.takes, tuple):
            return "one of " + ", ".join(f"`{value}`" for value in self.takes)
        return _TYPE_NAMES[self.takes]

    def upstream(self) -> tuple[UpstreamFlag, ...]:
        """Its upstream flags, each with its kind and this key."""
        if not self.flags:
            return ()
        kind = self.flag_kind or (self.takes if isinstance(self.takes, tuple) else _FLAG_KINDS[self.takes])
        return tuple(flag.bound(self.path, kind) for flag in self.flags)

    def warning(self, document: Any) -> str | None:
        """The line a key read and not honoured gets from ``document``; None when it is not given or neutral."""
        if self.not_honoured is None:
            return None
        neutral, why = self.not_honoured
        value = value_at(document, self.path)
        if value is UNSET or value is None or value == neutral:
            return None
        return f"{self.path}: not honoured by gpu-labeller: {why}"


def setting(path: str, default: T, doc: str, *, takes: Takes | None = None, kind: str = "", shown: str | None = None,
            check: Check | None = None, read: Read | None = None, blank_is_unset: bool = False,
            flags: tuple[KeyFlag, ...] = (), flag_kind: Kind | None = None) -> T:
    """A field of a settings class that holds the key ``path`` (see the module's docstring); ``takes``, where
    the field's type does not say what a file may give (a ``str | None`` that takes a string)."""
    key = Key(path, doc, takes=takes, kind=kind, default=default, shown=shown, check=check, read=read,
              blank_is_unset=blank_is_unset, flags=flags, flag_kind=flag_kind)
    made: T = field(default=default, metadata={_KEY: key})
    return made


_SETTINGS: dict[type, tuple[tuple[str, Key], ...]] = {}  # settings_of's answers: a class's fields never change


def settings_of(settings: type) -> tuple[tuple[str, Key], ...]:
    """The fields of a settings class that hold keys: (field name, its key)."""
    found = _SETTINGS.get(settings)
    if found is None:
        found = _SETTINGS[settings] = tuple((each.name, each.metadata[_KEY]) for each in fields(settings)
                                            if _KEY in each.metadata)
    return found


def key_of(settings: type, name: str) -> Key:
    """The key the field ``name`` of ``settings`` holds."""
    return dict(settings_of(settings))[name]


def build(settings: type[T], document: Mapping[str, Any], **made: Any) -> T:
    """``settings`` from a checked ``document``: each setting's value, and the other fields from ``made``."""
    values = dict(made)
    for name, key in settings_of(settings):
        if name not in made:
            values[name] = key.value(document)
    return settings(**values)


class Sectioned(Protocol):
    """A parsed config (``labeller.model.config.Config``): it holds the settings of each section."""

    def section(self, settings: type[T]) -> T: ...


def _takes(hint: Any) -> Takes:
    if hint in _TYPE_NAMES:
        return typing.cast(type, hint)
    if typing.get_origin(hint) is Literal:
        return typing.get_args(hint)
    return ANY


@dataclass(frozen=True, eq=False)  # one object per declaration: compared, and hashed, by identity
class Section:
    """Keys declared together: the settings of ``settings`` (a frozen dataclass of ``setting`` fields), and
    ``keys`` that have no field."""

    settings: type | None = None
    keys: tuple[Key, ...] = ()

    def declared(self) -> list[Key]:
        """Its keys, a setting's with what it takes (from its field's type)."""
        found = list(self.keys)
        if self.settings is not None:
            hints = typing.get_type_hints(self.settings)
            for each in fields(self.settings):
                key = each.metadata.get(_KEY)
                if key is not None:
                    found.append(replace(key, takes=key.takes or _takes(hints[each.name])))
        return found

    def value(self, config: Sectioned, path: str) -> Any:
        """The value ``config`` holds for the key ``path``, one of this section's settings."""
        assert self.settings is not None, path
        name = next(name for name, key in settings_of(self.settings) if key.path == path)
        return getattr(config.section(self.settings), name)


def _concrete(path: str) -> list[str]:
    """The paths ``path`` stands for: ``a.{b,c}.d`` is ``a.b.d`` and ``a.c.d``."""
    head, brace, rest = path.partition("{")
    if not brace:
        return [path]
    alternatives, _, tail = rest.partition("}")
    return [found for name in alternatives.split(",") for found in _concrete(f"{head}{name}{tail}")]


@dataclass
class _Node:
    key: Key | None
    children: dict[str, _Node] = field(default_factory=dict)


class Table:
    """The keys of the config file: the core's and the registered vendors' sections."""

    def __init__(self, sections: Iterable[Section]) -> None:
        declared = [key for section in sections for key in section.declared()]
        paths = [key.path for key in declared]
        twice = next((path for i, path in enumerate(paths) if path in paths[:i]), None)
        if twice is not None:
            raise ValueError(f"config key {twice}: declared twice")
        self.declared = tuple(declared)  # in the order declared: the core's, then each vendor's
        self.not_honoured = tuple(key for key in declared if key.not_honoured is not None)
        self.keys: tuple[Key, ...] = tuple(_file_order(declared))
        self.root = _Node(None)
        for key in sorted(declared, key=lambda k: k.path.count(".")):  # each block before its keys
            if key.takes is None or (key.takes is ANY and not key.kind) or not key.doc:
                raise ValueError(f"config key {key.path}: declared without what it takes or what it does")
            for path in _concrete(key.path):
                if "[]" not in path:
                    self._place(path, key)

    def _place(self, path: str, key: Key) -> None:
        *parents, name = path.split(".")
        node = self.root
        for part in parents:
            found = node.children.get(part)
            if found is None or found.key is None or found.key.takes is not BLOCK:
                raise ValueError(f"config key {key.path}: {part} is not a declared block")
            node = found
        if name in node.children:
            raise ValueError(f"config key {path}: declared twice")
        node.children[name] = _Node(key)

    def check(self, document: Any) -> None:
        """ConfigError naming the first key of ``document`` that is unknown or of the wrong type."""
        _check(document, self.root, "")

    def entries(self, path: str) -> tuple[str, ...]:
        """The keys of each entry of the list ``path``, sorted (the code that reads the list checks them)."""
        return tuple(sorted(key.path.removeprefix(f"{path}[].") for key in self.keys
                            if key.path.startswith(f"{path}[].")))

    def warnings(self, document: Any) -> list[str]:
        """One line for each key of ``document`` that gpu-labeller reads and does not honour."""
        return [line for key in self.not_honoured if (line := key.warning(document)) is not None]

    def flags(self) -> tuple[UpstreamFlag, ...]:
        """The upstream flags and env vars that set keys."""
        return tuple(flag for key in self.keys for flag in key.upstream())


def _check(value: Any, node: _Node, path: str) -> None:
    takes = node.key.takes if node.key is not None else BLOCK
    if takes is ANY:
        return
    if takes is BLOCK:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: must be a mapping, got {type(value).__name__}")
        for name, sub in value.items():
            where = f"{path}.{name}" if path else str(name)
            child = node.children.get(name)
            if child is None:
                raise ConfigError(f"{where}: unknown key (known here: {', '.join(sorted(node.children))})")
            _check(sub, child, where)
    elif isinstance(takes, tuple):
        if value not in takes:
            raise ConfigError(f"{path}: must be one of {', '.join(takes)}, got {value!r}")
    elif takes is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: must be true or false, got {value!r}")
    elif takes is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: must be an integer, got {value!r}")
    elif takes is str and not isinstance(value, str):
        raise ConfigError(f"{path}: must be a string, got {value!r}")


def _file_order(keys: Sequence[Key]) -> list[Key]:
    """``keys`` as a file holds them, each block before its keys: under each block, first the keys it holds
    (those gpu-labeller honours first), then its blocks, each group in the order declared. ``a.{b,c}`` is placed
    as a block of its own, and the entries of a list ``a[]`` under ``a``."""
    by_path = {key.path: key for key in keys}
    tree: dict[str, Any] = {}  # name -> its subtree, in the order first declared
    for key in keys:
        where = tree
        for part in key.path.replace("[].", ".[].").split("."):
            where = where.setdefault(part, {})

    def join(prefix: str, name: str) -> str:
        return prefix + name if name == "[]" or not prefix else f"{prefix}.{name}"

    def walk(subtree: dict[str, Any], prefix: str) -> list[Key]:
        def rank(name: str) -> tuple[bool, bool]:
            key = by_path.get(join(prefix, name))
            return bool(subtree[name]), key is not None and key.not_honoured is not None

        found: list[Key] = []
        for name in sorted(subtree, key=rank):
            path = join(prefix, name)
            found += [by_path[path]] if path in by_path else []
            found += walk(subtree[name], path)
        return found

    return walk(tree, "")
