"""The Labeler idea: something that returns labels, plus merging and Kubernetes label syntax.

A labeler is a pure function ``(Inventory, Config, Offer) -> dict[str, str]``: what discovery
found, the config, and what the node offers (``labeller.model.offer``). ``merge`` runs labelers in
order. Different labelers own different keys; when two of them produce the same key with
different values, that is a bug in the rules, so ``merge`` reports it instead of letting the last
one silently win.

Provenance comes from the same derivation: a labeler may return a value made with ``derived``
(a ``str`` that also carries its backend, exact source and rule); ``merge`` keeps the plain value
in ``LabelSet.labels`` and the how in ``LabelSet.sources``. A value returned as a plain ``str``
still gets a ``Provenance``: its labeler and that labeler's docstring. ``KeyDoc`` says, per key
family, who else writes the key and when gpu-labeller writes it (``gpu-labeller explain``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from labeller.model.config import Config
    from labeller.model.inventory import Inventory
    from labeller.model.offer import Offer

Labels = dict[str, str]
Labeler = Callable[["Inventory", "Config", "Offer"], Labels]

MAX_VALUE_LENGTH = 63
MAX_NAME_LENGTH = 63
MAX_PREFIX_LENGTH = 253

_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_PREFIX_RE = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*$")

# Label keys gpu-labeller may write, and remove when it set them itself. Everything else on a Node
# (users' labels, the GPU Operator's, ...) is never touched.
OWNED_PREFIXES: tuple[str, ...] = (
    "nvidia.com/gpu.",
    "nvidia.com/cuda.",
    "nvidia.com/mig.capable",
    "nvidia.com/mig.strategy",
    "nvidia.com/mig-",
    "nvidia.com/mps.capable",
    "nvidia.com/vgpu.",
    "nvidia.com/gfd.timestamp",
    "amd.com/gpu.",
    "beta.amd.com/gpu.",
    # the named config in force and whether it is the one asked for (labeller.model.namedconfigs); the
    # node label that asks, nvidia.com/device-plugin.config, is never ours (NOT_OWNED_KEYS)
    "nvidia.com/device-plugin.config.state",
    "nvidia.com/device-plugin.config.applied",
)
# Exact keys gpu-labeller may write (and remove when it set them): gpushare's node label, written while
# GPUs are offered by memory (sharing.memory).
OWNED_KEYS: tuple[str, ...] = ("gpushare",)
# Keys the GPU Operator and its managers read or write: never written or removed, not even by
# `cleanup --include-foreign`, whichever prefix they fall under.
NOT_OWNED_PREFIXES: tuple[str, ...] = (
    "nvidia.com/gpu.deploy.",  # GPU Operator: which operands run on the node
    "nvidia.com/gpu.workload.config",  # GPU Operator: container / vm-passthrough / vm-vgpu
    "nvidia.com/mig.config",  # MIG manager (also mig.config.state)
    "nvidia.com/vgpu.config",  # vGPU device manager (also vgpu.config.state)
)
NOT_OWNED_KEYS: tuple[str, ...] = (
    "nvidia.com/device-plugin.config",  # GPU Operator's device-plugin config choice (exact key only)
)

# The server-side-apply field manager gpu-labeller writes Node labels as: what it set is what
# managedFields list under this name. Never change it, or every label it set becomes "foreign".
FIELD_MANAGER = "gpu-labeller"


def owns(key: str) -> bool:
    """True if the key is one gpu-labeller may write (and remove, when it set the label itself)."""
    if key in NOT_OWNED_KEYS or key.startswith(NOT_OWNED_PREFIXES):
        return False
    return key in OWNED_KEYS or key.startswith(OWNED_PREFIXES)


def is_dns_label(value: str) -> bool:
    """A DNS-1123 label: what Kubernetes allows as a namespace's name (and a DRA device's)."""
    return len(value) <= MAX_NAME_LENGTH and re.fullmatch(_DNS_LABEL, value) is not None


def is_dns_subdomain(value: str) -> bool:
    """A DNS-1123 subdomain: what Kubernetes allows as most objects' names (a ResourceClaim's)."""
    return len(value) <= MAX_PREFIX_LENGTH and _PREFIX_RE.fullmatch(value) is not None


def is_valid_value(value: str) -> bool:
    return len(value) <= MAX_VALUE_LENGTH and _VALUE_RE.match(value) is not None


def key_problem(key: str) -> str | None:
    """Why ``key`` is not a valid label key, or None when it is."""
    prefix, _, name = key.rpartition("/")
    if not name:
        return "empty name"
    if len(name) > MAX_NAME_LENGTH:
        return f"name part longer than {MAX_NAME_LENGTH} characters"
    if not _NAME_RE.match(name):
        return "name part must be alphanumeric, '-', '_' or '.', starting and ending alphanumeric"
    if "/" in key and (len(prefix) > MAX_PREFIX_LENGTH or not _PREFIX_RE.match(prefix)):
        return "prefix is not a DNS subdomain"
    return None


_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9_.-]+")
_EDGE = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")


def sanitise_value(value: str) -> str:
    """Best-effort repair of a free-text value: bad characters to '-', trimmed to 63, clean ends."""
    cleaned = _NOT_ALLOWED.sub("-", value.strip())
    cleaned = _EDGE.sub("", cleaned)
    cleaned = _EDGE.sub("", cleaned[:MAX_VALUE_LENGTH])
    return cleaned


class Derived(str):
    """A label value that says where it came from; ``merge`` turns it back into a plain ``str``."""

    backend: str
    source: str
    rule: str


def derived(value: str, backend: str, source: str, rule: str = "") -> str:
    """``value``, carrying its ``backend`` ("nvml", "sysfs", "pci", "dmi", "config", "offer", ...),
    its exact ``source`` (the call or file and what it said) and the ``rule`` applied to it."""
    out = Derived(value)
    out.backend, out.source, out.rule = backend, source, rule
    return out


@dataclass(frozen=True)
class Provenance:
    """Where one label's value came from: the labeler that produced it, and what that labeler said."""

    labeler: str  # "vendors.nvidia.labels.gpu_resource_labels"
    backend: str
    source: str
    rule: str


def provenance(labeler: Callable[..., object], value: str) -> Provenance:
    name = f"{getattr(labeler, '__module__', '?')}.{getattr(labeler, '__name__', repr(labeler))}"
    if isinstance(value, Derived):
        return Provenance(name, value.backend, value.source, value.rule)
    doc = (getattr(labeler, "__doc__", None) or "").strip().split("\n")[0]
    return Provenance(name, "rules", doc or "(the labeler gives no detail)", "")


@dataclass(frozen=True)
class KeyDoc:
    """A family of label keys, for people: ``pattern`` is a key where ``<name>`` stands for any text
    (``nvidia.com/mig-<profile>.count``); ``writer`` says who writes it ("gpu-labeller", or the owner
    of a key gpu-labeller never writes), ``upstream`` which other tools write the same key, ``when``
    when gpu-labeller writes it (formatted with the config's ``mig_strategy`` and ``sharing``),
    ``group`` the ``labeller.labels`` group that turns it off, ``missing`` (from the probe) why
    the value it is made of is missing on this node, "" when it is not, and ``meaning`` what its value
    says (the labels reference, docs/reference/labels.md)."""

    pattern: str
    upstream: str
    when: str = ""
    group: str = ""
    writer: str = "gpu-labeller"
    missing: Callable[[Inventory], str] | None = None
    meaning: str = ""

    @property
    def regex(self) -> re.Pattern[str]:
        return _pattern_regex(self.pattern)

    @property
    def template(self) -> bool:
        return "<" in self.pattern


@functools.cache
def _pattern_regex(pattern: str) -> re.Pattern[str]:
    parts = re.split(r"<[^>]+>", pattern)
    return re.compile(".*".join(re.escape(part) for part in parts))


@dataclass
class LabelSet:
    """The result of labelling a node: valid labels plus what had to be dropped, and why, and where
    each value came from."""

    labels: Labels = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)  # key -> reason
    conflicts: list[str] = field(default_factory=list)
    sources: dict[str, Provenance] = field(default_factory=dict)  # key -> where its value came from

    def add(self, labels: Labels, labeler: Callable[..., object]) -> None:
        """Take ``labels`` from ``labeler``: plain values, with their provenance in ``sources``."""
        for key, value in labels.items():
            previous = self.labels.get(key)
            if previous is not None and previous != value:
                name = getattr(labeler, "__name__", repr(labeler))
                self.conflicts.append(f"{key}: {name} says {value!r}, an earlier labeler {previous!r}")
            self.labels[key] = str(value)
            self.sources[key] = provenance(labeler, value)

    def log_problems(self, log: Any) -> None:
        """One warning per dropped label and per conflict (the caller's logger carries the context)."""
        for key, reason in self.dropped.items():
            log.warning("label dropped", label=key, reason="invalid-label", detail=reason)
        for conflict in self.conflicts:
            log.warning("label conflict", reason="label-conflict", detail=conflict)


def merge(labelers: Iterable[Labeler], inventory: Inventory, config: Config, offer: Offer) -> LabelSet:
    """Run labelers in order and merge their output; report, never hide, conflicting values."""
    result = LabelSet()
    for labeler in labelers:
        result.add(labeler(inventory, config, offer), labeler)
    return result


def validated(label_set: LabelSet) -> LabelSet:
    """Drop, one by one, labels Kubernetes would reject; keep all the others."""
    out = LabelSet(dropped=dict(label_set.dropped), conflicts=list(label_set.conflicts),
                   sources=dict(label_set.sources))
    for key, value in label_set.labels.items():
        problem = key_problem(key)
        if problem is None and not is_valid_value(value):
            problem = f"invalid value {value!r}"
        if problem is None:
            out.labels[key] = value
        else:
            out.dropped[key] = problem
    return out

