"""Kubernetes label selectors and node affinity, evaluated against label sets (``gpu-labeller match``).

- A selector string as ``kubectl -l`` takes it (apimachinery ``labels.Parse``): requirements joined
  by commas, each ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k``, ``!k``,
  ``k>n``, ``k<n``.
- A node affinity document (YAML or JSON): ``nodeSelectorTerms`` are ORed, the ``matchExpressions``
  of one term ANDed (``In``, ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt``, ``Lt``); a ``nodeSelector``
  map is ANDed with every term. Accepted at any of these depths: a Pod, a workload (Deployment,
  Job, ... with ``spec.template.spec``), a pod spec, ``affinity``, ``nodeAffinity``, the required
  node selector, or a bare ``nodeSelector`` map.

Semantics as the scheduler's: ``!=`` and ``NotIn`` match a node without the key; ``Gt``/``Lt`` need
the label to be an integer and compare strictly. Pure: no I/O but reading the file it is given.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from labeller.model.documents import DocumentError, read_document
from labeller.base.errors import InputError
from labeller.model.labels import is_valid_value, key_problem

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
OPERATORS: tuple[Operator, ...] = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
NAME_FIELD = "metadata.name"


class SelectorError(InputError, ValueError):
    """A selector or affinity that Kubernetes would reject: one line naming the place."""


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.operator == "Exists":
            return value is not None
        if self.operator == "DoesNotExist":
            return value is None
        if self.operator == "In":
            return value is not None and value in self.values
        if self.operator == "NotIn":
            return value is None or value not in self.values
        number = _integer(value) if value is not None else None
        if number is None:
            return False
        bound = int(self.values[0])
        return number > bound if self.operator == "Gt" else number < bound

    def text(self) -> str:
        """The requirement in selector syntax."""
        if self.operator == "Exists":
            return self.key
        if self.operator == "DoesNotExist":
            return f"!{self.key}"
        if self.operator in ("Gt", "Lt"):
            return f"{self.key}{'>' if self.operator == 'Gt' else '<'}{self.values[0]}"
        if len(self.values) == 1:
            return f"{self.key}{'=' if self.operator == 'In' else '!='}{self.values[0]}"
        return f"{self.key} {self.operator.lower()} ({','.join(self.values)})"


def _integer(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class Term:
    """Requirements that must all hold: on labels (``requirements``) and on the node's name (``fields``)."""

    requirements: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()

    def failures(self, labels: Mapping[str, str], name: str) -> list[Requirement]:
        failed = [r for r in self.requirements if not r.matches(labels)]
        return failed + [r for r in self.fields if not r.matches({NAME_FIELD: name})]


@dataclass(frozen=True)
class Selector:
    """Terms ORed: a node matches when one term holds entirely. No terms matches every node."""

    terms: tuple[Term, ...] = (Term(),)

    def evaluate(self, labels: Mapping[str, str], name: str = "") -> Outcome:
        best: list[Requirement] | None = None
        for index, term in enumerate(self.terms):
            failed = term.failures(labels, name)
            if not failed:
                return Outcome(True, index)
            if best is None or len(failed) < len(best):
                best, best_index = failed, index
        return Outcome(False, best_index, tuple(best or ()))

    def text(self) -> str:
        return " OR ".join(",".join(r.text() for r in (*t.requirements, *t.fields)) or "(everything)"
                           for t in self.terms)


@dataclass(frozen=True)
class Outcome:
    matched: bool
    term: int  # the term that matched, or the one that came closest
    failed: tuple[Requirement, ...] = field(default=())


# --- selector strings ---------------------------------------------------------------------------

_KEY = re.compile(r"[A-Za-z0-9_./-]+")
_VALUE = re.compile(r"[A-Za-z0-9_.-]*")


class _Parser:
    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def fail(self, expected: str) -> SelectorError:
        found = repr(self.text[self.pos]) if self.pos < len(self.text) else "the end"
        return SelectorError(f"selector {self.text!r}: at character {self.pos + 1}: expected {expected}, found {found}")

    def space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def take(self, token: str) -> bool:
        if self.text.startswith(token, self.pos):
            self.pos += len(token)
            return True
        return False

    def word(self, pattern: re.Pattern[str], what: str) -> str:
        match = pattern.match(self.text, self.pos)
        if match is None or (not match.group() and what == "a label key"):
            raise self.fail(what)
        self.pos = match.end()
        return match.group()

    def key(self) -> str:
        self.space()
        key = self.word(_KEY, "a label key")
        problem = key_problem(key)
        if problem:
            raise SelectorError(f"selector {self.text!r}: key {key!r}: {problem}")
        return key

    def value(self) -> str:
        self.space()
        value = self.word(_VALUE, "a value")
        if not is_valid_value(value):
            raise SelectorError(f"selector {self.text!r}: value {value!r} is not a valid label value "
                                "(at most 63 characters: alphanumerics, '-', '_', '.', alphanumeric at both ends)")
        return value

    def value_set(self, operator: str) -> tuple[str, ...]:
        self.space()
        if not self.take("("):
            raise self.fail(f"'(' after {operator}")
        values = [self.value()]
        self.space()
        while self.take(","):
            values.append(self.value())
            self.space()
        if not self.take(")"):
            raise self.fail("',' or ')'")
        if values == [""]:
            raise SelectorError(f"selector {self.text!r}: {operator} needs at least one value")
        return tuple(values)

    def requirement(self) -> Requirement:
        self.space()
        if self.take("!"):
            return Requirement(self.key(), "DoesNotExist")
        key = self.key()
        self.space()
        if self.pos == len(self.text) or self.text[self.pos] == ",":
            return Requirement(key, "Exists")
        if self.take("==") or self.take("="):
            return Requirement(key, "In", (self.value(),))
        if self.take("!="):
            return Requirement(key, "NotIn", (self.value(),))
        for symbol, operator in ((">", "Gt"), ("<", "Lt")):
            if self.take(symbol):
                self.space()
                number = self.word(re.compile(r"-?\d+"), "an integer")
                return Requirement(key, operator, (number,))  # type: ignore[arg-type]
        for word, operator in (("notin", "NotIn"), ("in", "In")):
            if re.match(rf"{word}(\s|\()", self.text[self.pos:]):
                self.pos += len(word)
                return Requirement(key, operator, self.value_set(word))  # type: ignore[arg-type]
        raise self.fail("'=', '==', '!=', 'in', 'notin', '>', '<', ',' or the end")

    def parse(self) -> Term:
        if not self.text.strip():
            return Term()
        requirements = [self.requirement()]
        self.space()
        while self.take(","):
            requirements.append(self.requirement())
            self.space()
        if self.pos != len(self.text):
            raise self.fail("',' or the end")
        return Term(tuple(requirements))


def parse_selector(text: str) -> Selector:
    """A selector string as ``kubectl get nodes -l`` takes it; SelectorError naming the place."""
    return Selector((_Parser(text).parse(),))


# --- node affinity documents --------------------------------------------------------------------

def _requirement(raw: Any, where: str, fields: bool) -> Requirement:
    if not isinstance(raw, Mapping):
        raise SelectorError(f"{where}: must be a mapping with key, operator and values")
    unknown = sorted(set(raw) - {"key", "operator", "values"})
    if unknown:
        raise SelectorError(f"{where}: unknown field {unknown[0]!r} (key, operator, values)")
    key, operator, values = raw.get("key"), raw.get("operator"), raw.get("values") or []
    if not isinstance(key, str) or not key:
        raise SelectorError(f"{where}.key: a label key is required")
    if fields:
        if key != NAME_FIELD:
            raise SelectorError(f"{where}.key: matchFields supports only {NAME_FIELD}, not {key!r}")
    elif (problem := key_problem(key)) is not None:
        raise SelectorError(f"{where}.key: {key!r}: {problem}")
    if operator not in OPERATORS or (fields and operator not in ("In", "NotIn")):
        allowed = "In, NotIn" if fields else ", ".join(OPERATORS)
        raise SelectorError(f"{where}.operator: {operator!r} is not one of {allowed}")
    if not isinstance(values, list) or not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in values):
        raise SelectorError(f"{where}.values: must be a list of strings")
    texts = tuple(str(v) for v in values)
    if operator in ("In", "NotIn") and not texts:
        raise SelectorError(f"{where}.values: {operator} needs at least one value")
    if operator in ("Exists", "DoesNotExist") and texts:
        raise SelectorError(f"{where}.values: {operator} takes no values")
    if operator in ("Gt", "Lt") and (len(texts) != 1 or _integer(texts[0]) is None):
        raise SelectorError(f"{where}.values: {operator} takes exactly one integer value")
    bad = next((v for v in texts if not is_valid_value(v)), None) if not fields else None
    if bad is not None:
        raise SelectorError(f"{where}.values: {bad!r} is not a valid label value")
    return Requirement(key, operator, texts)


def _terms(raw: Any, where: str) -> list[Term]:
    if not isinstance(raw, list) or not raw:
        raise SelectorError(f"{where}: must be a non-empty list of terms")
    terms = []
    for i, term in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(term, Mapping) or set(term) - {"matchExpressions", "matchFields"}:
            raise SelectorError(f"{at}: a term has matchExpressions and matchFields only")
        expressions = [_requirement(e, f"{at}.matchExpressions[{j}]", False)
                       for j, e in enumerate(_list(term.get("matchExpressions"), f"{at}.matchExpressions"))]
        fields = [_requirement(e, f"{at}.matchFields[{j}]", True)
                  for j, e in enumerate(_list(term.get("matchFields"), f"{at}.matchFields"))]
        if not expressions and not fields:
            raise SelectorError(f"{at}: an empty term matches no node")
        terms.append(Term(tuple(expressions), tuple(fields)))
    return terms


def _list(raw: Any, where: str) -> list[Any]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise SelectorError(f"{where}: must be a list")
    return raw


def _node_selector_map(raw: Any, where: str) -> list[Requirement]:
    if not isinstance(raw, Mapping):
        raise SelectorError(f"{where}: must be a map of label keys to values")
    out = []
    for key, value in raw.items():
        if not isinstance(key, str) or (problem := key_problem(key)) is not None:
            raise SelectorError(f"{where}: key {key!r}: {problem or 'not a string'}")
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if value is None or not is_valid_value(text):
            raise SelectorError(f"{where}.{key}: {value!r} is not a valid label value")
        out.append(Requirement(key, "In", (text,)))
    return out


def _pod_spec(document: Mapping[str, Any]) -> Mapping[str, Any]:
    """The pod spec inside a Pod or a workload, else the document itself."""
    spec = document.get("spec")
    if isinstance(spec, Mapping):
        template = spec.get("template") or spec.get("jobTemplate", {}).get("spec", {}).get("template")
        inner = template.get("spec") if isinstance(template, Mapping) else None
        return inner if isinstance(inner, Mapping) else spec
    return document


def selector_from_document(document: Any, where: str) -> Selector:
    """The scheduling constraints of ``document`` (see the module docstring for the shapes taken)."""
    if not isinstance(document, Mapping):
        raise SelectorError(f"{where}: expected a mapping (nodeSelector, affinity, nodeAffinity or a pod)")
    spec = _pod_spec(document)
    known = {"nodeSelector", "affinity", "nodeAffinity", REQUIRED, "nodeSelectorTerms"}
    if not known & set(spec):
        return Selector((Term(tuple(_node_selector_map(spec, where))),))  # a bare nodeSelector map
    base = _node_selector_map(spec["nodeSelector"], f"{where}: nodeSelector") if "nodeSelector" in spec else []
    affinity: Any = spec
    for step in ("affinity", "nodeAffinity", REQUIRED):
        if isinstance(affinity, Mapping) and step in affinity:
            affinity = affinity[step]
    terms = affinity.get("nodeSelectorTerms") if isinstance(affinity, Mapping) else None
    if terms is None:
        if not base:
            raise SelectorError(f"{where}: no nodeSelector and no nodeAffinity.{REQUIRED}.nodeSelectorTerms")
        return Selector((Term(tuple(base)),))
    return Selector(tuple(Term((*base, *t.requirements), t.fields)
                          for t in _terms(terms, f"{where}: nodeSelectorTerms")))


def load_selector(path: Path) -> Selector:
    try:
        document = read_document(path, "node affinity file")
    except DocumentError as exc:
        raise SelectorError(str(exc)) from None
    return selector_from_document(document, str(path))


# --- near misses --------------------------------------------------------------------------------

def closest(asked: str, candidates: Iterable[str]) -> str | None:
    found = difflib.get_close_matches(asked, sorted(set(candidates)), n=1, cutoff=0.5)
    return found[0] if found else None


def closest_value(requirement: Requirement, everywhere: Sequence[Mapping[str, str]]) -> str | None:
    """The existing value of the requirement's key (on any target) closest to a value it asks for."""
    seen = sorted({other[requirement.key] for other in everywhere if requirement.key in other})
    scored = [(difflib.SequenceMatcher(None, asked, v).ratio(), v) for asked in requirement.values for v in seen]
    return max(scored)[1] if scored else None


def hint(requirement: Requirement, labels: Mapping[str, str], everywhere: Sequence[Mapping[str, str]]) -> str:
    """Why ``requirement`` fails on a node with ``labels``, with the closest key or value that
    exists (on this node, else on any target)."""
    key = requirement.key
    value = labels.get(key)
    if value is None:
        near = closest(key, labels) or closest(key, (k for other in everywhere for k in other))
        return f"{requirement.text()}: no label {key}" + (f" (closest existing key: {near})" if near else "")
    if requirement.operator in ("Gt", "Lt") and _integer(value) is None:
        return f"{requirement.text()}: {key}={value} is not an integer"
    return f"{requirement.text()}: has {key}={value}"


def near_miss(outcome: Outcome, labels: Mapping[str, str], everywhere: Sequence[Mapping[str, str]]) -> bool:
    """One requirement short: a value close to the one asked (or a number on the wrong side of a
    bound), or a key no target has but close to one this node has (a typo)."""
    if outcome.matched or len(outcome.failed) != 1:
        return False
    requirement = outcome.failed[0]
    value = labels.get(requirement.key)
    if value is None:
        if any(requirement.key in other for other in everywhere):
            return False
        return difflib.get_close_matches(requirement.key, list(labels), n=1, cutoff=0.8) != []
    if requirement.operator == "In":
        return difflib.get_close_matches(value, requirement.values, n=1, cutoff=0.8) != []
    return requirement.operator in ("Gt", "Lt") and _integer(value) is not None


def nothing_matches(selector: Selector, everywhere: Sequence[Mapping[str, str]]) -> list[str]:
    """For a selector that matches nothing: each asked value no target has, with the closest one."""
    out = []
    for term in selector.terms:
        for requirement in term.requirements:
            if requirement.operator != "In" or any(requirement.matches(labels) for labels in everywhere):
                continue
            near = closest_value(requirement, everywhere)
            if near is not None:
                out.append(f"no target has {requirement.text()}; closest existing value: {near}")
                continue
            key_near = closest(requirement.key, (k for labels in everywhere for k in labels))
            out.append(f"no target has the key {requirement.key}"
                       + (f"; closest existing key: {key_near}" if key_near else ""))
    return out
