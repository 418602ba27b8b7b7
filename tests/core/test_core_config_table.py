"""The config table (labeller.model.configtable): each key is declared once, next to the code that acts on
it (the core's in labeller/model/config.py, a vendor's in its package, registered through
``Vendor.settings``), and the check, the defaults, the upstream flags and the reference page come from
that one declaration. A key the docs or the product's
messages name and nobody declares fails here, and so does a declared key without its documentation."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from labeller.model.config import (Config, ConfigError, ResourceNames, config_keys, config_table, parse_config,
                             upstream_flags)
from labeller.model.configtable import Key, Section, setting
from labeller.model.upstream import DRA_PLUGIN, KeyFlag, overlay, overrides_and_warnings
from vendors import RESOURCE_NAMES, VENDORS
from vendors.amd.settings import AmdSettings

ROOT = Path(__file__).resolve().parents[2]
TABLE = config_table(RESOURCE_NAMES)


def with_section(section: Section) -> ResourceNames:
    """The registered vendors' names and keys, and one more section, as a fourth vendor would register it."""
    return dataclasses.replace(RESOURCE_NAMES, settings=(*RESOURCE_NAMES.settings, section))


@dataclass(frozen=True)
class ToySettings:
    """A vendor's settings with one key, declared as docs/development.md shows it."""

    dynamic: bool = setting("labeller.dra.toyDynamic", False, "a key the test declares",
                            flags=(KeyFlag("nvidia-dra", ("--toy-dynamic",), ("TOY_DYNAMIC",), DRA_PLUGIN),))


def test_adding_a_key_is_one_declaration() -> None:
    """The declaration alone gives the parsed value and its default, the one-line refusals, the reference row
    and the upstream flag that sets it."""
    names = with_section(Section(ToySettings))
    assert parse_config({"version": "v1"}, names).section(ToySettings).dynamic is False
    given = parse_config({"labeller": {"dra": {"toyDynamic": True}}}, names)
    assert given.section(ToySettings).dynamic is True and given != Config()
    with pytest.raises(ConfigError, match=r"^labeller.dra.toyDynamic: must be true or false, got 'yes'$"):
        parse_config({"labeller": {"dra": {"toyDynamic": "yes"}}}, names)
    with pytest.raises(ConfigError,
                       match=r"^labeller.dra.toyDynamc: unknown key \(known here: dynamicMig, toyDynamic, vendors\)$"):
        parse_config({"labeller": {"dra": {"toyDynamc": True}}}, names)
    (row,) = [key for key in config_keys(names) if key.path == "labeller.dra.toyDynamic"]
    assert (row.kind, row.default, row.doc) == ("bool", "false", "a key the test declares")
    (flag,) = [f for f in upstream_flags(names) if f.names == ("--toy-dynamic",)]
    assert (flag.key, flag.kind, flag.env, flag.commands) == ("labeller.dra.toyDynamic", "bool", ("TOY_DYNAMIC",),
                                                             ("dra-plugin",))
    overrides, _ = overrides_and_warnings({flag: True})
    assert parse_config(overlay({}, overrides), names).section(ToySettings).dynamic is True


def test_a_key_declared_twice_or_outside_a_block_or_without_a_doc_is_refused() -> None:
    for key, message in ((Key("flags.migStrategy", "again", ("none",)), "flags.migStrategy: declared twice"),
                         (Key("labeller.nowhere.x", "lost", bool), "nowhere is not a declared block"),
                         (Key("labeller.labels.x", "", bool), "declared without what it takes or what it does")):
        with pytest.raises(ValueError, match=message):
            config_table(with_section(Section(keys=(key,))))


def test_a_vendor_brings_its_keys() -> None:
    """AMD's keys are AMD's package's: without the vendors registered, they are unknown keys."""
    assert {key.path for key in vendor_keys("amd")} == {
        "labeller.amd", "labeller.amd.resourceNamingStrategy", "labeller.labels.amd", "labeller.labels.amdBeta",
        "labeller.labels.firmware"}
    assert "flags.plugin.nvidiaCTKPath" in {key.path for key in vendor_keys("nvidia")}
    bare = dataclasses.replace(RESOURCE_NAMES, settings=())
    with pytest.raises(ConfigError, match=r"^labeller.amd: unknown key \(known here: dra, labels\)$"):
        parse_config({"labeller": {"amd": {"resourceNamingStrategy": "mixed"}}}, bare)
    mixed = parse_config({"labeller": {"amd": {"resourceNamingStrategy": "mixed"}}}, RESOURCE_NAMES)
    assert mixed.section(AmdSettings).resource_naming == "mixed"


def vendor_keys(name: str) -> list[Key]:
    return next(v for v in VENDORS if v.name == name).settings.declared()


def test_equal_configs_compare_equal_however_they_were_made() -> None:
    """A vendor's settings given as their defaults are the defaults: no reload for a file that only spells them out."""
    spelled = parse_config({"labeller": {"labels": {"amd": True, "nvidia": True}, "amd": {}}}, RESOURCE_NAMES)
    assert spelled == parse_config({}, RESOURCE_NAMES) == parse_config(None, RESOURCE_NAMES) == Config()
    off = Config().with_section(AmdSettings(labels=False))
    assert off != Config() and off.with_section(AmdSettings()) == Config()


# --- documented <-> declared -------------------------------------------------------------------------------------

# A config key as the docs and messages write it: dotted, with `*`, `…` or `{placeholder}` for any block and
# `{a,b}` for either; `labeller.` starts one only before the sections of the config file's own `labeller` block.
MENTION = re.compile(r"(?<![\w/.$-])(?:(?:flags|sharing)(?:\.(?:[A-Za-z]+|\{[A-Za-z,]+\}|\*|…))+"
                     r"(?:\[\](?:\.[A-Za-z]+)*)?|labeller\.(?:labels|amd|dra)(?:\.(?:[A-Za-z]+|\{[A-Za-z,]+\}))*)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)  # examples, errors included (an unknown key's)
# Not keys of ours: the fields of NVIDIA's DRA opaque config (resource.nvidia.com GpuConfig's `sharing`), which
# the DRA plugin decodes and docs/dra.md tables, and Go source files of NVIDIA's that comments cite (sharing.go).
NOT_OURS = re.compile(r"sharing\.(?:strategy|timeSlicingConfig|mpsConfig)(?:\..*)?|.*\.go")


def mentions() -> dict[str, set[str]]:
    """Every config key the docs (outside code examples) and the product's strings name -> where."""
    found: dict[str, set[str]] = {}
    for path in [*sorted((ROOT / "docs").glob("**/*.md")), ROOT / "README.md"]:
        for match in MENTION.finditer(FENCE.sub("", path.read_text())):
            found.setdefault(match.group(), set()).add(str(path.relative_to(ROOT)))
    for path in sorted([*(ROOT / "labeller").glob("**/*.py"), *(ROOT / "vendors").glob("**/*.py")]):
        strings = (node.value for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, ast.Constant) and isinstance(node.value, str))
        for text in strings:
            for match in MENTION.finditer(text):
                found.setdefault(match.group(), set()).add(str(path.relative_to(ROOT)))
    return {key: where for key, where in found.items() if not python_name(key) and not NOT_OURS.fullmatch(key)}


def python_name(text: str) -> bool:
    """``labeller.model.labels.merge`` names a function of the module ``labeller.labels``, not a key."""
    module, _, name = text.rpartition(".")
    try:
        return hasattr(importlib.import_module(module), name)
    except ImportError:
        return False


def concrete(path: str) -> list[list[str]]:
    """The paths ``path`` stands for, as segments: ``a.{b,c}`` is ``a.b`` and ``a.c``."""
    head, brace, rest = path.partition("{")
    alternatives, _, tail = rest.partition("}")
    if not brace or "," not in alternatives:  # ``{name}``: a placeholder, not a choice
        return [path.replace("[]", ".[]").split(".")]
    return [found for name in alternatives.split(",") for found in concrete(f"{head}{name}{tail}")]


WILD = re.compile(r"\*|…|\{\w+\}")
KEYS = [segments for key in TABLE.keys for segments in concrete(key.path)]


def declared(mention: str) -> bool:
    """Whether each key ``mention`` names is declared (``*``, ``…`` or ``{name}`` stand for any block)."""
    return all(any(len(key) == len(wanted) and all(w == k or WILD.fullmatch(w) for w, k in zip(wanted, key))
                   for key in KEYS) for wanted in concrete(mention))


def test_every_key_the_docs_and_the_messages_name_is_declared() -> None:
    found = mentions()
    assert len(found) > 40 and "labeller.labels.machine" in found and "sharing.*.resources[].devices" in found
    assert {key: sorted(where) for key, where in found.items() if not declared(key)} == {}


def test_a_key_named_and_not_declared_fails() -> None:
    assert not declared("flags.plugin.deviceIdStrategy") and not declared("labeller.labels.amdbeta")
    assert declared("sharing.….resources") and declared("sharing.{sharing}.resources")
    assert declared("labeller.labels.{nvidia,amd}") and not declared("labeller.labels.{nvidia,intel}")


def test_every_declared_key_is_documented() -> None:
    """A doc and what it takes in the table, and a row of its own on the reference page."""
    page = (ROOT / "docs" / "reference" / "config.md").read_text()
    for key in TABLE.keys:
        assert key.doc and key.kind_text, key.path
        assert f"\n| `{key.path}` | " in page, key.path


def test_each_label_group_a_label_names_is_a_key_of_its_vendor() -> None:
    for vendor in VENDORS:
        paths = {key.path for key in vendor.settings.declared()}
        for doc in vendor.labelling.key_docs:
            assert not doc.group or f"labeller.labels.{doc.group}" in paths, (vendor.name, doc.pattern)
