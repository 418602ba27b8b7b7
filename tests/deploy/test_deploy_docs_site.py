"""The docs site as built (mkdocs --strict, Material for MkDocs): nothing in it is loaded from another site, so it
reads the same offline or air-gapped; its code is highlighted when it is built (no highlighting script); the Install
page comes first; the home page holds the README's quick start. tests/e2e/e2e_docs_browser.py reads the same pages in
a real browser (tables within their column, every request on the loopback, search)."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from mkdocs.commands.build import build
from mkdocs.config import load_config

from tests.deploy import ROOT

# Attributes through which a page loads something (rather than links to it).
ASSET_ATTRIBUTES = {"src", "srcset", "data", "poster"}
# <link rel=...> values that load or connect (canonical, alternate, prev and next only name another page).
LOADING_RELS = {"stylesheet", "icon", "shortcut", "apple-touch-icon", "preload", "modulepreload", "prefetch",
                "preconnect", "dns-prefetch", "manifest", "mask-icon"}
CSS_URL = re.compile(r"""url\(\s*['"]?([^'")\s]+)|@import\s+['"]([^'"]+)""")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    build(load_config(config_file=str(ROOT / "mkdocs.yml"), strict=True, site_dir=str(out)))
    return out


class Assets(HTMLParser):
    """Every URL a page loads: asset attributes, loading <link>s, and url()/@import in inline styles."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.mermaid = False
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        for name in ASSET_ATTRIBUTES & set(values):
            self.urls += [part.split()[0] for part in values[name].split(",") if part.strip()]
        if tag == "link" and set(values.get("rel", "").lower().split()) & LOADING_RELS:
            self.urls.append(values.get("href", ""))
        self.urls += css_urls(values.get("style", ""))
        self.mermaid |= "mermaid" in values.get("class", "").split()
        self._in_style = tag == "style"

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.urls += css_urls(data)


def css_urls(text: str) -> list[str]:
    return [a or b for a, b in CSS_URL.findall(text)]


def remote(url: str) -> bool:
    """A URL on another host: http(s) or protocol-relative (data: and relative paths stay in the site)."""
    parts = urlsplit(url.strip())
    return parts.scheme in ("http", "https") or (not parts.scheme and url.strip().startswith("//"))


def test_no_page_or_stylesheet_loads_anything_from_another_site(site: Path) -> None:
    """No web font (Material's default loads Google Fonts: theme.font is false), no highlighting script or style
    from a CDN (the readthedocs theme's highlight.js), no remote icon; the stylesheets import nothing remote."""
    pages = sorted(site.rglob("*.html"))
    found = []
    for page in pages:
        parser = Assets()
        parser.feed(page.read_text())
        found += [f"{page.relative_to(site)}: {url}" for url in parser.urls if remote(url)]
        assert not parser.mermaid, f"{page}: a mermaid diagram makes Material load mermaid from unpkg.com"
    stylesheets = sorted(site.rglob("*.css"))
    found += [f"{css.relative_to(site)}: {url}" for css in stylesheets for url in css_urls(css.read_text())
              if remote(url)]
    assert len(pages) > 15 and stylesheets
    assert found == []


def test_every_script_a_page_runs_is_the_sites_own(site: Path) -> None:
    scripts = set()
    for page in site.rglob("*.html"):
        scripts |= set(re.findall(r"<script[^>]*\bsrc=\"([^\"]+)\"", page.read_text()))
    assert scripts and not [s for s in scripts if remote(s)]
    # search runs from the site's own index, in the site's own worker
    index = site / "search" / "search_index.json"
    assert index.is_file() and '"location":"install/"' in index.read_text()


def test_code_is_highlighted_when_the_site_is_built(site: Path) -> None:
    """Pygments marks up every fenced block (a YAML key is a name-tag token); no page needs a script for it."""
    page = (site / "configuration" / "index.html").read_text()
    assert re.search(r'<span class="nt">migStrategy</span>', page)
    assert "highlight.js" not in page and "hljs" not in page


def test_the_install_page_comes_first_and_goes_from_an_image_to_labels_on_a_node() -> None:
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    assert nav[0] == {"Install": "install.md"}
    page = (ROOT / "docs" / "install.md").read_text()
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", page, re.DOTALL))
    for step in ("docker build", "podman build", "helm install gpu-labeller deploy/helm/gpu-labeller",
                 "kubectl apply -f -", "kubectl -n gpu-labeller rollout status daemonset/gpu-labeller",
                 "kubectl get nodes -L nvidia.com/gpu.product", ".status.allocatable", "labels --simulate dgx-h100"):
        assert step in blocks, step
    assert "deploy/manifests/gpu-labeller-k8s1.30.yaml" in page and "(deploy.md#the-image)" in page


def test_the_home_page_holds_the_readme_quick_start(site: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("[start:quick-start]"):readme.index("[end:quick-start]")]
    commands = re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
    home = re.sub(r"<[^>]+>", "", (site / "index.html").read_text()).replace("&amp;", "&")
    assert len(commands) == 2
    assert all(line.split("#")[0].strip() in home for block in commands for line in block.splitlines())
    assert 'id="quick-start"' in (site / "index.html").read_text()
