"""Open a page as a person would: headless Chromium from the system's packages (Debian's
``chromium``, which ci/setup.sh installs where it can), and an HTML check without one.

``open_page`` loads a file once for its DOM (``--dump-dom``) and the console (Chromium's log
on stderr, ``--enable-logging=stderr --v=0``: each console message is a ``CONSOLE`` line),
and once more for a screenshot. The morning page has no script at all, so *any* console
message (an error, a resource that failed to load) is a fault. The flags keep Chromium off
the network (without them it waits on a closed one) and out of the user's profile.

``check_html`` parses a page with the standard library's parser and says what is wrong:
an in-page link (``#id``) with no such id, a relative link to a file that does not exist, a
duplicate id, a tag closed that was never opened, or anything fetched from elsewhere.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")
CONSOLE = re.compile(r":CONSOLE(?::\d+|\(\d+\))\] (.*)")
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr",
        "circle", "line", "rect", "polyline", "path"}


def chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


@dataclass
class Opened:
    dom: str
    console: list[str]
    screenshot: Path | None


def open_page(page: Path, screenshot: Path | None = None, *, width: int = 1200, height: int = 2400,
              timeout: float = 120) -> Opened:
    exe = chromium()
    if exe is None:
        raise FileNotFoundError("no chromium on PATH")
    url = page.resolve().as_uri()
    with tempfile.TemporaryDirectory(prefix="kvfuzz-chromium-") as profile:
        r = subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}/a", "--enable-logging=stderr", "--v=0",
                            "--dump-dom", url], capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0 or "<html" not in r.stdout:
            raise RuntimeError(f"chromium --dump-dom exit {r.returncode}: {r.stderr[-2000:]}")
        console = [m[1] for line in r.stderr.splitlines() if (m := CONSOLE.search(line))]
        if screenshot is not None:
            s = subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}/b", f"--window-size={width},{height}",
                                "--hide-scrollbars", f"--screenshot={screenshot}", url],
                               capture_output=True, text=True, timeout=timeout)
            if s.returncode != 0 or not screenshot.is_file():
                raise RuntimeError(f"chromium --screenshot exit {s.returncode}: {s.stderr[-2000:]}")
    return Opened(r.stdout, console, screenshot)


class _Links(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids: list[str] = []
        self.links: list[str] = []
        self.external: list[str] = []
        self.stack: list[str] = []
        self.problems: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.append(a["id"])
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        for key in ("src", "href", "xlink:href"):
            if tag != "a" and a.get(key):
                self.external.append(f"<{tag} {key}={a[key]}>")
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.stack.pop()

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if tag not in self.stack:
            self.problems.append(f"</{tag}> closes nothing open")
            return
        while self.stack.pop() != tag:
            pass


def check_html(page: Path) -> tuple[list[str], _Links]:
    """(problems, the parse: ids and links) of the HTML file ``page``."""
    p = _Links()
    p.feed(page.read_text())
    p.close()
    problems = list(p.problems)
    if p.stack:
        problems.append(f"never closed: {p.stack}")
    ids = set(p.ids)
    problems += [f"duplicate id {i!r}" for i in sorted(ids) if p.ids.count(i) > 1]
    for href in p.links:
        u = urlparse(href)
        if u.scheme or u.netloc:
            problems.append(f"a link out of the page: {href}")
        elif href.startswith("#"):
            if href[1:] not in ids:
                problems.append(f"in-page link {href}: no element has that id")
        elif not (page.parent / unquote(u.path)).is_file():
            problems.append(f"link {href}: {page.parent / unquote(u.path)} does not exist")
    problems += [f"fetches something: {e}" for e in p.external]
    return problems, p
