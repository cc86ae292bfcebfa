"""The report in a real browser: headless Chromium opens the report of a LeNet-5 budget run and
of a verify --localize, saves a screenshot in the test's folder, finds every chart drawn (its
SVG laid out, with its labels in the DOM) and sees no request leave the page."""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _system import can_install_system_packages  # noqa: E402
from lenet import digits, digits_npz, lenet_onnx, shared_dir  # noqa: E402

CHARTS_JS = """(() => {
  const figs = [...document.querySelectorAll('figure.chart')];
  return {
    csp: document.querySelector('meta[http-equiv="Content-Security-Policy"]')?.content,
    charts: figs.map(f => {
      const svg = f.querySelector('svg');
      const box = svg ? svg.getBoundingClientRect() : null;
      return {
        name: f.dataset.chart,
        width: box ? box.width : 0,
        height: box ? box.height : 0,
        paths: svg ? svg.querySelectorAll('path, rect, use').length : 0,
        texts: svg ? [...svg.querySelectorAll('text')].map(t => t.textContent) : [],
        label: svg ? svg.getAttribute('aria-label') : null,
        rows: f.querySelectorAll('.numbers td').length,
      };
    }),
  };
})()"""


def _chromium() -> str:
    from mconv.targets.webgpu.browser import find_chromium

    path = find_chromium()
    if path is None:
        if can_install_system_packages():
            pytest.fail("no Chromium: scripts/test installs it (apt-get install chromium)")
        pytest.skip("no Chromium on this machine (apt-get install chromium)")
    return path


def open_page(page: Path, screenshot: Path, timeout_s: float = 120.0) -> tuple[dict, list[str]]:
    """Load ``page`` (file://) in headless Chromium over the DevTools pipe: the charts' facts
    and every URL the page requested (itself excluded)."""
    from mconv.targets.webgpu.browser import _Pipe

    scratch = screenshot.parent / "chromium"
    scratch.mkdir(exist_ok=True)
    cmd_r, cmd_w = os.pipe()
    res_r, res_w = os.pipe()

    def fds() -> None:
        os.dup2(cmd_r, 3)
        os.dup2(res_w, 4)

    proc = subprocess.Popen(
        [_chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={scratch / 'profile'}", "--remote-debugging-pipe", "about:blank"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        close_fds=False, preexec_fn=fds, env={**os.environ, "XDG_RUNTIME_DIR": str(scratch)},
    )  # fmt: skip
    os.close(cmd_r)
    os.close(res_w)
    url = page.resolve().as_uri()
    try:
        cdp = _Pipe(cmd_w, res_r, time.monotonic() + timeout_s)
        target = cdp.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = cdp.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        cdp.call("Network.enable", session=session)
        cdp.call("Page.enable", session=session)
        cdp.call("Emulation.setDeviceMetricsOverride",
                 {"width": 1200, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=session)  # fmt: skip
        cdp.call("Page.navigate", {"url": url}, session=session)
        cdp.wait_event("Page.loadEventFired")
        got = cdp.call("Runtime.evaluate", {"expression": CHARTS_JS, "returnByValue": True}, session=session)
        facts = got["result"]["value"]
        shot = cdp.call(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=session
        )
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        requests = [
            ev["params"]["request"]["url"]
            for ev in cdp.events
            if ev.get("method") == "Network.requestWillBeSent" and ev["params"]["request"]["url"] != url
        ]
        with contextlib.suppress(Exception):
            cdp.call("Browser.close")
    finally:
        os.close(cmd_w)
        os.close(res_r)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(scratch, ignore_errors=True)
    return facts, requests


def _check(facts: dict, requests: list[str], expect: set[str]) -> None:
    assert requests == [], requests  # nothing left the page
    assert facts["csp"].startswith("default-src 'none'")
    charts = facts["charts"]
    assert expect <= {c["name"] for c in charts}, [c["name"] for c in charts]
    for c in charts:
        assert c["width"] > 200 and c["height"] > 80, c  # laid out
        assert c["paths"] > 3 and c["rows"] > 0, c  # drawn, with its numbers beside it
        assert c["label"] and c["label"] in " ".join(c["texts"]) or c["name"] == "sparsity", c  # its title


@pytest.fixture(scope="module")
def lenet(tmp_path_factory):
    shared = shared_dir()
    if shared is None:
        pytest.skip("../shared (models and data) is absent; set MCONV_SHARED to its path")
    d = tmp_path_factory.mktemp("lenet-browser")
    return shared, d, lenet_onnx(shared, d)


def test_budget_run_report_in_chromium(lenet, tmp_path):
    import mconv.api as api
    from mconv.drivers.budget import BudgetConfig
    from mconv.errors import GateFailed

    shared, d, model = lenet
    _chromium()
    # small and fast: 128 digits, one attempt of one epoch per stage, two settings per layer
    config = BudgetConfig(target_size=120_000, epochs=1, attempts=1, sparsities=(0.0, 0.8), bits=(5,))
    try:
        result = api.optimize(model, recipe="deep-compression", data=digits(shared, 128), budget=config,
                              output=tmp_path / "small.onnx", force=True)  # fmt: skip
    except GateFailed as exc:  # the report of an unmet budget is drawn all the same
        result = exc.result  # type: ignore[attr-defined]
    page = result.write_report(tmp_path / "budget.html")
    doc = result.as_dict()
    assert page.stat().st_size < 1_000_000
    facts, requests = open_page(page, tmp_path / "budget.png")
    assert (tmp_path / "budget.png").stat().st_size > 10_000
    _check(facts, requests, {"account", "totals", "sparsity", "histogram", "frontier", "stages", "ops"})
    frontier = next(c for c in facts["charts"] if c["name"] == "frontier")
    chosen = next(a for a in doc["budget"]["attempts"] if a["chosen"])
    assert f"#{chosen['index']} chosen" in frontier["texts"]
    stages = next(c for c in facts["charts"] if c["name"] == "stages")
    assert any("masked retraining" in t for t in stages["texts"])  # the stages' names on the axis


def test_verify_localize_report_in_chromium(lenet, tmp_path):
    import mconv.api as api

    shared, d, model = lenet
    _chromium()
    small = tmp_path / "small.onnx"
    api.optimize(model, passes="prune(sparsity=0.95),cluster(bits=3)", output=small)
    result = api.verify(model, small, data=digits_npz(shared, tmp_path, 100), localize=True)
    page = result.write_report(tmp_path / "verify.html")
    facts, requests = open_page(page, tmp_path / "verify.png")
    assert (tmp_path / "verify.png").stat().st_size > 10_000
    _check(facts, requests, {"errors", "trace", "top1"})
    loc = result.as_dict()["localized"]
    assert loc["node"] is not None  # 95% pruned and 3 bits: conv1 already drifts
    trace = next(c for c in facts["charts"] if c["name"] == "trace")
    assert f"first drift: {loc['node']}" in trace["texts"]
