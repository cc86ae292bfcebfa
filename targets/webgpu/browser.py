"""Run a webgpu bundle's web page (``index.html``) in headless Chromium and read its result.

Rules:

1. The page run is mconv's, never the bundle's: :func:`stage_site` writes into a private
   temporary folder mconv's own ``index.html`` and ES modules, the plan and WGSL kernels as
   mconv regenerates them from the bundle's graph (:func:`mconv.targets.webgpu.regenerate`: a
   bundle whose shipped plan or kernels differ is refused), and the bundle's data files
   (``manifest.json``, ``weights.mcw``, read through the bundle's integrity check). That folder
   is served read-only on 127.0.0.1 (an ephemeral port, this process only); the optional feed
   (a ``weights.mcw``-format container of the model's inputs, written to a private temporary
   file) is served as ``/_mconv_feed.mcw``. Nothing else is served.
2. Chromium runs headless with a new empty profile, no network besides that server (the
   background-networking flags), and WebGPU on a software adapter (SwiftShader's Vulkan); it is
   driven over ``--remote-debugging-pipe`` (Chrome DevTools Protocol on file descriptors 3 and
   4: no extra package), bounded by a wall-clock deadline, and killed by its own pid at the end.
3. :func:`run_page` returns the page's ``window.mconvResult`` (outputs as arrays of the model's output types, timing,
   adapter) and, when asked, writes a PNG screenshot of the page after the run.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import json
import os
import select
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
from mconv.container import write_container
from mconv.errors import InputError

WEB = Path(__file__).parent / "web"
WEB_FILES = ("index.html", "mconv_webgpu.js", "mcw.js")
FEED = "_mconv_feed.mcw"
BROWSER_TRIES = 2
DEVICE_FAILED = "requestDevice failed"  # the page's error once its own tries are spent
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu-sandbox",
    "--enable-unsafe-webgpu",
    "--enable-features=Vulkan",
    "--use-vulkan=swiftshader",
    "--use-angle=swiftshader",
    "--use-webgpu-adapter=swiftshader",
    "--disable-vulkan-surface",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--disable-default-apps",
    "--disable-extensions",
    "--window-size=1000,800",
)


def web_payload() -> dict[str, bytes]:
    """The page files a bundle carries (index.html and its two ES modules)."""
    return {name: (WEB / name).read_bytes() for name in WEB_FILES}


def stage_site(bundle_dir: str | os.PathLike, site: str | os.PathLike) -> Path:
    """Rule 1: the folder the page is served from, written at ``site`` (which must not exist)."""
    from mconv.bundle import MANIFEST, WEIGHTS, load_bundle
    from mconv.targets.webgpu import NAME, PLAN, kernel_files, plan_json, regenerate

    bundle = load_bundle(bundle_dir)
    label = str(bundle.root)
    if bundle.target != NAME:
        raise InputError(
            f"bundle is for target '{bundle.target}', not '{NAME}'",
            path=label,
            hint=f"run it with --target {bundle.target}",
        )
    plan, _, _ = regenerate(bundle, label)
    files = {
        **web_payload(),
        PLAN: plan_json(plan),
        **kernel_files(plan),
        MANIFEST: bundle.read_bytes(MANIFEST),
    }
    if WEIGHTS in bundle.files:
        files[WEIGHTS] = bundle.read_bytes(WEIGHTS)
    root = Path(site)
    root.mkdir(mode=0o700)
    for rel, data in files.items():
        dest = root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
    return root


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class _Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        ".js": "text/javascript",
        ".wgsl": "text/plain",
        ".mcw": "application/octet-stream",
    }

    def __init__(self, *args, feed: str | None = None, **kwargs) -> None:
        self._feed = feed
        super().__init__(*args, **kwargs)

    def translate_path(self, path: str) -> str:
        if self._feed and path.split("?", 1)[0] == f"/{FEED}":
            return self._feed
        return super().translate_path(path)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


@contextlib.contextmanager
def serve(root: str | os.PathLike, feed: str | None = None) -> Iterator[str]:
    """Serve ``root`` (and ``feed`` as /_mconv_feed.mcw) on 127.0.0.1; yields the base URL."""
    handler = functools.partial(_Handler, directory=str(root), feed=feed)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _Pipe:
    """CDP over Chromium's --remote-debugging-pipe: NUL-terminated JSON messages."""

    def __init__(self, write_fd: int, read_fd: int, deadline: float) -> None:
        self.w, self.r, self.deadline = write_fd, read_fd, deadline
        self.buf = b""
        self.next_id = 0
        self.events: list[dict] = []

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self.next_id += 1
        msg: dict = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str) -> dict:
        while True:
            for i, ev in enumerate(self.events):
                if ev.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self._read())

    def _read(self) -> dict:
        while b"\0" not in self.buf:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the page did not finish in time")
            ready, _, _ = select.select([self.r], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.r, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe (it exited)")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)


def run_page(
    bundle_dir: str | os.PathLike,
    feeds: Mapping[str, np.ndarray] | None = None,
    *,
    screenshot: str | os.PathLike | None = None,
    runs: int = 3,
    timeout_s: float = 240.0,
    chromium: str | None = None,
    init_script: str | None = None,
    profile: bool = False,
) -> dict:
    """Open mconv's page for the bundle in headless Chromium; the page's result (rule 3).

    ``init_script`` is JavaScript run in the page before its own scripts (instrumentation).
    ``profile``: the page also runs one inference layer by layer (``?profile=1``) and returns
    each layer's wall time as ``layer_ms`` (a diagnostic; the timed runs stay one submit each).
    The page itself retries a failed ``requestDevice``; when all its tries fail (the browser's
    GPU process lost its instance), the whole browser is started once more.
    """
    result: dict = {}
    for _ in range(BROWSER_TRIES):
        result = _run_page_once(
            bundle_dir, feeds, screenshot, runs, timeout_s, chromium, init_script, profile
        )
        if not str(result.get("error", "")).startswith(DEVICE_FAILED):
            break
    return result


def _run_page_once(
    bundle_dir: str | os.PathLike,
    feeds: Mapping[str, np.ndarray] | None,
    screenshot: str | os.PathLike | None,
    runs: int,
    timeout_s: float,
    chromium: str | None,
    init_script: str | None,
    profile: bool = False,
) -> dict:
    bundle_dir = Path(bundle_dir)
    chromium = chromium or find_chromium()
    if chromium is None:
        raise InputError("no Chromium on this machine", path=str(bundle_dir), hint="apt-get install chromium")
    scratch = Path(tempfile.mkdtemp(prefix="mconv-page."))
    proc = None
    try:
        site = stage_site(bundle_dir, scratch / "site")
        feed = None
        if feeds:
            feed = str(scratch / "feed.mcw")
            write_container(
                feed,
                [(k, np.ascontiguousarray(v, dtype=np.float32), {"codec": "raw"}) for k, v in feeds.items()],
            )
        with serve(site, feed) as base:
            url = f"{base}/index.html?runs={int(runs)}" + (f"&feed=/{FEED}" if feed else "")
            url += "&profile=1" if profile else ""
            cmd_r, cmd_w = os.pipe()
            res_r, res_w = os.pipe()

            def fds() -> None:  # the child's fd 3 reads commands, fd 4 writes replies
                os.dup2(cmd_r, 3)
                os.dup2(res_w, 4)

            env = {**os.environ, "XDG_RUNTIME_DIR": str(scratch)}
            proc = subprocess.Popen(
                [
                    chromium,
                    *CHROMIUM_FLAGS,
                    f"--user-data-dir={scratch / 'profile'}",
                    "--remote-debugging-pipe",
                    "about:blank",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=open(scratch / "chromium.log", "wb"),  # noqa: SIM115 - closed with the process
                close_fds=False,
                preexec_fn=fds,  # noqa: PLW1509 - only dup2, before exec
                env=env,
            )
            os.close(cmd_r)
            os.close(res_w)
            cdp = _Pipe(cmd_w, res_r, time.monotonic() + timeout_s)
            try:
                target = cdp.call("Target.createTarget", {"url": "about:blank"})["targetId"]
                session = cdp.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
                    "sessionId"
                ]
                cdp.call("Page.enable", session=session)
                if init_script:
                    cdp.call(
                        "Page.addScriptToEvaluateOnNewDocument", {"source": init_script}, session=session
                    )
                cdp.call("Page.navigate", {"url": url}, session=session)
                cdp.wait_event("Page.loadEventFired")
                got = cdp.call(
                    "Runtime.evaluate",
                    {"expression": "window.mconvDone", "awaitPromise": True, "returnByValue": True},
                    session=session,
                )
                if "exceptionDetails" in got:
                    raise RuntimeError(f"the page threw: {got['exceptionDetails'].get('text')}")
                result = got["result"]["value"]
                if screenshot is not None:
                    shot = cdp.call("Page.captureScreenshot", {"format": "png"}, session=session)
                    Path(screenshot).write_bytes(base64.b64decode(shot["data"]))
                with contextlib.suppress(Exception):
                    cdp.call("Browser.close")
            finally:
                os.close(cmd_w)
                os.close(res_r)
        if isinstance(result, dict) and "outputs" in result:
            types = result.get("dtypes") or {}
            result["outputs"] = {
                k: np.asarray(
                    v, dtype=np.bool_ if types.get(k) == "bool" else types.get(k, "float32")
                ).reshape(result["shapes"][k])
                for k, v in result["outputs"].items()
            }
        return result
    finally:
        if proc is not None:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(scratch, ignore_errors=True)
