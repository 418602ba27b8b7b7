"""Draws the map of the code, docs/img/map.svg, from the layout itself: nothing on it is drawn by hand.

Each tier is a band, from the bottom (the tiers and the rule that gives a module its tier are those of
tests/core/test_core_architecture.py, read from the path: ``labeller/<tier>/...``, ``vendors/``). Each box
is a package of a tier (a directory), with its number of modules. Each arrow is the imports from one package into
another, read with ``ast`` as the architecture test reads them (lazy, TYPE_CHECKING and importlib imports
included); its width grows with their number. An arrow may only run down or within a band: one that runs
up is drawn in red (and the architecture test fails). The SVG is self-contained (no script, no font, no
link) and the same for the same code, byte for byte.

    python docs/gen/map.py           # write docs/img/map.svg
    python docs/gen/map.py --check   # exit 1 when the committed picture is not what the code gives

tests/deploy/test_deploy_docs_map.py fails while the committed picture is stale.
"""

from __future__ import annotations

import argparse
import ast
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = ROOT / "docs" / "img" / "map.svg"
REGENERATE = "python docs/gen/map.py"

if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

# What each tier holds, for the band's caption (a tier not named here is captioned with its name alone).
CAPTIONS = {
    "base": "plumbing", "model": "the domain, as data", "vendors": "one package a vendor",
    "host": "the machine", "cluster": "the Kubernetes API", "process": "the one loop",
    "apps": "one package a process", "cli": "the command line",
}

# Geometry, in pixels.
WIDTH = 960  # at least
LEFT = 130  # the tiers' captions
RIGHT = 20
HEAD = 64  # the title and the counts
FOOT = 66  # the legend
BAND = 100
BOX_HEIGHT = 44
BOX_GAP = 20
PAD = 14
PORT = 12  # the least room between two arrows' ends on a box
CHAR = 7.9  # the width of one character of the boxes' 13 px monospace text, a little over
ARC = 20  # how far an arrow within a band bows out of its boxes' row

FILLS = ("#eef2f7", "#e8f3ec", "#fdf3e1", "#efeafa", "#e3f1f6", "#f9e9ec", "#eef0e2", "#f1ece4")
BAND_FILLS = ("#ffffff", "#f6f8fa")
INK = "#24292f"
MUTED = "#57606a"
DOWN = "#57606a"
UP = "#cf222e"


@dataclass(frozen=True)
class Package:
    """One box: a package of one tier and the modules in it (dotted names)."""

    label: str
    tier: int
    modules: tuple[str, ...]


@dataclass(frozen=True)
class Imports:
    """One arrow: ``importer``'s modules import ``imported``'s; ``pairs`` says which ones."""

    importer: str
    imported: str
    pairs: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Layout:
    """The code as the map shows it: the tiers' names from the bottom, the packages, the imports between them."""

    tiers: tuple[str, ...]
    packages: tuple[Package, ...]
    imports: tuple[Imports, ...]

    def tier_of(self, label: str) -> int:
        return next(p.tier for p in self.packages if p.label == label)


def _docstring_only(tree: ast.Module) -> bool:
    """A module that holds nothing but its docstring (a package's bare ``__init__``): no room on the map."""
    return all(isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) for s in tree.body)


def package_of(path: Path) -> str:
    """The box the module at ``path`` (relative to the checkout) is drawn in: its directory."""
    directory = path.parent.as_posix()
    return "labeller/__init__.py" if directory == "labeller" else f"{directory}/"


def read_layout() -> Layout:
    """The packages of the checkout and the imports between them, as the architecture test reads them."""
    from tests.core import test_core_architecture as architecture

    tiers = tuple(architecture.TIERS)
    box: dict[str, str] = {}
    members: dict[str, list[str]] = defaultdict(list)
    tier_of: dict[str, int] = {}
    paths = {}
    for path in architecture.sources():
        if _docstring_only(ast.parse(path.read_text())):
            continue
        module = architecture.module_name(path)
        number = architecture.tier(module)
        label = package_of(path.relative_to(ROOT))
        box[module], paths[module] = label, path
        members[label].append(module)
        tier_of[label] = number
    pairs: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
    for module, path in sorted(paths.items()):
        for imported in sorted(architecture.precise_imports(path) & set(box)):
            if box[imported] != box[module]:
                pairs[box[module], box[imported]].append((module, imported))
    packages = tuple(Package(label, tier_of[label], tuple(sorted(modules)))
                     for label, modules in sorted(members.items()))
    imports = tuple(Imports(a, b, tuple(found)) for (a, b), found in sorted(pairs.items()))
    return Layout(tiers, packages, imports)


# --- drawing ----------------------------------------------------------------------------------------

@dataclass
class Box:
    package: Package
    x: float
    y: float
    width: float
    top: list[tuple[float, str]] = field(default_factory=list)  # (the other end's x, edge key) per arrow end
    bottom: list[tuple[float, str]] = field(default_factory=list)

    @property
    def centre(self) -> float:
        return self.x + self.width / 2

    def port(self, side: str, key: str) -> float:
        """Where the arrow ``key`` meets this box on ``side``: the ends spread along it, ordered by where
        each arrow's other end is, so that arrows cross as little as they can."""
        ends = sorted(self.top if side == "top" else self.bottom)
        index = [k for _, k in ends].index(key)
        return self.x + self.width * (index + 1) / (len(ends) + 1)


def _number(value: float) -> str:
    return f"{value:.1f}".removesuffix(".0")


def shown(package: Package) -> str:
    """The name on a box: its path, without the ``labeller/`` every package but the vendors' starts with."""
    short = package.label.removeprefix("labeller/")
    return package.label if short == "__init__.py" else short


def _box_width(package: Package, ends: int) -> float:
    """Wide enough for its name, and for the arrows that meet it on its busier side to land apart."""
    return max(max(len(shown(package)), len(_count(package))) * CHAR + 2 * PAD, (ends + 1) * PORT)


def _count(package: Package) -> str:
    return f"{len(package.modules)} module{'s' if len(package.modules) != 1 else ''}"


def band_top(layout: Layout, tier: int) -> float:
    return HEAD + (len(layout.tiers) - 1 - tier) * BAND


def place(layout: Layout) -> tuple[dict[str, Box], float]:
    """Each band's boxes in a centred row, from the bottom band up, and the width of the picture (wider than
    ``WIDTH`` where a row needs it). A box sits above the boxes it imports (the mean of their centres, weighted
    by the imports), so that arrows run as straight as they can."""
    boxes: dict[str, Box] = {}
    weights: dict[str, list[tuple[str, int]]] = defaultdict(list)
    ends: dict[tuple[str, str], int] = defaultdict(int)  # (package, side) -> arrows meeting it there
    for arrow in layout.imports:
        weights[arrow.importer].append((arrow.imported, len(arrow.pairs)))
        start_side, end_side = _sides(layout, arrow, None)
        ends[arrow.importer, start_side] += 1
        ends[arrow.imported, end_side] += 1
    widths = {p.label: _box_width(p, max(ends[p.label, "top"], ends[p.label, "bottom"])) for p in layout.packages}
    rows = [[p for p in layout.packages if p.tier == tier] for tier in range(len(layout.tiers))]
    needed = [sum(widths[p.label] for p in row) + BOX_GAP * (len(row) - 1) for row in rows]
    width = max(WIDTH, LEFT + max(needed, default=0) + RIGHT)

    def pull(package: Package) -> tuple[float, str]:
        below = [(boxes[other].centre, n) for other, n in weights[package.label] if other in boxes]
        total = sum(n for _, n in below)
        return (sum(x * n for x, n in below) / total if total else math.inf), package.label

    for tier, row in enumerate(rows):
        x = LEFT + (width - LEFT - RIGHT - needed[tier]) / 2
        y = band_top(layout, tier) + (BAND - BOX_HEIGHT) / 2
        for package in sorted(row, key=pull):
            boxes[package.label] = Box(package, x, y, widths[package.label])
            x += widths[package.label] + BOX_GAP
    return boxes, width


def direction(layout: Layout, arrow: Imports) -> str:
    """"down", "within" (a band) or "up" (never: the architecture test fails on it)."""
    importer, imported = layout.tier_of(arrow.importer), layout.tier_of(arrow.imported)
    return "down" if importer > imported else "within" if importer == imported else "up"


def _sides(layout: Layout, arrow: Imports, boxes: dict[str, Box] | None) -> tuple[str, str]:
    """The sides of the importer's and the imported's boxes the arrow leaves and enters by (within a band,
    where the boxes are placed: before, ``boxes`` is None and the side is a guess good for counting)."""
    way = direction(layout, arrow)
    if way == "down":
        return "bottom", "top"
    if way == "up":
        return "top", "bottom"
    rightwards = boxes is None or boxes[arrow.importer].centre < boxes[arrow.imported].centre
    return ("top", "top") if rightwards else ("bottom", "bottom")  # rightwards bows over, leftwards under


def _key(arrow: Imports) -> str:
    return f"{arrow.importer}>{arrow.imported}"


def _path(layout: Layout, arrow: Imports, boxes: dict[str, Box]) -> str:
    start_side, end_side = _sides(layout, arrow, boxes)
    start, end = boxes[arrow.importer], boxes[arrow.imported]
    x1, x2 = start.port(start_side, _key(arrow)), end.port(end_side, _key(arrow))
    y1 = start.y + (BOX_HEIGHT if start_side == "bottom" else 0)
    y2 = end.y + (BOX_HEIGHT if end_side == "bottom" else 0)
    if start_side == end_side:  # within a band: a bow over or under the row
        bow = -ARC if start_side == "top" else ARC
        c1, c2 = (x1, y1 + bow), (x2, y2 + bow)
    else:
        pull = min(48.0, abs(y2 - y1) / 2)
        sign = 1 if y2 > y1 else -1
        c1, c2 = (x1, y1 + sign * pull), (x2, y2 - sign * pull)
    points = [(x1, y1), c1, c2, (x2, y2)]
    text = [f"{_number(x)},{_number(y)}" for x, y in points]
    return f"M{text[0]} C{text[1]} {text[2]} {text[3]}"


def _stroke(arrow: Imports) -> float:
    return round(min(4.5, 0.8 + 0.5 * math.sqrt(len(arrow.pairs))), 1)


def _arrow(layout: Layout, arrow: Imports, boxes: dict[str, Box]) -> str:
    way = direction(layout, arrow)
    colour = UP if way == "up" else DOWN
    dash = ' stroke-dasharray="5 3"' if way == "within" else ""
    opacity = "1" if way == "up" else "0.5"
    width = max(2.5, _stroke(arrow)) if way == "up" else _stroke(arrow)
    listed = "; ".join(f"{a} → {b}" for a, b in arrow.pairs)
    many = len(arrow.pairs)
    title = f"{arrow.importer} imports {arrow.imported} ({many} import{'s' if many != 1 else ''}: {listed})"
    if way == "up":
        title = f"UPWARD: {title}"
    return (f'<path class="{way}" d="{_path(layout, arrow, boxes)}" fill="none" stroke="{colour}" '
            f'stroke-width="{_number(width)}" stroke-opacity="{opacity}"{dash} marker-end="url(#head-{way})">'
            f"<title>{escape(title)}</title></path>")


def _box(box: Box) -> str:
    package = box.package
    names = ", ".join(m.rsplit(".", 1)[-1] for m in package.modules)
    fill = FILLS[package.tier % len(FILLS)]
    return (f"<g><title>{escape(f'{package.label}: {names}')}</title>"
            f'<rect x="{_number(box.x)}" y="{_number(box.y)}" width="{_number(box.width)}" height="{BOX_HEIGHT}" '
            f'rx="6" fill="{fill}" stroke="{MUTED}" stroke-width="1"/>'
            f'<text x="{_number(box.centre)}" y="{_number(box.y + 19)}" text-anchor="middle" '
            f'font-family="monospace" font-size="13" fill="{INK}">{escape(shown(package))}</text>'
            f'<text x="{_number(box.centre)}" y="{_number(box.y + 35)}" text-anchor="middle" font-size="11" '
            f'fill="{MUTED}">{_count(package)}</text></g>')


def _marker(name: str, colour: str) -> str:
    return (f'<marker id="head-{name}" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="8" markerHeight="8" '
            f'markerUnits="userSpaceOnUse" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="{colour}"/></marker>')


def _legend(y: float) -> list[str]:
    samples = [("down", DOWN, "0.5", "", "imports a tier below (wider: more imports)"),
               ("within", DOWN, "0.5", ' stroke-dasharray="5 3"', "imports within its tier"),
               ("up", UP, "1", "", "imports a tier above: the architecture test fails")]
    out, x = [], 16.0
    for name, colour, opacity, dash, text in samples:
        out.append(f'<path d="M{_number(x)},{_number(y)} L{_number(x + 36)},{_number(y)}" stroke="{colour}" '
                   f'stroke-width="2" stroke-opacity="{opacity}"{dash} marker-end="url(#head-{name})"/>')
        out.append(f'<text x="{_number(x + 44)}" y="{_number(y + 4)}" font-size="12" '
                   f'fill="{INK}">{escape(text)}</text>')
        x += 44 + len(text) * 6.6 + 32
    out.append(f'<text x="16" y="{_number(y + 28)}" font-size="12" fill="{MUTED}">The boxes\' paths are under '
               f"labeller/ (but vendors/). Drawn from the code by {escape(REGENERATE)}; opened on its own, the "
               "picture names what is under the pointer.</text>")
    return out


def svg(layout: Layout) -> str:
    """The picture of ``layout``, as the text of an SVG file."""
    boxes, width = place(layout)
    for arrow in layout.imports:
        start_side, end_side = _sides(layout, arrow, boxes)
        start, end = boxes[arrow.importer], boxes[arrow.imported]
        getattr(start, start_side).append((end.centre, _key(arrow)))
        getattr(end, end_side).append((start.centre, _key(arrow)))
    height = HEAD + len(layout.tiers) * BAND + FOOT
    ways = [direction(layout, arrow) for arrow in layout.imports]
    modules = sum(len(p.modules) for p in layout.packages)
    counts = (f"{len(layout.tiers)} tiers, {len(layout.packages)} packages, {modules} modules; "
              f"{len(layout.imports)} arrows: {ways.count('down')} down, {ways.count('within')} within a tier, "
              f"{ways.count('up')} up")
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_number(width)}" height="{height}" '
           f'viewBox="0 0 {_number(width)} {height}" font-family="sans-serif" role="img" aria-labelledby="map-title">',
           f'<title id="map-title">The map of gpu-labeller: {escape(counts)}</title>',
           f"<defs>{_marker('down', DOWN)}{_marker('within', DOWN)}{_marker('up', UP)}</defs>",
           f'<rect width="{_number(width)}" height="{height}" fill="#ffffff"/>']
    for tier, name in enumerate(layout.tiers):
        top = band_top(layout, tier)
        out.append(f'<rect x="0" y="{_number(top)}" width="{_number(width)}" height="{BAND}" '
                   f'fill="{BAND_FILLS[tier % 2]}"/>')
        out.append(f'<text x="16" y="{_number(top + BAND / 2 - 2)}" font-size="15" font-weight="bold" '
                   f'fill="{INK}">{tier} {escape(name)}</text>')
        out.append(f'<text x="16" y="{_number(top + BAND / 2 + 16)}" font-size="11" '
                   f'fill="{MUTED}">{escape(CAPTIONS.get(name, ""))}</text>')
    out.append(f'<text x="16" y="26" font-size="16" font-weight="bold" fill="{INK}">gpu-labeller, tier by tier '
               f'from the bottom: each box a package, each arrow its imports</text>')
    out.append(f'<text x="16" y="46" font-size="12" fill="{MUTED}">{escape(counts)}</text>')
    # the arrows under the boxes, but an upward one over them: nothing may hide it
    out += [_arrow(layout, arrow, boxes) for arrow in layout.imports if direction(layout, arrow) != "up"]
    out += [_box(boxes[p.label]) for p in layout.packages]
    out += [_arrow(layout, arrow, boxes) for arrow in upward(layout)]
    out += _legend(HEAD + len(layout.tiers) * BAND + 24)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def stale(output: Path = OUTPUT) -> bool:
    """Whether the committed picture differs from what the code gives now."""
    return not output.is_file() or output.read_text(encoding="utf-8") != svg(read_layout())


def upward(layout: Layout) -> list[Imports]:
    return [arrow for arrow in layout.imports if direction(layout, arrow) == "up"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when the picture is stale")
    args = parser.parse_args(argv)
    name = OUTPUT.relative_to(ROOT).as_posix()
    if args.check:
        if stale(OUTPUT):
            print(f"{name}: stale; run {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(svg(read_layout()), encoding="utf-8")
    print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
