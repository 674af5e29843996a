#!/usr/bin/env python3
"""Open every page of a built Jupyter Book in headless Chromium and report what is broken.

Usage:
    python tools/check_book.py _build/html [--timeout SECONDS] [--chromium PATH] [-v]

For each HTML page (`_static/`, `_sources/` and `_images/` are skipped) the checker serves the
build folder from a local http.server on 127.0.0.1, loads the page in a fresh tab through the Chrome
DevTools Protocol, waits for MathJax to finish typesetting, and fails the page on:

* JavaScript console errors, uncaught exceptions and browser log errors;
* local resources answered with an HTTP error status;
* images that did not load (``naturalWidth == 0``) and videos the browser cannot open;
* math left unrendered (``$$``, ``\\(``, ``\\[``, ``\\begin{`` in visible text outside code) or MathJax
  error nodes (``mjx-merror``), and a MathJax that never finishes;
* any request to a URL that is not the local server (such requests are blocked, not sent);
* a table wider than the page's content column (laid out in a 1280 px wide window) that no horizontally
  scrolling wrapper holds;
* a page over 500 KB (inline media, or a reference page to split: :func:`size_problems`);
* a link whose text names a chapter number ("7. Image to video", "chapter 5") other than the chapter of the page
  it leads to (chapter pages are ``notebooks/NN_*.html``; :func:`chapter_link_problems`);
* an absolute path of the build machine (the project folder, the home folder, or a temporary folder in a cell's
  output), more than one progress-bar line in one output, a stderr box (empty, or holding anything but a progress
  bar; reported with a snippet), a video embedded as base64 instead of linked, or an internal verdict left in the
  text (see :func:`static_problems`);
* a chapter whose code copies an mp4 into the book (``video_html(..., media_dir=...)``) but whose page shows no
  ``<video>`` of a file in the build's ``_static/videos`` for each such call: the mp4 ships, and no reader sees it
  (:func:`video_embed_problems`).

It prints one line per page and a summary line. Exit status: 0 all pages clean, 1 problems found,
2 the checker could not run (no Chromium, no websocket-client, bad folder).

Needs Debian's Chromium (``apt-get install -y chromium``) and the ``websocket-client`` package
(a Jupyter dependency, so it is in the project venv). Everything else is the standard library.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import html
import http.server
import json
import os
import posixpath
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

DEFAULT_CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--no-default-browser-check",
    "--mute-audio",
]
#: The window every page is laid out in (CSS px): a laptop screen. Tables must fit its content column or scroll.
VIEWPORT = (1280, 900)
# Schemes that never reach the network.
LOCAL_SCHEMES = {"data", "blob", "about", "javascript", "chrome", "chrome-extension", "devtools"}

# Runs in the page after the load event. Waits for MathJax (if the page loads it), then collects
# broken images, raw TeX left in visible text, and MathJax error nodes.
PAGE_CHECK_JS = r"""
(async (mathjaxTimeoutMs) => {
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const result = {mathjax: "absent", images: 0, brokenImages: [], rawMath: [], mjxErrors: []};

  const mjScript = Array.from(document.scripts).some((s) => /mathjax/i.test(s.src || ""));
  if (mjScript) {
    const t0 = Date.now();
    while (!(window.MathJax && MathJax.startup && MathJax.startup.promise)) {
      if (Date.now() - t0 > mathjaxTimeoutMs) { result.mathjax = "did not start"; break; }
      await sleep(50);
    }
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
      try {
        await Promise.race([
          MathJax.startup.promise,
          sleep(mathjaxTimeoutMs).then(() => { throw new Error("typesetting timed out"); }),
        ]);
        result.mathjax = "ok " + (MathJax.version || "");
      } catch (e) {
        result.mathjax = "error: " + e;
      }
    }
  }

  const imgs = Array.from(document.images);
  result.images = imgs.length;
  for (const img of imgs) {
    if (img.loading === "lazy") img.loading = "eager";
    if (!img.complete) {
      await Promise.race([img.decode().catch(() => {}), sleep(5000)]);
    }
    if (img.naturalWidth === 0) result.brokenImages.push(img.currentSrc || img.src || img.outerHTML.slice(0, 120));
  }

  const videos = Array.from(document.querySelectorAll("video"));
  result.videos = videos.length;
  result.brokenVideos = [];
  for (const v of videos) {
    const src = (v.currentSrc || v.src || (v.querySelector("source") || {}).src || "?").slice(0, 80);
    if (v.readyState < 1 && !v.error) {
      if (v.preload === "none") { v.preload = "metadata"; v.load(); }
      await Promise.race([
        new Promise((r) => { v.addEventListener("loadedmetadata", r, {once: true}); v.addEventListener("error", r, {once: true}); }),
        sleep(10000),
      ]);
    }
    if (v.error) result.brokenVideos.push(`${src}: MediaError ${v.error.code} ${v.error.message || ""}`.trim());
    else if (v.readyState < 1) result.brokenVideos.push(`${src}: no metadata after 10 s`);
    else if (v.videoWidth === 0) result.brokenVideos.push(`${src}: decoded with zero width`);
  }

  const skipTags = new Set(["PRE", "CODE", "KBD", "SAMP", "SCRIPT", "STYLE", "TEXTAREA", "NOSCRIPT", "MJX-CONTAINER"]);
  const patterns = ["$$", "\\(", "\\)", "\\[", "\\]", "\\begin{"];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const node = walker.currentNode;
    let el = node.parentElement, skip = false;
    while (el) {
      if (skipTags.has(el.tagName) || el.classList.contains("highlight")) { skip = true; break; }
      el = el.parentElement;
    }
    if (skip) continue;
    const text = node.nodeValue;
    if (patterns.some((p) => text.includes(p))) result.rawMath.push(text.trim().replace(/\s+/g, " ").slice(0, 100));
  }

  for (const err of document.querySelectorAll("mjx-merror")) {
    result.mjxErrors.push((err.getAttribute("data-mjx-error") || err.textContent || "").slice(0, 100));
  }

  // Tables wider than the page's content column, unless a horizontally scrolling wrapper inside the column holds them.
  const content = document.querySelector("article.bd-article") || document.querySelector("main") || document.body;
  const cRect = content.getBoundingClientRect(), cStyle = getComputedStyle(content);
  const left = cRect.left + parseFloat(cStyle.paddingLeft || "0") + parseFloat(cStyle.borderLeftWidth || "0");
  const right = cRect.right - parseFloat(cStyle.paddingRight || "0") - parseFloat(cStyle.borderRightWidth || "0");
  result.wideTables = [];
  for (const table of content.querySelectorAll("table")) {
    const r = table.getBoundingClientRect();
    if (r.width === 0 || (r.right <= right + 1 && r.left >= left - 1)) continue;  // hidden, or fits
    let scrolls = false;
    for (let el = table.parentElement; el && el !== content.parentElement; el = el.parentElement) {
      const ox = getComputedStyle(el).overflowX;
      const box = el.getBoundingClientRect();
      const inside = box.right <= right + 1 && box.left >= left - 1;
      if ((ox === "auto" || ox === "scroll") && inside) { scrolls = true; break; }
    }
    if (scrolls) continue;
    const row = table.querySelector("tr");
    const head = row ? Array.from(row.children).map((c) => c.textContent.trim().replace(/\s+/g, " ")) : [];
    result.wideTables.push({width: Math.round(r.width), room: Math.round(right - Math.max(left, r.left)),
                            columns: head.length, head: head.join(" | ").slice(0, 80)});
  }
  return result;
})
"""


class CheckerError(Exception):
    """The checker itself cannot run (exit status 2)."""


class CDPError(Exception):
    """A DevTools command returned an error."""


class CDP:
    """A minimal Chrome DevTools Protocol client over one browser websocket (flattened sessions)."""

    def __init__(self, ws_url: str, timeout: float):
        import websocket  # websocket-client

        self._ws = websocket.create_connection(ws_url, timeout=timeout, suppress_origin=True)
        self._ws.settimeout(None)
        self._send_lock = threading.Lock()
        self._next_id = 0
        self._pending: dict[int, tuple[threading.Event, list]] = {}
        self._pending_lock = threading.Lock()
        self._sessions: dict[str, queue.Queue] = {}
        self._handlers: dict[str, object] = {}
        self._closed = False
        self._reader = threading.Thread(target=self._read_loop, name="cdp-reader", daemon=True)
        self._reader.start()

    def _read_loop(self) -> None:
        while not self._closed:
            try:
                raw = self._ws.recv()
            except Exception:
                break
            if not raw:
                continue
            msg = json.loads(raw)
            if "id" in msg:
                with self._pending_lock:
                    waiter = self._pending.pop(msg["id"], None)
                if waiter is not None:
                    waiter[1].append(msg)
                    waiter[0].set()
                continue
            session = msg.get("sessionId")
            handler = self._handlers.get(session)
            if handler is not None:
                handler(msg)  # runs on the reader thread; must not wait for replies
            q = self._sessions.get(session)
            if q is not None:
                q.put(msg)
        self._closed = True
        with self._pending_lock:
            for event, box in self._pending.values():
                box.append({"error": {"message": "DevTools connection closed"}})
                event.set()
            self._pending.clear()

    def _send(self, method: str, params: dict | None, session: str | None) -> tuple[int, threading.Event, list]:
        if self._closed:
            raise CDPError("DevTools connection closed")
        with self._send_lock:
            self._next_id += 1
            msg_id = self._next_id
            event, box = threading.Event(), []
            with self._pending_lock:
                self._pending[msg_id] = (event, box)
            msg = {"id": msg_id, "method": method, "params": params or {}}
            if session:
                msg["sessionId"] = session
            self._ws.send(json.dumps(msg))
        return msg_id, event, box

    def call(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 30.0) -> dict:
        msg_id, event, box = self._send(method, params, session)
        if not event.wait(timeout):
            with self._pending_lock:
                self._pending.pop(msg_id, None)
            raise TimeoutError(f"{method} did not answer within {timeout:.0f} s")
        reply = box[0]
        if "error" in reply:
            raise CDPError(f"{method}: {reply['error'].get('message')}")
        return reply.get("result", {})

    def notify(self, method: str, params: dict | None = None, session: str | None = None) -> None:
        """Send a command without waiting for the reply (safe on the reader thread)."""
        msg_id, _, _ = self._send(method, params, session)
        with self._pending_lock:
            self._pending.pop(msg_id, None)

    def open_session(self, session: str, handler) -> queue.Queue:
        q: queue.Queue = queue.Queue()
        self._sessions[session] = q
        self._handlers[session] = handler
        return q

    def close_session(self, session: str) -> None:
        self._sessions.pop(session, None)
        self._handlers.pop(session, None)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(Exception):
            self._ws.close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - signature fixed by the base class
        pass


@contextlib.contextmanager
def serve(directory: Path):
    handler = functools.partial(QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="http-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def chromium(binary: str, timeout: float):
    """Start a fresh headless Chromium; yield the browser's DevTools websocket URL."""
    with tempfile.TemporaryDirectory(prefix="check_book_chromium_") as tmp:
        profile = Path(tmp) / "profile"
        profile.mkdir()
        log = open(Path(tmp) / "chromium.log", "wb")
        cmd = [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            port_file = profile / "DevToolsActivePort"
            deadline = time.monotonic() + timeout
            while True:
                if port_file.exists():
                    lines = port_file.read_text().split()
                    if len(lines) >= 2:
                        yield f"ws://127.0.0.1:{lines[0]}{lines[1]}"
                        break
                if proc.poll() is not None:
                    log.flush()
                    tail = (Path(tmp) / "chromium.log").read_text(errors="replace")[-2000:]
                    raise CheckerError(f"Chromium exited with status {proc.returncode} before DevTools came up:\n{tail}")
                if time.monotonic() > deadline:
                    raise CheckerError(f"Chromium did not open its DevTools port within {timeout:.0f} s")
                time.sleep(0.05)
        finally:
            _stop_group(proc)
            log.close()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop_group(proc: subprocess.Popen) -> None:
    """Stop the browser started above and its helper processes (its own process group)."""
    pgid = proc.pid  # start_new_session=True made the browser the leader of a new group
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (proc.poll() is None or _group_alive(pgid)):
        time.sleep(0.1)  # after Browser.close the processes normally exit by themselves
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is None or _group_alive(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)


def is_local(url: str, origin: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme in LOCAL_SCHEMES:
        return True
    if parts.scheme in ("http", "https", "ws", "wss"):
        return f"http://{parts.netloc}" == origin and parts.scheme in ("http", "ws")
    return False


def redirect_target(path: Path) -> str | None:
    """The target of a meta-refresh redirect page (like Jupyter Book's root index.html), else None."""
    head = path.read_text(errors="replace")[:4000].lower()
    if 'http-equiv="refresh"' not in head and "http-equiv='refresh'" not in head:
        return None
    start = head.find("url=")
    if start < 0:
        return ""
    return head[start + 4 :].split('"')[0].split("'")[0].strip()


def console_text(params: dict) -> str:
    parts = []
    for arg in params.get("args", []):
        if "value" in arg:
            parts.append(str(arg["value"]))
        else:
            parts.append(arg.get("description", arg.get("type", "?")))
    return " ".join(parts)


def check_page(cdp: CDP, url: str, origin: str, timeout: float) -> tuple[list[str], dict]:
    """Load one page in a fresh tab; return (problems, info)."""
    problems: list[str] = []
    external: list[str] = []
    # Chromium probes /favicon.ico on its own when a page declares no icon; a 404 there is not a
    # page problem (real readers' browsers do the same and ignore it).
    favicon = f"{origin}/favicon.ico"
    seen: set[str] = set()

    def add(problem: str) -> None:
        if problem not in seen:
            seen.add(problem)
            problems.append(problem)

    target = cdp.call("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = cdp.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]

    def on_event(msg: dict) -> None:
        # Runs on the reader thread: answer paused requests right away so the page keeps loading.
        if msg.get("method") == "Fetch.requestPaused":
            params = msg["params"]
            req_url = params["request"]["url"]
            if is_local(req_url, origin):
                cdp.notify("Fetch.continueRequest", {"requestId": params["requestId"]}, session)
            else:
                external.append(req_url)
                cdp.notify("Fetch.failRequest", {"requestId": params["requestId"], "errorReason": "BlockedByClient"}, session)

    events = cdp.open_session(session, on_event)
    info: dict = {}
    try:
        for method, params in (
            ("Emulation.setDeviceMetricsOverride", {"width": VIEWPORT[0], "height": VIEWPORT[1],
                                                    "deviceScaleFactor": 1, "mobile": False}),
            ("Runtime.enable", None),
            ("Log.enable", None),
            ("Network.enable", None),
            ("Page.enable", None),
            ("Fetch.enable", {"patterns": [{"urlPattern": "*", "requestStage": "Request"}]}),
        ):
            cdp.call(method, params, session)

        nav = cdp.call("Page.navigate", {"url": url}, session, timeout=timeout)
        if nav.get("errorText"):
            add(f"navigation failed: {nav['errorText']}")
        else:
            loaded = False
            deadline = time.monotonic() + timeout
            pending_events: list[dict] = []
            while time.monotonic() < deadline:
                try:
                    msg = events.get(timeout=0.1)
                except queue.Empty:
                    continue
                pending_events.append(msg)
                if msg.get("method") == "Page.loadEventFired":
                    loaded = True
                    break
            for msg in pending_events:
                events.put(msg)  # keep them for the event scan below
            if not loaded:
                add(f"page did not finish loading within {timeout:.0f} s")
            else:
                res = cdp.call(
                    "Runtime.evaluate",
                    {
                        "expression": f"({PAGE_CHECK_JS})({int(timeout * 1000)})",
                        "awaitPromise": True,
                        "returnByValue": True,
                    },
                    session,
                    timeout=timeout * 2 + 10,
                )
                if "exceptionDetails" in res:
                    add(f"page check script failed: {res['exceptionDetails'].get('text')}")
                else:
                    info = res["result"]["value"]
                    if info["mathjax"] not in ("absent",) and not info["mathjax"].startswith("ok"):
                        add(f"MathJax {info['mathjax']}")
                    for src in info["brokenImages"]:
                        add(f"image failed to load: {src}")
                    for text in info["brokenVideos"]:
                        add(f"video failed to load: {text}")
                    for text in info["rawMath"]:
                        add(f"unrendered math in text: {text!r}")
                    for text in info["mjxErrors"]:
                        add(f"MathJax error node (mjx-merror): {text!r}")
                    for t in info["wideTables"]:
                        add(f"table wider than the page ({t['width']} px in {t['room']} px, {t['columns']} columns) "
                            f"and not in a horizontally scrolling wrapper: {t['head']!r}")
                time.sleep(0.2)  # let late console messages arrive

        while True:
            try:
                msg = events.get_nowait()
            except queue.Empty:
                break
            method, params = msg.get("method"), msg.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                add(f"console.{params['type']}: {console_text(params)[:300]}")
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                desc = details.get("exception", {}).get("description") or details.get("text", "")
                add(f"uncaught exception: {desc.splitlines()[0] if desc else '?'}")
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                entry = params["entry"]
                if entry.get("url") == favicon:
                    continue
                where = f" ({entry['url']})" if entry.get("url") else ""
                add(f"browser log error [{entry.get('source')}]: {entry.get('text', '')[:300]}{where}")
            elif method == "Network.responseReceived":
                resp = params.get("response", {})
                if resp.get("status", 0) >= 400 and is_local(resp.get("url", ""), origin) and resp.get("url") != favicon:
                    add(f"HTTP {resp['status']} for {resp['url']}")
            elif method == "Network.requestWillBeSent":
                req_url = params.get("request", {}).get("url", "")
                if not is_local(req_url, origin):
                    external.append(req_url)
            elif method == "Network.webSocketCreated":
                if not is_local(params.get("url", ""), origin):
                    external.append(params.get("url", ""))
    finally:
        cdp.close_session(session)
        with contextlib.suppress(Exception):
            cdp.call("Target.closeTarget", {"targetId": target}, timeout=10)

    for req_url in dict.fromkeys(external):
        add(f"request to non-local URL (blocked): {req_url}")
    return problems, info


#: Largest page allowed: every page must load quickly, so media go in small or scaled, and long references are split.
MAX_PAGE_BYTES = 500_000
#: A cell's stream output as myst-nb renders it (stdout: "stream", stderr: "stderr").
OUTPUT_BLOCK = re.compile(r'<div class="output (stream|stderr)[^"]*">\s*<div class="highlight"><pre>(.*?)</pre>', re.S)
#: One tqdm bar line ("45%|####      | 9/20 [...]").
PROGRESS_LINE = re.compile(r"\d+%\|")
#: Project-process words that belong in the tracker, not in a reader's book.
INTERNAL_TEXT = re.compile(r"\bgoal met\b|\bthe issue's\b|\bissue \d+\b", re.I)


def _visible_text(html_fragment: str) -> str:
    """Text of an HTML fragment as a terminal would end up showing it: tags dropped, entities decoded, and each
    line reduced to what follows its last carriage return (a progress bar redraws itself with \\r)."""
    text = html.unescape(re.sub(r"<[^>]+>", "", html_fragment))
    return "\n".join(line.rsplit("\r", 1)[-1] for line in text.split("\n"))


def size_problems(n_bytes: int) -> list[str]:
    """A built page over :data:`MAX_PAGE_BYTES` (inline media, or a reference page that should be split)."""
    if n_bytes > MAX_PAGE_BYTES:
        return [f"page is {n_bytes / 1e3:,.0f} KB, over {MAX_PAGE_BYTES / 1e3:,.0f} KB"]
    return []


def _only_progress_bars(text: str) -> bool:
    """Whether every non-blank line of an output is a progress bar (tqdm writes its bar to stderr on purpose)."""
    lines = [line for line in text.split("\n") if line.strip()]
    return bool(lines) and all(PROGRESS_LINE.search(line) for line in lines)


#: A chapter page: notebooks/NN_name.html, NN the chapter number (the titles say "NN. ...", _toc.yml does not number).
CHAPTER_PAGE = re.compile(r"(?:^|/)notebooks/(\d+)_[^/]*\.html$")
#: Link texts that name a chapter: a title as the book writes chapter titles ("7. Image to video", also after
#: "previous"/"next" in the page footer) or the word ("chapter 5").
CHAPTER_IN_TEXT = (re.compile(r"^(?:previous\s+|next\s+)?(\d{1,2})\.\s+[^\d\s]", re.I),
                   re.compile(r"\bchapter\s+(\d{1,2})\b", re.I))


def chapter_of(page: str) -> int | None:
    """The chapter number of a built page (path relative to the build folder), or None for other pages."""
    match = CHAPTER_PAGE.search(page)
    return int(match.group(1)) if match else None


class _Links(HTMLParser):
    """(href, visible text) of every <a href> of a page."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.links: list[tuple[str, str]] = []
        self._open: list[list] = []  # [href, text parts] of the <a> elements being read
        self._skip = 0  # inside <script>/<style>

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self._skip += 1
        elif tag == "a":
            self._open.append([dict(attrs).get("href"), []])

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self._skip = max(0, self._skip - 1)
        elif tag == "a" and self._open:
            href, parts = self._open.pop()
            if href is not None:
                self.links.append((href, " ".join("".join(parts).split())))

    def handle_data(self, data):
        if not self._skip:
            for link in self._open:
                link[1].append(data)


def chapter_link_problems(page_html: str, page: str) -> list[str]:
    """Links whose text names a chapter number ("7. Image to video", "chapter 5") other than the chapter of the page
    they lead to (``page``: this page's path relative to the build folder, to resolve relative links)."""
    parser = _Links()
    parser.feed(page_html)
    problems = []
    for href, text in parser.links:
        parts = urlsplit(href)
        if parts.scheme or parts.netloc:
            continue  # another site: no chapter of this book
        named = {int(m.group(1)) for pattern in CHAPTER_IN_TEXT for m in pattern.finditer(text)}
        if not named:
            continue
        target = page  # "#section": this page
        if parts.path:
            target = posixpath.normpath(posixpath.join(posixpath.dirname(page), unquote(parts.path)))
        chapter = chapter_of(target)
        for number in sorted(named - {chapter}):
            where = f"chapter {chapter}" if chapter is not None else "not a chapter"
            problem = f"link text {text[:80]!r} names chapter {number}, but leads to {target} ({where})"
            if problem not in problems:
                problems.append(problem)
    return problems


def machine_paths() -> list[str]:
    """Absolute paths that would identify the build machine if they appeared in a page."""
    project = str(Path(__file__).resolve().parents[1])
    home = str(Path.home())
    return [p for p in dict.fromkeys([project, home, os.path.realpath(project)]) if len(p) > 1]


def static_problems(page_html: str, paths: list[str], temp_dir: str = tempfile.gettempdir()) -> list[str]:
    """What a reader should never see in a page, found in its HTML without a browser: the build machine's paths
    (``paths`` anywhere; ``temp_dir`` in a cell's output), more than one progress-bar line in one output, a stderr
    box (empty, or with anything but a progress bar: warnings, logs, libtpu's start-up messages), internal verdicts."""
    problems = []
    for path in paths:
        if re.search(re.escape(path) + r"(?=[/\s\"'<]|$)", page_html):
            problems.append(f"absolute path of the build machine in the page: {path}")
    for kind, body in OUTPUT_BLOCK.findall(page_html):
        text = _visible_text(body)
        if kind == "stderr" and not text.strip():
            problems.append("empty stderr box in a cell's output")
        elif kind == "stderr" and not _only_progress_bars(text):
            snippet = " ".join(" ".join(line for line in text.split("\n") if not PROGRESS_LINE.search(line)).split())
            problems.append(f"stderr box in a cell's output: {snippet[:120]!r}")
        bars = sum(bool(PROGRESS_LINE.search(line)) for line in text.split("\n"))
        if bars > 1:
            problems.append(f"{bars} progress-bar lines in one cell's output (one at most)")
        if temp_dir.rstrip("/") + "/" in text:
            problems.append(f"temporary path of the build machine in a cell's output: {temp_dir}")
    if re.search(r'<video[^>]*src="data:', page_html) or re.search(r'<source[^>]*src="data:', page_html):
        problems.append("video embedded as base64 in the page (link the file: display.video_html(media_dir=...))")
    body_text = _visible_text(re.sub(r"<(script|style)\b.*?</\1>", "", page_html, flags=re.S))
    for match in dict.fromkeys(m.group(0) for m in INTERNAL_TEXT.finditer(body_text)):
        problems.append(f"internal wording in the page: {match!r}")
    return problems


#: A code cell's source as myst-nb renders it: the input box of a notebook cell (markdown code blocks are not cells).
CELL_SOURCE = re.compile(r'<div class="cell_input[^"]*">\s*<div class="highlight-[^"]*"><div class="highlight">'
                         r'<pre>(.*?)</pre>', re.S)
#: Where a chapter's videos go in the built book: display.video_html(media_dir="../_static/videos") copies them there.
VIDEO_DIR = "_static/videos"
#: The URL of each <video>'s file: its src, or the src of a <source> inside it.
VIDEO_SOURCES = re.compile(r'<video\b[^>]*?\ssrc="([^"]*)"|<video\b[^>]*>\s*(?:<source\b[^>]*?\ssrc="([^"]*)")?', re.S)


def _media_calls(code: str) -> int:
    """How many ``video_html(...)`` calls in ``code`` pass ``media_dir`` (each copies an mp4 into the book)."""
    calls = 0
    for match in re.finditer(r"\bvideo_html\s*\(", code):
        depth, end = 1, match.end()
        while end < len(code) and depth:  # the call's arguments, nested parentheses included
            depth += {"(": 1, ")": -1}.get(code[end], 0)
            end += 1
        arguments = code[match.end():end]
        calls += bool(re.search(r"\bmedia_dir\s*=", arguments)) and not re.search(r"\bdef\s+$", code[:match.start()])
    return calls


def video_embed_problems(page_html: str, page: str, root: Path | None = None) -> list[str]:
    """A chapter page (``page``: its path relative to the build folder) whose code cells call
    ``video_html(..., media_dir=...)``, copying an mp4 into the book, and that does not show as many ``<video>``
    elements whose file is in the build's ``_static/videos`` (and exists there, with ``root``, the build folder).
    The call's HTML is only shown when it is a cell's last value or passed to ``display``: one that is neither
    ships the file to no reader."""
    if chapter_of(page) is None:
        return []
    code = "\n".join(_visible_text(block) for block in CELL_SOURCE.findall(page_html))
    calls = _media_calls(code)
    if not calls:
        return []
    shown, problems = 0, []
    for match in VIDEO_SOURCES.finditer(page_html):
        src = match.group(1) or match.group(2)
        if not src or urlsplit(src).scheme or urlsplit(src).netloc:
            continue  # no file, a data URI (static_problems reports it) or another site
        target = posixpath.normpath(posixpath.join(posixpath.dirname(page), unquote(urlsplit(src).path)))
        if posixpath.dirname(target) != VIDEO_DIR:
            continue
        if root is not None and not (root / target).is_file():
            problems.append(f"video links {target}, which is not in the build")
            continue
        shown += 1
    if shown < calls:
        problems.append(f"the code copies {calls} mp4 file(s) into {VIDEO_DIR} (video_html(media_dir=...)) but the "
                        f"page shows {shown} <video> of them (display() the HTML video_html returns)")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("html_dir", nargs="?", default="_build/html", help="built HTML folder (default: _build/html)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds allowed per page load and for MathJax (default: 30)")
    parser.add_argument("--chromium", default=DEFAULT_CHROMIUM, help=f"Chromium binary (default: {DEFAULT_CHROMIUM})")
    parser.add_argument("-v", "--verbose", action="store_true", help="also print MathJax status and image/video counts")
    args = parser.parse_args(argv)

    root = Path(args.html_dir).resolve()
    if not root.is_dir():
        print(f"error: {args.html_dir}: not a directory (build the book first: make book)", file=sys.stderr)
        return 2
    binary = args.chromium if os.path.sep in args.chromium else (shutil.which(args.chromium) or args.chromium)
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        print(
            f"error: Chromium not found at {args.chromium}.\n"
            "Install Debian's package:  apt-get update && apt-get install -y chromium\n"
            "or pass another binary with --chromium PATH.",
            file=sys.stderr,
        )
        return 2
    try:
        import websocket  # noqa: F401
    except ImportError:
        print(
            "error: the websocket-client package is missing; run this with the project venv "
            "(.venv/bin/python tools/check_book.py ...) or install websocket-client there.",
            file=sys.stderr,
        )
        return 2

    pages = sorted(
        p for p in root.rglob("*.html") if p.relative_to(root).parts[0] not in ("_static", "_sources", "_images")
    )
    if not pages:
        print(f"error: no HTML pages under {root}", file=sys.stderr)
        return 2

    paths = machine_paths()
    t_start = time.monotonic()
    failed = 0
    total_problems = 0
    try:
        with serve(root) as origin, chromium(binary, args.timeout) as ws_url:
            cdp = CDP(ws_url, timeout=args.timeout)
            try:
                for page in pages:
                    rel = page.relative_to(root).as_posix()
                    t0 = time.monotonic()
                    target = redirect_target(page)
                    if target is not None:
                        dest = (page.parent / target.split("#")[0]).resolve() if target else None
                        if dest is None or not dest.is_file():
                            problems, note = [f"redirect to missing page {target!r}"], ""
                        else:
                            problems, note = [], f"redirect -> {target}"
                    else:
                        problems, info = check_page(cdp, f"{origin}/{quote(rel)}", origin, args.timeout)
                        note = ""
                        if args.verbose and info:
                            note = f"mathjax={info['mathjax']} images={info['images']} videos={info['videos']}"
                    problems += size_problems(page.stat().st_size)
                    page_html = page.read_text(encoding="utf-8", errors="replace")
                    problems += static_problems(page_html, paths)
                    problems += chapter_link_problems(page_html, rel)
                    problems += video_embed_problems(page_html, rel, root)
                    status = "FAIL" if problems else "ok  "
                    print(f"{status} {rel}  ({time.monotonic() - t0:.1f} s){'  ' + note if note else ''}", flush=True)
                    for problem in problems:
                        print(f"       - {problem}", flush=True)
                    if problems:
                        failed += 1
                        total_problems += len(problems)
            finally:
                with contextlib.suppress(Exception):
                    cdp.call("Browser.close", timeout=5)
                cdp.close()
    except CheckerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    elapsed = time.monotonic() - t_start
    print(
        f"checked {len(pages)} pages in {elapsed:.1f} s: {len(pages) - failed} clean, "
        f"{failed} with problems ({total_problems} problems)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
