"""``gpu-labeller explain``: for each label, its value and where it came from; for a key not
produced, why not; for a key gpu-labeller never writes, who does. The same for the attributes and
capacities of the DRA devices (``gpu.nvidia.com/productName``): their values, where each came from,
and which upstream DRA driver defines them.

Nothing here derives a label: the values and their provenance are the ``LabelSet`` the rules
produced (``labeller.model.labels.merge`` keeps each labeler's backend, source and rule), and the key
families with their upstream tools are the ``KeyDoc`` tables each vendor declares next to its
labelers. This module only puts them side by side. Pure: no I/O, no Kubernetes client.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from labeller.model.config import Config
from labeller.model.inventory import Inventory
from labeller.model.labels import NOT_OWNED_KEYS, NOT_OWNED_PREFIXES, KeyDoc, LabelSet, Provenance
from labeller.model.namedconfigs import APPLIED_LABEL, CONFIG_LABEL, STATE_LABEL
from labeller.model.nodelabels import present
from labeller.model.resourceslices import Attribute, Capacity, DraDevice, quantity
from labeller.model.vendor import Vendor
from labeller.model.vendor.dra import AttributeDoc

_OPERATOR = "the NVIDIA GPU Operator (or its MIG/vGPU managers)"
_CONFIG_DIR = "configs come from --config-dir (run, device-plugin; on a dry run --config-dir with --config-name)"

# Keys people meet next to ours, which gpu-labeller never writes: what to tell them.
FOREIGN_DOCS: tuple[KeyDoc, ...] = (
    *(KeyDoc(f"{prefix}<rest>", "", "", writer=_OPERATOR) for prefix in NOT_OWNED_PREFIXES),
    *(KeyDoc(key, "", "", writer="people or the GPU Operator: it asks for a named config, which gpu-labeller reads")
      for key in NOT_OWNED_KEYS),
    KeyDoc("feature.node.kubernetes.io/pci-<class_vendor>.present", "", "", writer="Node Feature Discovery (NFD)'s "
           "PCI source (select on nvidia.com/gpu.present or amd.com/gpu.present instead)"),
    KeyDoc("feature.node.kubernetes.io/<feature>", "", "", writer="Node Feature Discovery (NFD)"),
)
STATE_DOCS: tuple[KeyDoc, ...] = (
    KeyDoc(STATE_LABEL, "none: gpu-labeller's own key (NVIDIA's config-manager reads the config label only)",
           _CONFIG_DIR, meaning="`success` when the named config the node asks for (its config label) is the one "
                                "in force, else `failed`"),
    KeyDoc(APPLIED_LABEL, "none: gpu-labeller's own key", _CONFIG_DIR,
           meaning="the name of the named config in force"),
)
assert CONFIG_LABEL in NOT_OWNED_KEYS


@dataclass(frozen=True)
class Entry:
    """A KeyDoc with the vendor whose labels it describes (None: not a vendor's)."""

    doc: KeyDoc
    vendor: Vendor | None


def presence_doc(vendor: Vendor) -> KeyDoc:
    return KeyDoc(vendor.labelling.presence_label, vendor.labelling.presence_upstream,
                  f"a {vendor.name} GPU is on the PCI bus or its backend describes one",
                  meaning="`true`: the node has a GPU of this vendor (the device plugin's DaemonSet selects on it)")


def dra_doc(vendor: Vendor, driver: str, label: str) -> KeyDoc:
    return KeyDoc(label, "none: gpu-labeller's own key",
                  f"labeller.dra.vendors names {vendor.name} and a {vendor.name} GPU is present: DRA ({driver}) "
                  "serves its GPUs, the device plugin does not advertise them",
                  meaning=f"`true`: the node serves this vendor's GPUs through DRA (ResourceSlices of {driver}), "
                          "not as extended resources")


def catalog(vendors: Sequence[Vendor]) -> list[Entry]:
    """Every key family gpu-labeller knows, ours first: literal keys before templates."""
    entries = [Entry(presence_doc(v), v) for v in vendors]
    entries += [Entry(dra_doc(v, v.dra.driver, v.dra.served_label), v) for v in vendors if v.dra is not None]
    entries += [Entry(doc, v) for v in vendors for doc in v.labelling.key_docs]
    entries += [Entry(doc, None) for doc in (*STATE_DOCS, *FOREIGN_DOCS)]
    return sorted(entries, key=lambda e: (e.doc.template, e.doc.writer != "gpu-labeller"))


def find(key: str, entries: Iterable[Entry]) -> Entry | None:
    """The entry describing ``key``: an exact key, else the template with the longest fixed text."""
    candidates = [e for e in entries if e.doc.regex.fullmatch(key)]
    if not candidates:
        return None
    return max(candidates, key=lambda e: (not e.doc.template, len(e.doc.pattern.split("<")[0])))


def known_keys(entries: Iterable[Entry]) -> list[str]:
    """The literal keys gpu-labeller writes (templates left out), for completion and suggestions."""
    return sorted({e.doc.pattern for e in entries if not e.doc.template and e.doc.writer == "gpu-labeller"})


def closest(key: str, candidates: Iterable[str]) -> str | None:
    found = difflib.get_close_matches(key, list(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


@dataclass(frozen=True)
class Explanation:
    key: str
    value: str | None  # None: not produced on this node
    provenance: Provenance | None
    upstream: str  # which other tools write the same key
    why_not: str = ""  # why it is not produced (or whose key it is)
    known: bool = True
    suggestion: str | None = None

    def document(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "produced": self.value is not None, "known": self.known}
        if self.value is not None:
            out["value"] = self.value
        if self.provenance is not None:
            out |= {"backend": self.provenance.backend, "source": self.provenance.source,
                    "rule": self.provenance.rule, "labeler": self.provenance.labeler}
        if self.upstream:
            out["upstream"] = self.upstream
        if self.why_not:
            out["why_not"] = self.why_not
        if self.suggestion:
            out["suggestion"] = self.suggestion
        return out

    def text(self) -> str:
        if self.value is not None and self.provenance is not None:
            p = self.provenance
            lines = [f"{self.key}={self.value}", f"  backend:  {p.backend}", f"  source:   {p.source}"]
            lines += [f"  rule:     {p.rule}"] if p.rule else []
            lines += [f"  labeler:  {p.labeler}", f"  upstream: {self.upstream or 'unknown'}"]
            return "\n".join(lines) + "\n"
        hint = f"; did you mean {self.suggestion}?" if self.suggestion else ""
        line = f"{self.key}: {'not produced' if self.known else 'unknown'}: {self.why_not}{hint}"
        return line + (f"\n  upstream: {self.upstream}" if self.upstream else "") + "\n"


def _group_on(config: Config, vendor: Vendor, group: str) -> bool:
    """Whether the label group ``labeller.labels.<group>``, one of ``vendor``'s keys, is on."""
    return bool(vendor.settings.value(config, f"labeller.labels.{group}"))


def why_not(key: str, entry: Entry, label_set: LabelSet, inventory: Inventory, config: Config,
            selection_in_use: bool) -> str:
    """Why gpu-labeller does not write ``key`` on this node, first cause first."""
    doc, vendor = entry.doc, entry.vendor
    if doc.writer != "gpu-labeller":
        return f"owned by {doc.writer}; gpu-labeller never writes or removes it"
    if key in label_set.dropped:
        return f"computed but dropped, Kubernetes would reject it: {label_set.dropped[key]}"
    if vendor is not None and not vendor.labelling.enabled(config):
        return f"the {vendor.name} label groups are off in the config (labeller.labels)"
    if doc.group and vendor is not None and not _group_on(config, vendor, doc.group):
        return f"the label group labeller.labels.{doc.group} is off"
    if vendor is not None and not present(vendor, inventory):
        report = next((r for r in inventory.reports if r.backend == vendor.name), None)
        return f"no {vendor.name} GPU on this node" + (f" ({report.detail})" if report and report.detail else "")
    if vendor is not None and not any(p.vendor == vendor.name for p in inventory.parts):
        report = next((r for r in inventory.reports if r.backend == vendor.name), None)
        return f"the {vendor.name} backend did not describe the GPUs" + (f": {report.detail}" if report else "")
    if doc.missing is not None and (missing := doc.missing(inventory)):
        return missing
    if doc in STATE_DOCS and not selection_in_use:
        return f"written only when {doc.when}"
    when = doc.when.format(mig_strategy=config.mig_strategy, sharing="mps" if config.sharing.strategy == "mps"
                           else "timeSlicing")
    return f"written only when {when}" if when else "not produced on this node"


def explain(keys: Sequence[str], label_set: LabelSet, inventory: Inventory, config: Config,
            vendors: Sequence[Vendor], selection_in_use: bool = False) -> list[Explanation]:
    """One explanation per key asked for; no keys: every label produced, in key order."""
    entries = catalog(vendors)
    out = []
    for key in keys or sorted(label_set.labels):
        entry = find(key, entries)
        upstream = entry.doc.upstream if entry is not None else ""
        if key in label_set.labels:
            out.append(Explanation(key, label_set.labels[key], label_set.sources.get(key), upstream))
        elif entry is None:
            suggestion = closest(key, [*known_keys(entries), *label_set.labels])
            out.append(Explanation(key, None, None, "", "not a gpu-labeller key", known=False, suggestion=suggestion))
        else:
            reason = why_not(key, entry, label_set, inventory, config, selection_in_use)
            out.append(Explanation(key, None, label_set.sources.get(key), upstream, reason))
    return out


# --- DRA attributes and capacities ---------------------------------------------------------------
# ``<driver>/<name>`` (``gpu.nvidia.com/productName``, ``gpu.amd.com/memory``) names an attribute or
# capacity of a vendor's DRA devices as a CEL selector or matchAttribute does; Kubernetes' standard
# attributes keep their own domain (``resource.kubernetes.io/pciBusID``); the driver alone
# (``gpu.nvidia.com``) asks for every one its devices publish here.

STANDARD_DOMAIN = "resource.kubernetes.io"


def _drivers(vendors: Sequence[Vendor]) -> dict[str, Vendor]:
    return {v.dra.driver: v for v in vendors if v.dra is not None}


def is_attribute_key(key: str, vendors: Sequence[Vendor]) -> bool:
    """Whether ``key`` names a DRA driver, one of its attributes or capacities, or a standard attribute."""
    drivers = _drivers(vendors)
    return key in drivers or key.rpartition("/")[0] in (*drivers, STANDARD_DOMAIN)


@dataclass(frozen=True)
class ValueGroup:
    """Devices that publish the same value, with where the first of them got it."""

    value: str
    devices: tuple[str, ...]
    backend: str
    source: str
    rule: str


@dataclass(frozen=True)
class AttributeExplanation:
    key: str  # as asked, or <driver>/<name> when the driver alone was asked
    driver: str
    kind: str  # the attribute's type, or "capacity"
    groups: tuple[ValueGroup, ...]  # empty: not published on this node
    meaning: str = ""
    upstream: str = ""
    why_not: str = ""
    served: str = ""  # whether the node publishes it (DRA serves the vendor), for people
    known: bool = True
    suggestion: str | None = None

    def document(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "driver": self.driver, "kind": self.kind,
                               "produced": bool(self.groups), "known": self.known}
        if self.groups:
            out["values"] = [{"value": g.value, "devices": list(g.devices), "backend": g.backend, "source": g.source,
                              "rule": g.rule} for g in self.groups]
            out["published"] = self.served
        for name in ("meaning", "upstream", "why_not", "suggestion"):
            if getattr(self, name):
                out[name] = getattr(self, name)
        return out

    def text(self) -> str:
        if not self.groups:
            hint = f"; did you mean {self.suggestion}?" if self.suggestion else ""
            line = f"{self.key}: {'not produced' if self.known else 'unknown'}: {self.why_not}{hint}"
            return line + (f"\n  upstream: {self.upstream}" if self.upstream else "") + "\n"
        count = sum(len(g.devices) for g in self.groups)
        lines = [f"{self.key} ({self.kind}, {self.driver}), on {count} device{'s' if count > 1 else ''}:"]
        for group in self.groups:
            lines.append(f"  = {group.value}: {_device_list(group.devices)}")
            lines += [f"    backend:  {group.backend}", f"    source:   {group.source}"]
            lines += [f"    rule:     {group.rule}"] if group.rule else []
        lines += [f"  meaning:  {self.meaning}"] if self.meaning else []
        lines += [f"  upstream: {self.upstream or 'unknown'}", f"  published: {self.served}"]
        return "\n".join(lines) + "\n"


def _device_list(names: Sequence[str]) -> str:
    shown = ", ".join(names[:4])
    return f"{shown}, ... ({len(names)} devices)" if len(names) > 4 else shown


def _value_text(item: Attribute | Capacity) -> str:
    if isinstance(item, Capacity):
        return quantity(item.value)
    return str(item.value).lower() if isinstance(item.value, bool) else str(item.value)


def _doc(vendor: Vendor, name: str) -> AttributeDoc | None:
    assert vendor.dra is not None
    docs = vendor.dra.attribute_docs
    exact = next((d for d in docs if d.name == name), None)
    return exact or next((d for d in docs if "<" in d.name and KeyDoc(d.name, "").regex.fullmatch(name)), None)


def _one(name: str, vendor: Vendor, devices: Sequence[DraDevice], config: Config, inventory: Inventory,
         asked: str) -> AttributeExplanation:
    assert vendor.dra is not None
    driver = vendor.dra.driver
    doc = _doc(vendor, name)
    groups: dict[str, list[tuple[DraDevice, Attribute | Capacity]]] = {}
    for device in devices:
        item = device.attributes.get(name) or device.capacity.get(name)
        if item is not None:
            groups.setdefault(_value_text(item), []).append((device, item))
    kind = doc.kind if doc is not None else ("capacity" if any(isinstance(i, Capacity) for g in groups.values()
                                                               for _, i in g) else "")
    meaning, upstream = (doc.meaning, doc.upstream) if doc is not None else ("", "")
    if doc is None and not groups:
        names = [d.name for d in vendor.dra.attribute_docs if "<" not in d.name]
        return AttributeExplanation(asked, driver, "", (), why_not=f"not an attribute or capacity of {driver}",
                                    known=False, suggestion=closest(name, names))
    if not groups:
        if doc is not None and doc.renamed_to:
            why = f"no longer published: renamed to {doc.renamed_to}, which a claim should read instead"
        elif not devices:
            report = next((r for r in inventory.reports if r.backend == vendor.name), None)
            why = f"no {vendor.name} GPU on this node" + (f" ({report.detail})" if report and report.detail else "")
        else:
            why = f"none of the {len(devices)} {driver} devices here has it: {meaning}"
        return AttributeExplanation(asked, driver, kind, (), meaning, upstream, why)
    served = ("yes: labeller.dra.vendors names " + vendor.name if config.served_by_dra(vendor.name)
              else f"no: labeller.dra.vendors does not name {vendor.name} (preview: resourceslices --dra-vendors "
                   f"{vendor.name})")
    value_groups = tuple(ValueGroup(value, tuple(d.name for d, _ in members), members[0][1].backend,
                                    members[0][1].source, members[0][1].rule) for value, members in groups.items())
    return AttributeExplanation(asked, driver, kind, value_groups, meaning, upstream, served=served)


def explain_attributes(key: str, devices_by_driver: Mapping[str, Sequence[DraDevice]], inventory: Inventory,
                       config: Config, vendors: Sequence[Vendor]) -> list[AttributeExplanation]:
    """The explanations of one attribute key (``is_attribute_key``): one per driver it concerns.
    ``devices_by_driver``: every vendor's DRA devices here, served or not."""
    drivers = _drivers(vendors)
    if key in drivers:
        devices = devices_by_driver.get(key, ())
        names = sorted({n for d in devices for n in (*d.attributes, *d.capacity)})
        return [_one(name, drivers[key], devices, config, inventory, name if "/" in name else f"{key}/{name}")
                for name in names] or [
            _one("type", drivers[key], devices, config, inventory, key)]
    domain, _, name = key.rpartition("/")
    if domain == STANDARD_DOMAIN:
        return [_one(key, vendor, devices_by_driver.get(driver, ()), config, inventory, key)
                for driver, vendor in drivers.items() if _doc(vendor, key) is not None]
    return [_one(name, drivers[domain], devices_by_driver.get(domain, ()), config, inventory, key)]
