"""--report on the CLI and mconv report, on the Caffe LeNet-5 with real MNIST digits: the page
holds the numbers of the command's own --json, and the report path is guarded as -o is."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lenet import digits_npz, lenet_onnx, shared_dir  # noqa: E402


def mconv(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mconv", *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    shared = shared_dir()
    if shared is None:
        pytest.skip("../shared (models and data) is absent; set MCONV_SHARED to its path")
    d = tmp_path_factory.mktemp("lenet")
    model = lenet_onnx(shared, d)
    data = digits_npz(shared, d, 200)
    small = d / "small.onnx"
    out = mconv("optimize", str(model), "--passes", "prune(sparsity=0.9),cluster(bits=4)", "-o", str(small),
                "--report", str(d / "optimize.html"), "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return {"dir": d, "model": model, "data": data, "small": small, "optimize": json.loads(out.stdout)}


def _text(html: str) -> str:
    return re.sub(r"<svg.*?</svg>", "", html, flags=re.S)


def test_optimize_report_holds_the_json_numbers(work):
    page = (work["dir"] / "optimize.html").read_text()
    doc = work["optimize"]
    assert len(page.encode()) < 1_000_000  # small for LeNet-5
    for chart in ("account", "totals", "sparsity", "histogram", "ops"):
        assert f'data-chart="{chart}"' in page, chart
    text = _text(page)
    ip1 = next(r for r in doc["account"]["layers"] if r["name"] == "ip1.weight")
    assert f"{ip1['bytes']:,}" in text and f"{ip1['original_bytes']:,}" in text
    assert f"{doc['account']['total']['bytes']:,}" in text
    assert "<h3>ip1.weight</h3>" in page and "pruning threshold" in page
    assert doc["source"] == str(work["model"])
    passes = re.search(r'<section id="passes">(.*?)</section>', page, flags=re.S).group(1)  # type: ignore[union-attr]
    assert (
        [p["name"] for p in doc["passes"]]
        == re.findall(r"<tr><td>([a-z-]+)</td>", passes)
        == ["prune", "cluster"]
    )


def test_verify_localize_report(work):
    page_path = work["dir"] / "verify.html"
    out = mconv("verify", str(work["model"]), str(work["small"]), "--data", str(work["data"]), "--localize",
                "--report", str(page_path), "--json")  # fmt: skip
    assert out.returncode in (0, 1), out.stderr[-2000:]
    doc = json.loads(out.stdout)
    page = page_path.read_text()
    for chart in ("top1", "errors", "trace"):
        assert f'data-chart="{chart}"' in page, chart
    loc = doc["localized"]
    assert [t["node"] for t in loc["trace"]][:2] == ["conv1", "pool1"]  # topological order
    if loc["node"] is not None:
        assert f"first drifting node: {loc['node']}" in page
        assert loc["trace"][loc["first_drift"]]["node"] == loc["node"]
    top1 = doc["outputs"]["prob"]["top1_agreement"]
    assert f"{top1:.4g}" in _text(page)
    dist = doc["error_distribution"]["prob"]
    assert sum(dist["counts"]) + dist["zeros"] + dist["nonfinite"] == dist["values"] == 200 * 10


def test_report_of_a_bundle_splits_the_bytes_by_stream(work):
    bundle = work["dir"] / "bundle"
    assert mconv("export", str(work["small"]), "--target", "cpu", "-o", str(bundle), "-q").returncode == 0
    page_path = work["dir"] / "bundle.html"
    out = mconv("report", str(bundle), "-o", str(page_path))
    assert out.returncode == 0, out.stderr[-2000:]
    page = page_path.read_text()
    inspect = json.loads(mconv("inspect", str(bundle), "--json").stdout)
    ip1 = next(r for r in inspect["account"]["layers"] if r["name"] == "ip1.weight")
    assert sum(ip1["streams"].values()) <= ip1["bytes"] and ip1["streams"]
    row = re.search(r"<tr><td>ip1\.weight</td>(.*?)</tr>", _text(page)).group(1)  # type: ignore[union-attr]
    assert f"<td>{ip1['bytes']:,}</td>" in row
    assert "&quot;cpu&quot;" in page or ">cpu<" in page  # the target


def test_report_path_is_guarded(work):
    # the report over the input: refused, input untouched
    before = work["model"].read_bytes()
    out = mconv("inspect", str(work["model"]), "--report", str(work["model"]))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert work["model"].read_bytes() == before
    out = mconv("optimize", str(work["model"]), "--passes", "fold", "-o", str(work["dir"] / "x.onnx"),
                "--report", str(work["dir"] / "x.onnx"))  # fmt: skip
    assert out.returncode == 2 and "--report" in out.stderr
    out = mconv("report", str(work["model"]), "-o", str(work["dir"]))  # a folder
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
