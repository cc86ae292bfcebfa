"""Benchmark: the webgpu bundle's page against ONNX Runtime Web (WebGPU EP and WASM) in one browser.

For each model, one ONNX file is written, then run three ways in headless Chromium with the
same flags (:data:`mconv.targets.webgpu.browser.CHROMIUM_FLAGS`: WebGPU on SwiftShader's Vulkan
here), each page on its own fresh browser:

- mconv: ``mconv export MODEL.onnx --target webgpu`` (the CLI, the product path), then the
  bundle's own page (:func:`mconv.targets.webgpu.browser.run_page`);
- ORT-Web WebGPU: ``onnxruntime-web`` (npm, installed by this script into
  ``~/.cache/mconv-bench/ortweb`` with ``npm install``), ``executionProviders: ["webgpu"]``;
- ORT-Web WASM: the same package, ``["wasm"]``, one thread (no cross-origin isolation).

Every page runs one warm-up inference and then ``--runs`` timed ones (inputs in, outputs read
back to the page) and reports their median. Each page's first output is compared with
ONNX Runtime (Python, CPU) on the same ONNX file: cosine and relative L2 error. Everything is
served from 127.0.0.1 only. Writes a markdown table (``--out``) with the ratios.

    python3 bench/webgpu_vs_ortweb.py [--models lenet,mobilenet,resnet50,bert] [--runs 5] [--profile]

``--profile``: the mconv page also runs one inference layer by layer (each layer its own
submit, awaited) and its slowest layers are printed: where the page's time goes.

Models: the LeNet-5 and MobileNet-style test builders, light ResNet-50 (mconv.fixtures.light,
He-normal, seed 0) and the corpus' ``hf-bert-ts`` (a 2-layer BERT, bench/zoo.py, with its real
tokenized sentence).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
ORT_WEB_VERSION = "1.31.1"
CACHE = Path(os.environ.get("MCONV_BENCH_CACHE", Path.home() / ".cache" / "mconv-bench")) / "ortweb"

PAGE = """<!doctype html><meta charset="utf-8"><title>ort-web bench</title><pre id="s">loading</pre>
<script type="module">
const params = new URLSearchParams(location.search);
const ep = params.get("ep"), runs = Number(params.get("runs") || 5);
async function main() {
  const ort = await import(ep === "wasm" ? "./ort/ort.wasm.min.mjs" : "./ort/ort.webgpu.min.mjs");
  ort.env.wasm.wasmPaths = new URL("./ort/", location.href).href;
  ort.env.wasm.numThreads = 1;
  const spec = await (await fetch("./feeds.json")).json();
  const feeds = {};
  for (const [name, f] of Object.entries(spec)) {
    const bytes = Uint8Array.from(atob(f.data), (c) => c.charCodeAt(0));
    const Arr = { float32: Float32Array, int64: BigInt64Array, int32: Int32Array }[f.dtype];
    feeds[name] = new ort.Tensor(f.dtype, new Arr(bytes.buffer), f.shape);
  }
  const t0 = performance.now();
  const session = await ort.InferenceSession.create("./model.onnx", { executionProviders: [ep] });
  const createMs = performance.now() - t0;
  let out = await session.run(feeds);
  const times = [];
  for (let r = 0; r < runs; r++) {
    const t = performance.now();
    out = await session.run(feeds);
    times.push(performance.now() - t);
  }
  times.sort((a, b) => a - b);
  const first = out[session.outputNames[0]];
  return { ep, runs, median_ms: times[Math.floor(times.length / 2)], min_ms: times[0], create_ms: createMs,
           output: Array.from(first.data, Number), shape: first.dims };
}
window.benchDone = main().catch((e) => ({ error: `${e.name}: ${e.message}` }));
</script>
"""


def ensure_ort_web() -> Path:
    """``onnxruntime-web`` from npm into the cache folder (once); its ``dist`` folder."""
    dist = CACHE / "node_modules" / "onnxruntime-web" / "dist"
    if not (dist / "ort.webgpu.min.mjs").is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        if not (CACHE / "package.json").is_file():
            (CACHE / "package.json").write_text('{"private": true}\n')
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", f"onnxruntime-web@{ORT_WEB_VERSION}"],
            cwd=CACHE,
            check=True,
        )
    return dist


def browser_eval(site: Path, url_tail: str, expression: str, timeout_s: float) -> dict:
    """Open ``url_tail`` of ``site`` (served on 127.0.0.1) in a fresh headless Chromium with
    mconv's page flags and return the awaited value of ``expression``."""
    from mconv.targets.webgpu.browser import CHROMIUM_FLAGS, _Pipe, find_chromium, serve

    chromium = find_chromium()
    if chromium is None:
        raise SystemExit("no Chromium (apt-get install chromium)")
    scratch = Path(tempfile.mkdtemp(prefix="bench-ortweb."))
    proc = None
    try:
        with serve(site) as base:
            cmd_r, cmd_w = os.pipe()
            res_r, res_w = os.pipe()

            def fds() -> None:
                os.dup2(cmd_r, 3)
                os.dup2(res_w, 4)

            proc = subprocess.Popen(
                [
                    chromium,
                    *CHROMIUM_FLAGS,
                    f"--user-data-dir={scratch / 'profile'}",
                    "--remote-debugging-pipe",
                ]
                + ["about:blank"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=open(scratch / "chromium.log", "wb"),  # noqa: SIM115 - closed with the process
                close_fds=False,
                preexec_fn=fds,  # noqa: PLW1509 - only dup2, before exec
                env={**os.environ, "XDG_RUNTIME_DIR": str(scratch)},
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
                cdp.call("Page.navigate", {"url": f"{base}/{url_tail}"}, session=session)
                cdp.wait_event("Page.loadEventFired")
                got = cdp.call(
                    "Runtime.evaluate",
                    {"expression": expression, "awaitPromise": True, "returnByValue": True},
                    session=session,
                )
                try:
                    cdp.call("Browser.close")
                except Exception:  # noqa: BLE001 - the browser may already be gone
                    pass
            finally:
                os.close(cmd_w)
                os.close(res_r)
        if "exceptionDetails" in got:
            return {"error": str(got["exceptionDetails"].get("text"))}
        return got["result"]["value"]
    except TimeoutError as exc:
        return {"error": str(exc)}
    finally:
        if proc is not None:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(scratch, ignore_errors=True)


def ort_web_page(
    dist: Path, onnx_path: Path, feeds: dict[str, np.ndarray], ep: str, runs: int, timeout_s: float
) -> dict:
    site = Path(tempfile.mkdtemp(prefix="bench-ortweb-site."))
    try:
        (site / "index.html").write_text(PAGE)
        (site / "ort").symlink_to(dist, target_is_directory=True)
        (site / "model.onnx").symlink_to(onnx_path.resolve())
        spec = {
            k: {
                "dtype": str(v.dtype),
                "shape": list(v.shape),
                "data": base64.b64encode(np.ascontiguousarray(v).tobytes()).decode(),
            }
            for k, v in feeds.items()
        }
        (site / "feeds.json").write_text(json.dumps(spec))
        return browser_eval(site, f"index.html?ep={ep}&runs={runs}", "window.benchDone", timeout_s)
    finally:
        shutil.rmtree(site, ignore_errors=True)


def model_onnx(name: str, work: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """The ONNX file and the feeds of one bench model."""
    if name == "bert":
        import zoo

        meta = zoo.prepare("hf-bert-ts")
        feeds = dict(np.load(zoo.prep_dir("hf-bert-ts") / "inputs.npz"))
        return Path(meta["files"][0]), feeds
    import onnx_ir as ir
    from webgpu import build, feeds_for

    model = build(name)
    path = work / f"{name}.onnx"
    model.ir_version = min(model.ir_version, 10)  # ORT-Web 1.31 reads IR versions up to 13
    ir.save(model, str(path))
    return path, feeds_for(model)


def agreement(ref: np.ndarray, got: np.ndarray) -> tuple[float, float]:
    """(cosine, relative L2 error) of ``got`` against ``ref`` (float64)."""
    a, b = np.asarray(ref, np.float64).ravel(), np.asarray(got, np.float64).ravel()
    cos = float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-300))
    return cos, float(np.linalg.norm(a - b) / max(np.linalg.norm(a), 1e-300))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="lenet,mobilenet,resnet50,bert")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per page")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="also time the mconv page layer by layer (one extra inference, each layer its own "
        "submit) and print its slowest layers on stderr",
    )
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "webgpu_vs_ortweb.md"))
    args = ap.parse_args()
    import onnxruntime as ort
    from mconv.targets.webgpu.browser import run_page

    dist = ensure_ort_web()
    work = Path(tempfile.mkdtemp(prefix="bench-ortweb-work."))
    rows, adapter = [], ""
    try:
        for name in args.models.split(","):
            onnx_path, feeds = model_onnx(name, work)
            sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
            ref = sess.run(None, feeds)[0]
            bundle = work / f"{name}.webgpu"
            cmd = [
                sys.executable,
                "-m",
                "mconv",
                "export",
                str(onnx_path),
                "--target",
                "webgpu",
                "-o",
                str(bundle),
                "-q",
            ]
            subprocess.run([*cmd, "--precision", args.precision], check=True)
            cells: dict[str, tuple[float | None, str]] = {}
            r = run_page(bundle, feeds, runs=args.runs, timeout_s=args.timeout, profile=args.profile)
            if args.profile and "layer_ms" in r:
                kernels = [
                    layer["kernel"]
                    for layer in json.loads((bundle / "webgpu_plan.json").read_text())["layers"]
                ]
                slow = sorted(zip(r["layer_ms"], kernels, strict=True), reverse=True)[:10]
                print(f"{name}: layers {sum(r['layer_ms']):,.0f} ms; slowest:", file=sys.stderr)
                for t, k in slow:
                    print(f"  {k:24s} {t:10.1f} ms", file=sys.stderr)
            if "error" in r:
                cells["mconv"] = (None, r["error"][:80])
            else:
                first = next(iter(r["outputs"].values()))
                cos, rel = agreement(ref, first)
                cells["mconv"] = (r["median_ms"], f"cos {cos:.7f}, rel {rel:.1e} ({r['storage']})")
                adapter = json.dumps(r.get("adapter", {}))
            for ep in ("webgpu", "wasm"):
                r = ort_web_page(dist, onnx_path, feeds, ep, args.runs, args.timeout)
                if "error" in r:
                    cells[ep] = (None, r["error"][-160:])
                else:
                    cos, rel = agreement(ref, np.asarray(r["output"]))
                    cells[ep] = (r["median_ms"], f"cos {cos:.7f}, rel {rel:.1e}")
            rows.append((name, cells))
            print(name, json.dumps({k: v for k, v in cells.items()}), file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def ms(v: float | None) -> str:
        return "-" if v is None else (f"{v:,.0f} ms" if v >= 100 else f"{v:.2f} ms")

    def ratio(a: float | None, b: float | None) -> str:
        return "-" if a is None or b is None else f"{b / a:.2f}x"

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    lines = [
        "# webgpu bundle page vs ONNX Runtime Web",
        "",
        f"`python3 bench/webgpu_vs_ortweb.py --models {args.models} --runs {args.runs} --precision {args.precision}`"
        f" at {commit} (uncommitted edits possible), {time.strftime('%Y-%m-%d')}, {platform.node()} "
        f"({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the end); headless Chromium "
        f"({_chromium_version()}), WebGPU on SwiftShader's Vulkan; onnxruntime-web {ORT_WEB_VERSION}; "
        f"median of {args.runs} warm runs after one warm-up, each page in a fresh browser. "
        f"mconv adapter: {adapter}. Agreement: the page's first output against ONNX Runtime (Python, CPU).",
        "",
        "| model | mconv page | ORT-Web WebGPU | ORT-Web WASM (1 thread) | ORT-Web WebGPU / mconv | ORT-Web WASM / mconv | agreement mconv / WebGPU EP / WASM |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, c in rows:
        m, g, w = c["mconv"][0], c["webgpu"][0], c["wasm"][0]
        lines.append(
            f"| {name} | {ms(m)} | {ms(g)} | {ms(w)} | {ratio(m, g)} | {ratio(m, w)} | "
            f"{c['mconv'][1]} / {c['webgpu'][1]} / {c['wasm'][1]} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)


def _chromium_version() -> str:
    from mconv.targets.webgpu.browser import find_chromium

    exe = find_chromium()
    if exe is None:
        return "none"
    out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip()
    return out or exe


if __name__ == "__main__":
    main()
