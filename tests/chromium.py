"""A headless Chromium driven over the DevTools protocol, for the report page's browser tests
(tests/test_report_page.py) and its screenshot (scripts/report_screenshot.py).

The browser is the system's (Debian's ``chromium``; ``make test`` installs it with apt-get where
it runs as root). The protocol goes over one websocket with ``websocket-client`` (pinned in the dev
extra): a small, maintained, pure-Python client that downloads nothing, where Playwright would
want its own browser builds and a bundled Node driver, and Selenium a chromedriver matching the
browser's version. Each :class:`Chromium` starts with a fresh ``--user-data-dir`` and talks to its
one page target; :meth:`Chromium.open` returns what the page logged and opened while loading.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The flags of a quiet, sandbox-less headless browser that reaches for nothing on its own.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-port=0",
    "--hide-scrollbars",
    "--window-size=1280,1600",
)
NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """The browser to use: ``$SPIKECHECK_CHROMIUM``, else the first of :data:`NAMES` on PATH."""
    explicit = os.environ.get("SPIKECHECK_CHROMIUM")
    if explicit:
        return explicit
    return next((path for path in map(shutil.which, NAMES) if path), None)


def require_chromium() -> str:
    """The browser the page tests open, or the test's end: a failure under CI (which installs
    Debian's chromium: make test), a skip elsewhere, each saying so."""
    import pytest

    executable = find_chromium()
    if executable is None:
        if os.environ.get("CI"):
            pytest.fail("no chromium on PATH: CI runs the browser tests (make test installs Debian's chromium)")
        pytest.skip("no chromium on PATH (apt-get install chromium, or set SPIKECHECK_CHROMIUM)")
    return executable


@dataclass
class Loaded:
    """What a page did while loading: console errors (exceptions, console.error, the browser's own
    error log: a blocked script, an image that failed) and the JavaScript dialogs it opened."""

    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)


class Chromium:
    def __init__(self, executable: str, timeout: float = 30.0) -> None:
        import websocket  # the dev extra's websocket-client

        self.timeout = timeout
        self.profile = Path(tempfile.mkdtemp(prefix="spikecheck-chromium-"))
        self.process = subprocess.Popen(
            [executable, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            port = self._devtools_port()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout) as response:
                targets = json.load(response)
            page = next(t for t in targets if t.get("type") == "page")
            self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=timeout, suppress_origin=True)
        except BaseException:
            self.close()
            raise
        self._id = 0
        self._events: list[dict[str, Any]] = []
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")

    def _devtools_port(self) -> int:
        """The port Chromium chose, from the DevToolsActivePort file it writes in its profile."""
        marker = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"chromium exited with status {self.process.returncode} before it listened")
            if marker.is_file() and marker.read_text().strip():
                return int(marker.read_text().split()[0])
            time.sleep(0.05)
        raise RuntimeError(f"chromium did not write {marker} within {self.timeout:g} s")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command and return its result; events that arrive meanwhile are kept."""
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self._events.append(message)

    def _wait_for(self, event: str) -> None:
        """Read events until ``event`` arrives, accepting any dialog on the way (a dialog blocks
        the page, and its load event with it)."""
        seen = 0
        while True:
            while seen < len(self._events):
                method = self._events[seen].get("method")
                seen += 1
                if method == event:
                    return
                if method == "Page.javascriptDialogOpening":
                    self.call("Page.handleJavaScriptDialog", accept=True)
            self._events.append(json.loads(self.ws.recv()))

    def open(self, path: Path, settle: float = 0.2) -> Loaded:
        """Load ``path`` and wait for its load event (and ``settle`` seconds for late errors)."""
        self._events.clear()
        self.call("Page.navigate", url=Path(path).resolve().as_uri())
        self._wait_for("Page.loadEventFired")
        self.evaluate(f"new Promise(done => setTimeout(done, {int(settle * 1000)}))")
        loaded = Loaded()
        for e in self._events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                loaded.errors.append(details.get("exception", {}).get("description") or details.get("text", "exception"))
            elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
                loaded.errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params["args"]))
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                loaded.errors.append(params["entry"].get("text", ""))
            elif method == "Page.javascriptDialogOpening":
                loaded.dialogs.append(params.get("message", ""))
        return loaded

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:60]}...: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def click(self, selector: str) -> None:
        """A real mouse click (pressed and released) at the middle of the element ``selector``."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.scrollIntoView(); "
            f"const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }})()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

    def screenshot(self, path: Path, width: int = 1280, height: int = 1600) -> Path:
        """A PNG of the top ``width`` x ``height`` pixels of the page."""
        import base64

        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        self.evaluate("window.scrollTo(0, 0)")
        data = self.call(
            "Page.captureScreenshot", format="png", clip={"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
        )["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)

    def close(self) -> None:
        ws = getattr(self, "ws", None)
        if ws is not None:
            try:
                self.call("Browser.close")
            except Exception:  # it may close the socket before it answers
                pass
            ws.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.profile, ignore_errors=True)
