"""The docs site in a real browser: headless Chromium, driven by the DevTools protocol over a pipe, reads every
page of the built site from a loopback HTTP server at 1280 px. Not a test (pytest does not collect ``e2e_*.py``);
CI runs it. Needs Debian's chromium (``apt-get install -y chromium``) or ``--chromium PATH``.

    python tests/e2e/e2e_docs_browser.py [--site DIR] [--width 1280] [--max-overflow 0.10] [--chromium PATH]

It builds the site with ``mkdocs build --strict`` into a temporary directory (or reads ``--site DIR``), then:

1. Tables: on every page, each table that needs horizontal scrolling (the table, or an element between it and the
   page's content column, is wider than it shows: ``scrollWidth > clientWidth``, or the table is wider than the
   column) is listed with its page and widths. More than ``--max-overflow`` of all tables fails.
2. Nothing from another site: every request a page makes (Network.requestWillBeSent) must go to the loopback
   server (``data:`` and ``blob:`` aside). A font, script or stylesheet from a CDN fails.
3. Highlighting: the code blocks' tokens are coloured (a keyword's colour differs from the block's text).
4. Search: typing a word into the search box lists results, from the site's own index.

Prints the figures, one line per finding; exits 1 when a check fails, 2 when it cannot run (no chromium).
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
         "--remote-debugging-pipe"]
PAGE_TIMEOUT_S = 60.0  # a page load or a condition awaited on a loaded box; never waited for when met

# Every table of the page: whether it needs horizontal scrolling, measured once the fonts are in and the layout
# settled (two frames). The column is the table's nearest <article> (Material for MkDocs) or the theme's main
# region; hidden tables (zero width) are counted apart.
MEASURE_TABLES = r"""
document.fonts.ready.then(() => new Promise(frame => requestAnimationFrame(() => requestAnimationFrame(frame))))
.then(() => Array.from(document.querySelectorAll('table')).map((table, index) => {
  const column = table.closest('article, .rst-content, [role=main], main') || document.body;
  const style = getComputedStyle(column);
  const available = column.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  let scrolls = false;
  for (let node = table; node && node !== column; node = node.parentElement) {
    if (node.scrollWidth > node.clientWidth + 1) { scrolls = true; }
  }
  const head = Array.from(table.querySelectorAll('th')).map(th => th.textContent.trim()).join(' | ');
  return {index, head: head.slice(0, 80), width: table.scrollWidth, shown: table.clientWidth,
          available: Math.round(available), hidden: table.clientWidth === 0,
          overflows: scrolls || table.scrollWidth > available + 1};
}))
"""

# A highlighted block: Pygments' token spans (Material) or highlight.js's (readthedocs) coloured apart from the text.
HIGHLIGHTED = r"""
new Promise((resolve) => {
  const deadline = Date.now() + %d;
  const check = () => {
    const token = document.querySelector('.highlight code .k, .highlight code .nt, .highlight code .nb, ' +
                                         '.highlight code .s, .highlight code .c1, code.hljs .hljs-keyword, ' +
                                         'code.hljs .hljs-string, code.hljs .hljs-built_in');
    if (token) {
      const block = token.closest('code');
      const colour = getComputedStyle(token).color, text = getComputedStyle(block).color;
      if (colour !== text) { resolve({ok: true, token: token.className, colour, text}); return; }
    }
    if (Date.now() > deadline) { resolve({ok: false, token: token ? token.className : null}); return; }
    requestAnimationFrame(check);
  };
  check();
})
"""

# Type a word into Material's search box and await its results (the worker loads search/search_index.json).
SEARCH = r"""
new Promise((resolve) => {
  const input = document.querySelector('input[data-md-component=search-query], input.md-search__input');
  if (!input) { resolve({ok: false, reason: 'no search box'}); return; }
  const toggle = document.querySelector('#__search');
  if (toggle) { toggle.checked = true; toggle.dispatchEvent(new Event('change')); }
  input.focus();
  const deadline = Date.now() + %d;
  const type = () => { input.value = %s; input.dispatchEvent(new Event('input', {bubbles: true}));
                       input.dispatchEvent(new KeyboardEvent('keyup', {bubbles: true, key: 'e'})); };
  type();
  const check = () => {
    const results = document.querySelectorAll('.md-search-result__item');
    if (results.length) {
      resolve({ok: true, results: results.length, first: results[0].textContent.trim().slice(0, 60)});
      return;
    }
    if (Date.now() > deadline) {
      const meta = document.querySelector('.md-search-result__meta');
      resolve({ok: false, reason: meta ? meta.textContent.trim() : 'no results'});
      return;
    }
    type();
    setTimeout(check, 100);
  };
  check();
})
"""


class BrowserError(RuntimeError):
    pass


TRAMPOLINE = ("import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
              "os.close(int(sys.argv[1])); os.close(int(sys.argv[2])); os.execv(sys.argv[3], sys.argv[3:])")


def _high(fd: int) -> int:
    """``fd`` moved to 10 or above, so that putting the browser's ends on 3 and 4 cannot overwrite one of them."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


class DevTools:
    """The DevTools protocol over Chromium's --remote-debugging-pipe: JSON messages ending in NUL, commands
    written to the browser's fd 3, answers and events read from its fd 4."""

    def __init__(self, chromium: str, profile: Path) -> None:
        to_browser_r, self._to_browser = (_high(fd) for fd in os.pipe())
        self._from_browser, from_browser_w = (_high(fd) for fd in os.pipe())
        # The browser reads fd 3 and writes fd 4: a small Python puts the pipe ends there, then becomes the browser
        # (the launcher is a dash script, and dash cannot name an fd above 9).
        self._log = profile / "chromium.log"  # its chatter, read back only when it dies
        with self._log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", TRAMPOLINE, str(to_browser_r), str(from_browser_w), chromium, *FLAGS,
                 f"--user-data-dir={profile / 'data'}", "about:blank"],
                pass_fds=(to_browser_r, from_browser_w), stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("the browser did not answer in time")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 16)
                if not chunk:
                    log = self._log.read_text(errors="replace").strip()
                    raise BrowserError(f"the browser exited: {log[-500:]}")
                self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        parsed: dict[str, Any] = json.loads(message)
        return parsed

    def _send(self, method: str, session: str | None, params: dict[str, Any]) -> int:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        return self._next_id

    def _event(self, event: dict[str, Any]) -> None:
        """Keep an event; a worker that attached (held at its start) gets its requests recorded, then runs."""
        self.events.append(event)
        if event.get("method") == "Target.attachedToTarget":
            child = event["params"]["sessionId"]
            self._send("Network.enable", child, {})
            self._send("Runtime.runIfWaitingForDebugger", child, {})

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        sent = self._send(method, session, params)
        deadline = time.monotonic() + PAGE_TIMEOUT_S
        while True:
            answer = self._read_message(deadline)
            if answer.get("id") == sent:
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error'].get('message')}")
                result: dict[str, Any] = answer.get("result", {})
                return result
            if "method" in answer:
                self._event(answer)

    def await_event(self, method: str, session: str) -> dict[str, Any]:
        """The first ``method`` event of ``session`` not seen yet (events already read count)."""
        deadline = time.monotonic() + PAGE_TIMEOUT_S
        while True:
            for index, event in enumerate(self.events):
                if event.get("method") == method and event.get("sessionId") == session:
                    return self.events.pop(index)
            message = self._read_message(deadline)
            if "method" in message:
                self._event(message)

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (BrowserError, OSError):
            pass
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)


class Page:
    """One tab at a fixed viewport, recording every request it makes."""

    def __init__(self, tools: DevTools, width: int) -> None:
        self.tools = tools
        target = tools.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = tools.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page.enable", "Network.enable", "Runtime.enable"):
            tools.call(domain, self.session)
        tools.call("Emulation.setDeviceMetricsOverride", self.session, width=width, height=900, deviceScaleFactor=1,
                   mobile=False)
        # Workers (the search runs in one) are targets of their own: each is held at its start until its requests
        # are recorded too.
        tools.call("Target.setAutoAttach", self.session, autoAttach=True, waitForDebuggerOnStart=True, flatten=True)
        self.sessions = {self.session}
        self.requests: list[str] = []

    def open(self, url: str) -> None:
        self.tools.call("Page.navigate", self.session, url=url)
        self.tools.await_event("Page.loadEventFired", self.session)
        self._collect_requests()

    def _collect_requests(self) -> None:
        """Take the page's and its workers' events read so far: their requests, and the workers attached."""
        while mine := [e for e in self.tools.events if e.get("sessionId") in self.sessions]:
            self.tools.events[:] = [e for e in self.tools.events if e.get("sessionId") not in self.sessions]
            for event in mine:
                if event.get("method") == "Network.requestWillBeSent":
                    self.requests.append(event["params"]["request"]["url"])
                elif event.get("method") == "Target.attachedToTarget":
                    self.sessions.add(event["params"]["sessionId"])

    def evaluate(self, expression: str) -> Any:
        answer = self.tools.call("Runtime.evaluate", self.session, expression=expression, returnByValue=True,
                                 awaitPromise=True)
        if "exceptionDetails" in answer:
            raise BrowserError(f"script failed: {answer['exceptionDetails'].get('text')}")
        self._collect_requests()
        return answer["result"].get("value")


@contextmanager
def served(site: Path) -> Iterator[str]:
    """The site on a loopback HTTP server (an ephemeral port), quiet."""
    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def build_site(into: Path) -> Path:
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    config = load_config(config_file=str(ROOT / "mkdocs.yml"), strict=True, site_dir=str(into))
    build(config)
    return into


def pages_of(site: Path) -> list[str]:
    """The site's pages as paths under its root, the home page first; the 404 page and search aside."""
    found = sorted(str(p.relative_to(site)) for p in site.rglob("*.html") if p.name != "404.html")
    return sorted(found, key=lambda p: (p != "index.html", p))


def foreign(url: str, base: str) -> bool:
    scheme = urlsplit(url).scheme
    return scheme not in ("data", "blob", "about") and not url.startswith(base)


def check(site: Path, chromium: str, width: int, max_overflow: float) -> list[str]:
    failures: list[str] = []
    profile = Path(tempfile.mkdtemp(prefix="docs-browser-profile-"))
    tools = DevTools(chromium, profile)
    try:
        with served(site) as base:
            page = Page(tools, width)
            tables: list[tuple[str, dict[str, Any]]] = []
            for path in pages_of(site):
                page.open(base + path.removesuffix("index.html"))
                tables += [(path, table) for table in page.evaluate(MEASURE_TABLES)]
            shown = [(p, t) for p, t in tables if not t["hidden"]]
            wide = [(p, t) for p, t in shown if t["overflows"]]
            print(f"tables: {len(wide)} of {len(shown)} need horizontal scrolling at {width} px "
                  f"({len(tables) - len(shown)} hidden) on {len(pages_of(site))} pages")
            for path, table in wide:
                print(f"  wide: {path} table {table['index']} ({table['head']}): {table['width']} px in a column of "
                      f"{table['available']} px")
            if len(shown) == 0 or len(wide) > max_overflow * len(shown):
                failures.append(f"{len(wide)} of {len(shown)} tables need horizontal scrolling, more than "
                                f"{max_overflow:.0%}")

            page.open(base + "configuration/")
            highlight = page.evaluate(HIGHLIGHTED % (PAGE_TIMEOUT_S * 1000))
            print(f"highlighting: {json.dumps(highlight)}")
            if not highlight.get("ok"):
                failures.append("code blocks are not highlighted")

            page.open(base)
            search = page.evaluate(SEARCH % (PAGE_TIMEOUT_S * 1000, json.dumps("cleanup")))
            print(f"search 'cleanup': {json.dumps(search)}")
            if not search.get("ok"):
                failures.append(f"search found nothing: {search.get('reason')}")

            outside = sorted({url for url in page.requests if foreign(url, base)})
            print(f"requests: {len(page.requests)}, to another site: {len(outside)}")
            for url in outside:
                print(f"  foreign: {url}")
            if outside:
                failures.append(f"{len(outside)} requests to another site")
    finally:
        tools.close()
        shutil.rmtree(profile, ignore_errors=True)
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, help="a built site (default: build it with mkdocs --strict)")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--max-overflow", type=float, default=0.10)
    parser.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    args = parser.parse_args()
    if not args.chromium or not Path(args.chromium).is_file():
        print("docs-browser: no chromium; install it (apt-get install -y chromium) or give --chromium PATH",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="docs-site-") as tmp:
        site = args.site if args.site is not None else build_site(Path(tmp) / "site")
        failures = check(site, args.chromium, args.width, args.max_overflow)
    for failure in failures:
        print(f"FAIL: {failure}")
    print("docs-browser: " + ("failed" if failures else "ok"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
