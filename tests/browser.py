"""A real browser for tests: Debian's headless Chromium driven over the DevTools protocol.

load(page) opens a local HTML file, waits for its load event, and returns what a person would
have seen: console errors and uncaught exceptions, every network request the page made, each
`figure.plot`'s rendered size and drawn elements, and a full-page screenshot (PNG)."""
from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List

import websocket

CHROMIUM_PACKAGE = "chromium"
# each plot: its id, its SVG's rendered box and how many shapes it drew
PLOTS_JS = """JSON.stringify(Array.from(document.querySelectorAll('figure.plot')).map(f => {
  const svg = f.querySelector('svg'); const box = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
  return {id: f.id, width: box.width, height: box.height,
          shapes: svg ? svg.querySelectorAll('path, use, rect, line, polyline').length : 0};
}))"""


@dataclass
class PageView:
    errors: List[str]
    requests: List[str]
    plots: List[Dict[str, Any]]
    screenshot_png: bytes


def chromium() -> str:
    found = shutil.which("chromium")
    if not found:
        raise RuntimeError("chromium not found (apt-get install chromium)")
    return found


def _devtools_port(profile: Path, proc: subprocess.Popen, timeout_s: float = 60.0) -> int:
    deadline = time.monotonic() + timeout_s
    marker = profile / "DevToolsActivePort"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log = profile / "chromium.log"
            raise RuntimeError(f"chromium exited with {proc.returncode}: {log.read_text()[-2000:] if log.exists() else ''}")
        if marker.exists() and marker.read_text().strip():
            return int(marker.read_text().split()[0])
        time.sleep(0.1)
    raise RuntimeError("chromium did not open its DevTools port")


class _Session:
    def __init__(self, url: str) -> None:
        self.ws = websocket.create_connection(url, timeout=60)
        self.ids = itertools.count(1)
        self.events: List[Dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> Dict[str, Any]:
        call_id = next(self.ids)
        self.ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))
            self.events.append(message)

    def wait_for(self, method: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(e.get("method") == method for e in self.events):
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {method} within {timeout_s} s")
            self.events.append(json.loads(self.ws.recv()))


def _errors(events: List[Dict[str, Any]]) -> List[str]:
    out = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            out.append(f"exception: {params['exceptionDetails'].get('text')}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            out.append("console: " + " ".join(str(arg.get("value", arg.get("description"))) for arg in params["args"]))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            out.append(f"log: {params['entry'].get('text')}")
    return out


def load(page: Path, *, width_px: int = 1200) -> PageView:
    with tempfile.TemporaryDirectory(prefix="st-chromium-") as profile, \
            open(Path(profile) / "chromium.log", "w") as log:       # a file, not a pipe nobody drains
        proc = subprocess.Popen([chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                 "--disable-dev-shm-usage", "--remote-debugging-port=0", f"--user-data-dir={profile}",
                                 "about:blank"], stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
        try:
            port = _devtools_port(Path(profile), proc)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as response:
                targets = json.load(response)
            target = next(t for t in targets if t.get("type") == "page")
            session = _Session(target["webSocketDebuggerUrl"])
            for domain in ("Page", "Runtime", "Log", "Network"):
                session.call(f"{domain}.enable")
            session.call("Emulation.setDeviceMetricsOverride", width=width_px, height=900, deviceScaleFactor=1,
                         mobile=False)
            session.call("Page.navigate", url=page.resolve().as_uri())
            session.wait_for("Page.loadEventFired")
            plots = json.loads(session.call("Runtime.evaluate", expression=PLOTS_JS, returnByValue=True)
                               ["result"]["value"])
            shot = session.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
            requests = [e["params"]["request"]["url"] for e in session.events
                        if e.get("method") == "Network.requestWillBeSent"]
            errors = _errors(session.events)
            session.ws.close()
        finally:
            os.killpg(proc.pid, signal.SIGTERM)      # the browser and its zygote, GPU and renderer children
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return PageView(errors, requests, plots, base64.b64decode(shot["data"]))
