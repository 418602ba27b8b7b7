"""``config_keys()``: every key of the config file, for people (docs/reference/config.md is generated from it). It
lists exactly the keys the parser accepts, each with what it takes, and each default it states is the one the
parser applies to a file without the key."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from labeller.model.config import ConfigError, config_keys, parse_document
from vendors import RESOURCE_NAMES

KEYS = config_keys(RESOURCE_NAMES)
# Defaults that a command applies rather than the parser: run's --interval is 60s when sleepInterval is not set.
APPLIED_BY_A_COMMAND = {"flags.gfd.sleepInterval"}
ENTRY = {"name": "nvidia.com/gpu", "replicas": 2}  # the least a sharing block needs


def document(path: str, value: Any = None, with_key: bool = True) -> dict[str, Any]:
    """A whole config document with the blocks around ``path`` (and what they need), and the key set or not.
    ``{timeSlicing,mps}`` is taken as timeSlicing."""
    doc: dict[str, Any] = {"version": "v1"}
    parts = path.replace("{timeSlicing,mps}", "timeSlicing").split(".")
    where = doc
    for part in parts[:-1]:
        name = part.removesuffix("[]")
        if name == "resources":  # a sharing block's list: its one entry holds the key
            where[name] = [dict(ENTRY)]
            where = where[name][0]
        else:
            where = where.setdefault(name, {})
    if parts[:2] == ["sharing", "timeSlicing"] and len(parts) == 3 and parts[-1] != "resources":
        where["resources"] = [dict(ENTRY)]
    if with_key:
        where[parts[-1]] = value
    return doc


def test_every_key_the_parser_accepts_is_listed_once_with_what_it_takes() -> None:
    paths = [key.path for key in KEYS]
    assert len(paths) == len(set(paths)) > 50
    assert paths[0] == "version"
    for key in KEYS:
        assert key.kind and key.doc, key.path
        if key.kind.startswith("one of"):
            assert key.allowed and all(f"`{value}`" in key.kind for value in key.allowed), key.path


@pytest.mark.parametrize("key", [k for k in KEYS if "." in k.path and k.kind != "mapping"], ids=lambda k: k.path)
def test_each_listed_key_is_accepted_by_the_parser(key: Any) -> None:
    """Set to its default (or, without one, a value of its kind), the key loads: the list names no key the parser
    would refuse as unknown."""
    samples = {"string": "/x", "integer": 2, "bool": False}
    value = yaml.safe_load(key.default) if key.default else key.allowed[0] if key.allowed else samples.get(key.kind)
    if key.path.endswith(".resources"):
        value = [dict(ENTRY)]
    elif key.path.endswith(".rename"):
        value = "nvidia.com/gpu-shared"
    elif key.path.endswith(".devices"):
        document_ = document(key.path, 1)
        document_["sharing"]["timeSlicing"]["renameByDefault"] = True
        parse_document(document_, RESOURCE_NAMES)
        return
    parse_document(document(key.path, value), RESOURCE_NAMES)


def test_an_unlisted_key_is_refused() -> None:
    with pytest.raises(ConfigError, match="flags.plugin.deviceIdStrategy: unknown key"):
        parse_document(document("flags.plugin.deviceIdStrategy", "uuid"), RESOURCE_NAMES)


def test_each_stated_default_is_what_the_parser_applies_without_the_key() -> None:
    """A file with the key set to its stated default loads to the same config as one without the key."""
    differ = []
    checked = 0
    for key in KEYS:
        if not key.default:
            continue
        given = parse_document(document(key.path, yaml.safe_load(key.default)), RESOURCE_NAMES)
        left_out = parse_document(document(key.path, with_key=False), RESOURCE_NAMES)
        checked += 1
        if given != left_out:
            differ.append(key.path)
    assert checked > 25
    assert set(differ) == APPLIED_BY_A_COMMAND


def test_keys_read_and_not_honoured_say_why() -> None:
    not_honoured = {key.path: key.not_honoured for key in KEYS if key.not_honoured}
    assert set(not_honoured) == {"flags.gdrcopyEnabled", "flags.gdsEnabled", "flags.mofedEnabled",
                                 "flags.useNodeFeatureAPI", "flags.deviceDiscoveryStrategy",
                                 "flags.plugin.containerDriverRoot", "resources", "imex"}
    assert not_honoured["flags.deviceDiscoveryStrategy"].startswith("any value but `auto`: ")
