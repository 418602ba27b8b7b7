"""The labelling daemon's pure decisions: which labels to aim for, what to write, when to back off.

Rules kept here:
- only keys with ``labels.owns(key)`` are ever written or removed;
- a label is removed only when gpu-labeller set it itself: its field manager is listed for that key
  in the object's ``metadata.managedFields`` (or an explicit migration option says so);
- a write happens only when the live labels differ from the desired ones (no idle writes);
- a failed or partial probe never removes a label: it may add or repair, never take away.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NewType

from labeller.model.labels import FIELD_MANAGER, owns

Labels = dict[str, str]
# Labels whose keys gpu-labeller may write: only ``owned()`` makes them. The probe's labels pass
# through it once on the way in (daemon.cli.probe_labels), a target's live labels once in the sink
# (Live), and ``plan`` takes nothing else, so a foreign key can never reach a write.
Owned = NewType("Owned", Labels)
Manager = tuple[str, str]  # (field manager, operation: "Apply" or "Update")
APPLIED_BY_US: Manager = (FIELD_MANAGER, "Apply")


def owned(labels: Mapping[str, str]) -> Owned:
    """The labels among ``labels`` whose keys gpu-labeller may write (by key prefix)."""
    return Owned({key: value for key, value in labels.items() if owns(key)})


@dataclass(frozen=True)
class ProbeResult:
    """What one probe produced: the owned labels, and whether they are the whole truth."""

    labels: Owned
    partial: bool = False
    error: str | None = None
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and not self.partial


def desired_after(result: ProbeResult, last_good: Owned | None) -> Owned:
    """The labels to aim for after a probe.

    Complete probe: its labels. Partial probe: the last good set, plus keys only this probe found
    (values already known are kept). Failed probe: the last good set (empty if there is none; the
    plan then keeps whatever is live, because a failed probe never removes).
    """
    if result.ok:
        return result.labels
    base = last_good or Owned({})
    if result.error is None:
        return Owned({**result.labels, **base})
    return base


# --------------------------------------------------------------------------- who set which label


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def label_managers(managed_fields: Iterable[Any]) -> dict[str, frozenset[Manager]]:
    """Label key -> the (manager, operation) pairs whose managedFields entry lists it.

    Entries of a subresource (``status``, ...) do not count: labels live in the main resource.
    """
    found: dict[str, set[Manager]] = {}
    for entry in managed_fields:
        entry = _mapping(entry)
        if entry.get("subresource") or entry.get("fieldsType", "FieldsV1") != "FieldsV1":
            continue
        fields = _mapping(_mapping(_mapping(entry.get("fieldsV1")).get("f:metadata")).get("f:labels"))
        manager = (str(entry.get("manager", "")), str(entry.get("operation", "")))
        for name in fields:
            if name.startswith("f:"):
                found.setdefault(name[2:], set()).add(manager)
    return {key: frozenset(managers) for key, managers in found.items()}


@dataclass(frozen=True)
class Live:
    """The labels under gpu-labeller's prefixes on a target now, and who set each of them."""

    labels: Owned = field(default_factory=lambda: Owned({}))
    managers: Mapping[str, frozenset[Manager]] = field(default_factory=dict)
    resource_version: str = field(default="", compare=False)  # of the object it was read from
    # The target holds the right labels but must be rewritten anyway (a features file near its expiry).
    refresh_due: bool = field(default=False, compare=False)

    @classmethod
    def of_node(cls, obj: Mapping[str, Any]) -> Live:
        metadata = _mapping(obj.get("metadata"))
        labels = owned(_mapping(metadata.get("labels")))
        managers = label_managers(metadata.get("managedFields") or [])
        return cls(labels, {key: managers.get(key, frozenset()) for key in labels},
                   str(metadata.get("resourceVersion") or ""))

    @classmethod
    def written_by_us(cls, labels: Mapping[str, str], refresh_due: bool = False) -> Live:
        """A target only gpu-labeller writes (its features file, its NodeFeature): every label is ours."""
        ours = owned(labels)
        return cls(ours, {key: frozenset({APPLIED_BY_US}) for key in ours}, refresh_due=refresh_due)

    def applied_by_us(self, key: str) -> bool:
        return APPLIED_BY_US in self.managers.get(key, ())

    def set_only_by_us(self, key: str) -> bool:
        """Every manager of the key is gpu-labeller (through apply, or an update by an older version)."""
        return self.names(key) == (FIELD_MANAGER,)

    def ours(self, key: str) -> bool:
        """gpu-labeller manages the key: it applied it, or nobody but gpu-labeller ever set it."""
        return self.applied_by_us(key) or self.set_only_by_us(key)

    def names(self, key: str) -> tuple[str, ...]:
        """The managers that set the key, sorted; empty when managedFields list nobody."""
        return tuple(sorted({name for name, _ in self.managers.get(key, ())}))


def managers_text(names: tuple[str, ...]) -> str:
    return ", ".join(names) if names else "no recorded manager"


# --------------------------------------------------------------------------- what to write


@dataclass(frozen=True)
class Change:
    """What to do so that the target's labels become the desired ones.

    ``labels`` is the whole set gpu-labeller applies. A key it applied before and leaves out is
    dropped by the apply: ``removed`` when gpu-labeller was its only manager, ``relinquished`` when
    another manager also set it (the label stays, theirs). ``patch_out`` are removed keys an apply
    cannot drop (set through an update, or foreign with ``include_foreign``): a merge patch does.
    A change that ``needed`` but touches no ``keys`` only refreshes the target (its expiry).
    """

    labels: Labels
    added: Labels = field(default_factory=dict)
    changed: dict[str, tuple[str, str]] = field(default_factory=dict)
    adopted: dict[str, tuple[str, ...]] = field(default_factory=dict)  # key -> managers that set it before
    removed: tuple[str, ...] = ()
    relinquished: tuple[str, ...] = ()
    patch_out: dict[str, tuple[str, ...]] = field(default_factory=dict)  # key -> its managers
    foreign: dict[str, tuple[str, ...]] = field(default_factory=dict)  # left alone: key -> its managers
    apply: bool = False

    @property
    def needed(self) -> bool:
        return self.apply or bool(self.patch_out)

    @property
    def keys(self) -> set[str]:
        return set(self.added) | set(self.changed) | set(self.adopted) | set(self.removed) | set(self.relinquished)

    def summary(self) -> dict[str, Any]:
        return {"added": sorted(self.added), "changed": sorted(self.changed), "removed": list(self.removed),
                "adopted": sorted(self.adopted), "relinquished": list(self.relinquished)}


def plan(live: Live, desired: Owned, probe_ok: bool, include_foreign: bool = False) -> Change:
    """What to write so that the live labels become ``desired``.

    Computed keys are applied and so taken over (adopted) from whoever set them. Keys gpu-labeller
    manages and no longer computes leave; keys other managers set under our prefixes stay, unless
    ``include_foreign`` (``cleanup --include-foreign``). After a failed or partial probe
    (``probe_ok`` False) nothing is removed: the labels gpu-labeller manages stay in the applied set.
    """
    want = dict(desired)
    ours = {key: value for key, value in live.labels.items() if live.ours(key)}
    if not probe_ok:
        want = {**ours, **want}
    added = {k: v for k, v in want.items() if k not in live.labels}
    changed = {k: (live.labels[k], v) for k, v in want.items() if k in live.labels and live.labels[k] != v}
    adopted = {k: live.names(k) for k in want if k in live.labels and not live.applied_by_us(k)}
    dropped = sorted(set(ours) - set(want))
    removed = [k for k in dropped if live.set_only_by_us(k)]
    relinquished = tuple(k for k in dropped if not live.set_only_by_us(k))
    patch_out = {k: live.names(k) for k in removed if not live.managers[k] <= {APPLIED_BY_US}}
    foreign = {k: live.names(k) for k in sorted(live.labels) if k not in want and not live.ours(k)}
    if include_foreign:
        removed = sorted([*removed, *foreign])
        patch_out, foreign = {**patch_out, **foreign}, {}
    apply = bool(added or changed or adopted or any(live.applied_by_us(k) for k in dropped) or live.refresh_due)
    return Change(want, added, changed, adopted, tuple(removed), relinquished, patch_out, foreign, apply)


# --------------------------------------------------------------------------- pacing


@dataclass
class _Streak:
    """One key's run of losses: our writes of it that another writer undid."""

    last_loss: float
    tokens: float
    topped_up: float
    losing_s: float = 0.0  # time spent losing: the gaps between this streak's losses
    losses: int = 0


class FightGuard:
    """Paces the repair of labels that another writer keeps undoing, so a fight never hot-loops and
    ends as soon as the other writer stops.

    A *loss* is a successful write of ours that someone else undid. Per key, each repair spends a
    token from a bucket of ``burst``; a token comes back every ``max(base_s, share × time spent
    losing)``, at most ``max_s``. Time spent losing adds up the gaps between losses, each counted at
    most twice the pace then in force, so an outage or a quiet spell between two losses adds little.
    Against a controller that undoes every write at once, the write rate therefore falls off (about
    ``1/share`` writes per doubling of the fight's length); when a person's ``kubectl label`` loop
    stops, our value is back within ``share`` of the time the fight lasted (0.5 s after a 10 s
    fight). A key whose value stayed ours for ``peace_s`` before it was undone starts a new streak.
    Failed writes are not losses and spend nothing.
    """

    def __init__(self, burst: int = 3, base_s: float = 0.5, share: float = 0.04, max_s: float = 300.0,
                 peace_s: float = 30.0, report_after: int = 3) -> None:
        self.burst, self.base_s, self.share, self.max_s = burst, base_s, share, max_s
        self.peace_s, self.report_after = peace_s, report_after
        self.streaks: dict[str, _Streak] = {}
        self.last_write: dict[str, float] = {}
        self._loss_counted: dict[str, float] = {}  # key -> time of the write whose undoing was counted

    def lost(self, key: str, now: float) -> bool:
        """Our last write of ``key`` was undone. True when this loss makes it a fight worth reporting."""
        wrote = self.last_write.get(key)
        if wrote is None or self._loss_counted.get(key) == wrote:
            return False  # no successful write since the last counted loss: nothing new was lost
        self._loss_counted[key] = wrote
        streak = self.streaks.get(key)
        if streak is None or now - wrote >= self.peace_s:
            streak = self.streaks[key] = _Streak(last_loss=now, tokens=float(self.burst), topped_up=now)
        else:
            streak.losing_s += min(now - streak.last_loss, 2 * self.interval_s(key))
            streak.last_loss = now
        streak.losses += 1
        return streak.losses == self.report_after

    def interval_s(self, key: str) -> float:
        """Seconds per token for ``key`` now."""
        streak = self.streaks.get(key)
        losing_s = streak.losing_s if streak else 0.0
        return min(self.max_s, max(self.base_s, self.share * losing_s))

    def wait_s(self, key: str, now: float) -> float:
        """Seconds before a repair of ``key`` may be written (0: now)."""
        streak = self.streaks.get(key)
        if streak is None:
            return 0.0
        interval = self.interval_s(key)
        streak.tokens = min(float(self.burst), streak.tokens + (now - streak.topped_up) / interval)
        streak.topped_up = now
        return 0.0 if streak.tokens >= 1.0 else (1.0 - streak.tokens) * interval

    def wrote(self, keys: Iterable[str], now: float) -> None:
        """Our write of ``keys`` succeeded: spend a token for each repaired one."""
        for key in keys:
            self.last_write[key] = now
            streak = self.streaks.get(key)
            if streak is not None:
                self.wait_s(key, now)  # top up first
                streak.tokens = max(0.0, streak.tokens - 1.0)
