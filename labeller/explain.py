"""``gpu-labeller explain``: for each label, its value and where it came from; for a key not
produced, why not; for a key gpu-labeller never writes, who does.

Nothing here derives a label: the values and their provenance are the ``LabelSet`` the rules
produced (``labeller.labels.merge`` keeps each labeler's backend, source and rule), and the key
families with their upstream tools are the ``KeyDoc`` tables each vendor declares next to its
labelers. This module only puts them side by side. Pure: no I/O, no Kubernetes client.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from labeller.config import Config
from labeller.inventory import Inventory
from labeller.labels import NOT_OWNED_KEYS, NOT_OWNED_PREFIXES, KeyDoc, LabelSet, Provenance
from labeller.namedconfigs import APPLIED_LABEL, CONFIG_LABEL, STATE_LABEL
from labeller.nodelabels import present
from labeller.vendor import Vendor

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
           _CONFIG_DIR),
    KeyDoc(APPLIED_LABEL, "none: gpu-labeller's own key", _CONFIG_DIR),
)
assert CONFIG_LABEL in NOT_OWNED_KEYS


@dataclass(frozen=True)
class Entry:
    """A KeyDoc with the vendor whose labels it describes (None: not a vendor's)."""

    doc: KeyDoc
    vendor: Vendor | None


def presence_doc(vendor: Vendor) -> KeyDoc:
    return KeyDoc(vendor.labelling.presence_label, vendor.labelling.presence_upstream,
                  f"a {vendor.name} GPU is on the PCI bus or its backend describes one")


def catalog(vendors: Sequence[Vendor]) -> list[Entry]:
    """Every key family gpu-labeller knows, ours first: literal keys before templates."""
    entries = [Entry(presence_doc(v), v) for v in vendors]
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


_GROUPS = {"nvidia": "nvidia", "amd": "amd", "amdBeta": "amd_beta", "firmware": "firmware", "machine": "machine",
           "timestamp": "timestamp"}


def _group_on(config: Config, group: str) -> bool:
    return bool(getattr(config.labels, _GROUPS[group]))


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
    if doc.group and not _group_on(config, doc.group):
        return f"the label group labeller.labels.{doc.group} is off"
    if vendor is not None and not present(vendor, inventory):
        report = next((r for r in inventory.reports if r.backend == vendor.name), None)
        return f"no {vendor.name} GPU on this node" + (f" ({report.detail})" if report and report.detail else "")
    if vendor is not None and not any(p.vendor == vendor.name for p in inventory.parts):
        report = next((r for r in inventory.reports if r.backend == vendor.name), None)
        return f"the {vendor.name} backend did not describe the GPUs" + (f": {report.detail}" if report else "")
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
