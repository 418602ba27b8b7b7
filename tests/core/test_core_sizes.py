"""Rooms stay small: no behaviour class over 12 fields, no function over 60 lines, no module that
imports more than 25 modules. Every module of ``labeller/`` and ``vendors/`` is read with ``ast``.

What counts:

- **A class's fields**: the attributes its own methods assign on ``self`` (``self.x = ...``,
  augmented and annotated assignments, tuple targets, ``object.__setattr__(self, "x", ...)``; in
  functions nested in a method too), the names annotated in its body (dataclass, NamedTuple and
  Protocol fields; a ``ClassVar`` is not one) and the names in its ``__slots__``. A field counts in
  the class that declares it; a class nested in another is measured on its own.
- **A plain data record** is not a behaviour class, and has no field limit: a dataclass, NamedTuple
  or TypedDict whose body defines no method but read-only properties (``property``,
  ``cached_property``). It mirrors facts (a GPU's, as its vendor reports them; a simulated GPU's
  state, which the simulation toggles from outside) and derives views of them; whatever acts on
  them lives elsewhere. One method of any other kind (``__post_init__`` included) makes it a
  behaviour class.
- **A function's lines**: from ``def`` to its last line, its docstring included, its decorators not.
  A nested function is measured on its own, and also counts in the lines of the one around it.
- **A module's imports**: the distinct modules it imports anywhere (in functions and under
  ``TYPE_CHECKING`` too: a lazy import is still a dependency). ``from package import module``
  counts the module; ``from __future__ import ...`` counts nothing.
- **Generated code** is not sized: a module whose first 400 characters say "do not edit" (what protoc
  and grpcio-tools write, and the package beside it that ``generate`` writes).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Limits:
    fields: int = 12  # a behaviour class's
    lines: int = 60  # a function's
    imports: int = 25  # a module's


LIMITS = Limits()

PROPERTY_DECORATORS = {"property", "cached_property", "functools.cached_property"}
RECORD_BASES = {"NamedTuple", "typing.NamedTuple", "TypedDict", "typing.TypedDict"}


@dataclass(frozen=True)
class Offender:
    key: str  # "class labeller.apps.plugin.app.DevicePlugin", "function ...", "imports ..."
    where: str  # path:line
    figure: str  # "14 fields (at most 12): a, b, ..."

    def __str__(self) -> str:
        return f"{self.where}: {self.key}: {self.figure}"


def generated(text: str) -> bool:
    return "do not edit" in text[:400].lower()


def module_name(path: Path, root: Path = ROOT) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def _methods(cls: ast.ClassDef) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    return (node for node in cls.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))


def _decorators(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> set[str]:
    return {ast.unparse(d.func if isinstance(d, ast.Call) else d) for d in node.decorator_list}


def _walk_function(node: ast.AST) -> Iterator[ast.AST]:
    """Every node of a function, nested functions included, nested classes not."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef):
            continue
        yield child
        yield from _walk_function(child)


def _assigned_on(name: str, node: ast.AST) -> set[str]:
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    elif (isinstance(node, ast.Call) and ast.unparse(node.func) == "object.__setattr__" and len(node.args) >= 2
          and isinstance(node.args[0], ast.Name) and node.args[0].id == name
          and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
        return {node.args[1].value}
    return {target.attr for expr in targets for target in ast.walk(expr)
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == name}


def fields(cls: ast.ClassDef) -> set[str]:
    """The fields ``cls`` declares (see the module docstring)."""
    found = set()
    for statement in cls.body:
        if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                and "ClassVar" not in ast.unparse(statement.annotation)):
            found.add(statement.target.id)
        if (isinstance(statement, ast.Assign) and any(ast.unparse(t) == "__slots__" for t in statement.targets)
                and isinstance(statement.value, (ast.Tuple, ast.List, ast.Set))):
            found |= {e.value for e in statement.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    for method in _methods(cls):
        if _decorators(method) & {"staticmethod", "classmethod"} or not method.args.args:
            continue
        this = method.args.args[0].arg
        for node in _walk_function(method):
            found |= _assigned_on(this, node)
    return found


def is_record(cls: ast.ClassDef) -> bool:
    """A plain data record (see the module docstring)."""
    dataclass_ = {"dataclass", "dataclasses.dataclass"} & _decorators(cls)
    record_base = any(ast.unparse(base) in RECORD_BASES for base in cls.bases)
    return bool(dataclass_ or record_base) and all(_decorators(m) & PROPERTY_DECORATORS and len(m.decorator_list) == 1
                                                     for m in _methods(cls))


def imported_modules(tree: ast.AST, known: set[str]) -> set[str]:
    """The modules a module imports (see the module docstring); ``known``: the project's modules, to
    tell ``from package import module`` from ``from module import name``."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module != "__future__":
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & known
            found |= submodules
            if len(submodules) < len(node.names):
                found.add(node.module)
    return found


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def _classes(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.ClassDef]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.ClassDef):
            yield prefix + node.name, node
            yield from _classes(node, f"{prefix}{node.name}.")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _classes(node, f"{prefix}{node.name}.")
        else:
            yield from _classes(node, prefix)


def measure(module: str, where: str, tree: ast.AST, known: set[str], limits: Limits = LIMITS) -> list[Offender]:
    """The offenders in one module's ``tree``."""
    found = []
    for name, cls in _classes(tree):
        declared = fields(cls)
        if len(declared) > limits.fields and not is_record(cls):
            found.append(Offender(f"class {module}.{name}", f"{where}:{cls.lineno}",
                                  f"{len(declared)} fields (at most {limits.fields}): {', '.join(sorted(declared))}"))
    for name, function in _functions(tree):
        lines = (function.end_lineno or function.lineno) - function.lineno + 1
        if lines > limits.lines:
            found.append(Offender(f"function {module}.{name}", f"{where}:{function.lineno}",
                                  f"{lines} lines (at most {limits.lines})"))
    imports = imported_modules(tree, known)
    if len(imports) > limits.imports:
        found.append(Offender(f"imports {module}", f"{where}:1", f"{len(imports)} modules imported "
                              f"(at most {limits.imports}): {', '.join(sorted(imports))}"))
    return found


@cache
def offenders() -> dict[str, Offender]:
    paths = sorted([*ROOT.glob("labeller/**/*.py"), *ROOT.glob("vendors/**/*.py")])
    known = {module_name(path) for path in paths}
    found: dict[str, Offender] = {}
    for path in paths:
        text = path.read_text()
        if not generated(text):
            for offender in measure(module_name(path), str(path.relative_to(ROOT)), ast.parse(text), known):
                found[offender.key] = offender
    return found


def test_no_class_function_or_module_is_too_big() -> None:
    over = [str(o) for _, o in sorted(offenders().items())]
    assert not over, "too big (split it along its concerns; tests/core/test_core_sizes.py says what counts):\n" + \
        "\n".join(over)


# --- the rules themselves, on small sources ---------------------------------------------------------

def _measured(source: str, *, fields: int = 2, lines: int = 4, imports: int = 2) -> list[str]:
    return [f"{o.key}: {o.figure}"
            for o in measure("m", "m.py", ast.parse(source), {"pkg.sub", "pkg.other"}, Limits(fields, lines, imports))]


def test_fields_count_what_the_methods_assign_on_self_and_what_the_body_declares() -> None:
    source = '''
class Busy:
    declared: int
    limit: ClassVar[int] = 3
    __slots__ = ("slot",)

    def __init__(this, a):
        this.a, (this.b, this.c) = a, (1, 2)
        object.__setattr__(this, "d", 4)
        def later():
            this.e += 1

    @staticmethod
    def helper(other):
        other.f = 1

class Small:
    def __init__(self):
        self.a = self.b = 1
'''
    assert _measured(source, lines=100) == [
        "class m.Busy: 7 fields (at most 2): a, b, c, d, declared, e, slot"]


@pytest.mark.parametrize(("record", "exempt"), [
    ("@dataclass(frozen=True)\nclass R:\n    a: int\n    b: int\n    c: int\n"
     "    @property\n    def total(self) -> int:\n        return self.a + self.b\n", True),
    ("@dataclasses.dataclass\nclass R:\n    a: int\n    b: int\n    c: int\n", True),
    ("class R(typing.NamedTuple):\n    a: int\n    b: int\n    c: int\n", True),
    ("@dataclass(frozen=True)\nclass R:\n    a: int\n    b: int\n    c: int\n"
     "    def grow(self) -> R:\n        return R(self.a + 1, self.b, self.c)\n", False),
    ("@dataclass\nclass R:\n    a: int\n    b: int\n    c: int\n    def __post_init__(self) -> None:\n        pass\n",
     False),
    ("class R:\n    a: int\n    b: int\n    c: int\n", False),
])
def test_a_plain_data_record_has_no_field_limit_and_nothing_else_is_one(record: str, exempt: bool) -> None:
    assert (_measured(record, lines=100) == []) == exempt


def test_functions_are_measured_from_def_to_their_last_line_each_nested_one_too() -> None:
    source = '''
@decorated
def short():
    """Four lines,"""
    x = 1
    return x

class C:
    def outer(self):
        def inner():
            a = 1
            b = 2
            c = 3
            return a + b + c
        return inner
'''
    assert _measured(source) == [  # short: 4 lines, its decorator aside
        "function m.C.outer: 7 lines (at most 4)", "function m.C.outer.inner: 5 lines (at most 4)"]


def test_imports_are_the_distinct_modules_imported_anywhere() -> None:
    source = '''
from __future__ import annotations
import os, sys
from pkg import sub, other
from pkg import name
from pkg.sub import thing
if TYPE_CHECKING:
    from typing import Any
def lazy():
    import json
'''
    assert _measured(source, imports=6) == [
        "imports m: 7 modules imported (at most 6): json, os, pkg, pkg.other, pkg.sub, sys, typing"]


def test_generated_code_is_told_by_its_own_header() -> None:
    generated_files = [path for path in ROOT.glob("labeller/**/*.py") if generated(path.read_text())]
    assert generated_files and all("/api/" in str(path) for path in generated_files)
    assert not generated(Path(__file__).read_text())
