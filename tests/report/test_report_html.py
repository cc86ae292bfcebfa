"""The HTML report (mconv.report) from hand-made result dicts: each section with its numbers,
a hostile name escaped, the page self-contained, matplotlib loaded only when a report is asked."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from mconv.errors import InputError
from mconv.report import page, write_report

HOSTILE = '<script>alert("x")</script>$\\frac{1}{2}$'

VERIFY = {
    "passed": False,
    "outputs": {HOSTILE: {"cosine": 0.9321, "rel_l2": 0.3879, "max_abs": 0.7908, "top1_agreement": 0.915}},
    "failures": {HOSTILE: ["cosine 0.9321 < 0.99"]},
    "samples": 200,
    "gates": {"min_cosine": 0.99},
    "gates_source": "default",
    "error_distribution": {
        HOSTILE: {
            "values": 2000, "zeros": 7, "nonfinite": 0,
            "quantiles": {"p50": 0.01534, "p90": 0.1292, "p99": 0.5778, "max": 0.7908},
            "log10_edges": [-3.0, -2.0, -1.0, 0.0], "counts": [13, 1500, 480],
        }
    },
    "localized": {
        "node": HOSTILE, "op_type": "Conv", "value": "conv1", "failures": ["max_abs 2.73"],
        "first_drift": 1,
        "trace": [
            {"node": "input_norm", "op_type": "Mul", "drift": False, "cosine": 1.0, "rel_l2": 1e-7, "max_abs": 1e-6},
            {"node": HOSTILE, "op_type": "Conv", "drift": True, "cosine": 0.6609, "rel_l2": 0.6973, "max_abs": 2.73},
            {"node": "relu1", "op_type": "Relu", "drift": True, "cosine": 0.7656, "rel_l2": 0.7763, "max_abs": 9.405},
        ],
    },
}  # fmt: skip

BUDGET = {
    "metric": "accuracy", "met": True, "baseline": 0.99, "final": 0.985, "held_out_drop": 0.005,
    "max_drop": 0.01, "target_size": 60000, "size": {"weights_file": 57196, "bundle": 63820},
    "split": {"held_out": 75}, "seconds": 12.5,
    "estimator": {"frontier_points": [{"predicted_bytes": 40841, "estimated_cost": 0.0123},
                                      {"predicted_bytes": 52984, "estimated_cost": 0.00277}]},
    "attempts": [
        {"index": 0, "predicted_bytes": 52984, "weights_file": 57318, "estimated_cost": 0.00277,
         "held_out_drop": 0.0933, "passed": False, "chosen": False},
        {"index": 1, "predicted_bytes": 48123, "weights_file": 51234, "estimated_cost": 0.00456,
         "held_out_drop": 0.004, "passed": True, "chosen": True},
    ],
    "stages": [
        {"stage": "prune step 1/4", "metric_before": 0.99, "metric_after": 0.9867, "rolled_back": False, "seconds": 1.2},
        {"stage": "masked retraining 1", "metric_before": 0.9867, "metric_after": 0.9601, "rolled_back": True, "seconds": 13.5},
    ],
    "layers": [{"name": "ip1", "tensor": "ip1.weight", "sparsity": 0.9, "bits": 6}],
    "recipe": [{"name": "prune", "config": {"sparsity": 0.9}}],
}  # fmt: skip

OPTIMIZE = {
    "source": None, "file_bytes_after": 1731087, "passes": [], "warnings": [],
    "account": {
        "layers": [{"name": "ip1.weight", "codec": "sparse+palette+rans", "kept": 0.1, "elements": 400000,
                    "weight_bits": 6, "index_bits": 7, "bytes": 48440, "original_bytes": 1600000}],
        "total": {"bytes": 48440, "original_bytes": 1600000, "compression": 33.03},
        "predicted": True,
    },
    "budget": BUDGET,
}  # fmt: skip


def _text(html: str) -> str:
    """The page without its inline SVG (the numbers tables and prose)."""
    return re.sub(r"<svg.*?</svg>", "", html, flags=re.S)


def test_verify_report_sections_numbers_and_escaping(tmp_path):
    out = write_report(tmp_path / "v.html", "verify", VERIFY)
    html = out.read_text()
    for sid in ("verify", "localize", "json"):
        assert f'<section id="{sid}">' in html
    for chart in ("top1", "errors", "trace"):
        assert f'data-chart="{chart}"' in html
    text = _text(html)
    for number in ("0.9321", "0.3879", "0.915", "1,500", "0.5778", "2.73", "0.6973"):
        assert number in text, number
    # the hostile name: never markup, not in the tables and not in the charts' SVG text
    assert "<script" not in html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html
    svg_texts = re.findall(r"<text[^>]*>(.*?)</text>", html, flags=re.S)
    assert any("first drift: &lt;script&gt;" in t for t in svg_texts)
    assert "$\\frac{1}{2}$" in html  # a dollar sign is text, not mathtext


def test_the_page_asks_for_nothing_outside_itself(tmp_path):
    html = write_report(tmp_path / "v.html", "verify", VERIFY).read_text()
    assert f'<meta http-equiv="Content-Security-Policy" content="{page.CSP}">' in html
    assert "default-src 'none'" in page.CSP
    # no attribute that would load anything: only the SVG namespaces name http URLs
    assert not re.search(r"""(src|href|action|srcset|poster)\s*=\s*["']?(https?:|//)""", html, flags=re.I)
    assert "@import" not in html and "url(http" not in html


def test_optimize_report_budget_frontier_stages_and_account(tmp_path):
    html = write_report(tmp_path / "o.html", "optimize", OPTIMIZE).read_text()
    for chart in ("account", "totals", "sparsity", "frontier", "stages"):
        assert f'data-chart="{chart}"' in html, chart
    text = _text(html)
    for number in ("57,318", "51,234", "0.00456", "0.9601", "1,600,000", "48,440", "33.03", "60,000"):
        assert number in text, number
    assert "BUDGET MET" in text and "rolled back" in html
    svg_texts = " ".join(re.findall(r"<text[^>]*>(.*?)</text>", html, flags=re.S))
    assert "#1 chosen" in svg_texts and "rolled back" in svg_texts


def test_analyze_report_curves(tmp_path):
    doc = {
        "baseline": 0.99, "metric": "accuracy", "samples": 300,
        "layers": [{"name": "conv1", "op_type": "Conv", "tensor": "w", "params": 500, "sweep": [
            {"sparsity": 0.5, "bits": None, "metric": 0.9833, "drop": 0.0067},
            {"sparsity": 0.9, "bits": None, "metric": 0.7417, "drop": 0.2483},
            {"sparsity": 0.9, "bits": 4, "metric": 0.7011, "drop": 0.2889}]}],
    }  # fmt: skip
    html = write_report(tmp_path / "a.html", "analyze", doc).read_text()
    assert 'data-chart="sensitivity"' in html
    assert all(n in _text(html) for n in ("0.7417", "0.2483", "0.7011"))
    assert "conv1 (4 bits)" in html  # the bits curve is its own line


def test_components_split_a_record_by_stream():
    # a palette: codebook + indices, the rest of the blob is its header
    assert page.components(
        {"codec": "palette", "bytes": 140, "streams": {"codebook": 32, "indices": 100}}
    ) == {"raw": 0, "palette": 132, "sparse index": 0, "entropy-coded": 0, "header": 8}
    # sparse with rANS-coded gaps and palette values
    got = page.components(
        {
            "codec": "sparse+palette+rans",
            "bytes": 1000,
            "streams": {"gaps": 600, "codebook": 64, "indices": 300},
        }
    )
    assert got == {"raw": 0, "palette": 64, "sparse index": 0, "entropy-coded": 900, "header": 36}
    # dense fp16; a predicted row (no streams) goes to its chain's leading component
    assert page.components({"codec": "fp16", "bytes": 40, "streams": {"data": 40}})["raw"] == 40
    assert page.components({"codec": "sparse+fp16", "bytes": 141})["sparse index"] == 141


def test_without_matplotlib_report_is_one_line_exit_2(tmp_path, monkeypatch):
    import importlib.util

    from mconv import report

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "matplotlib" else real(n, *a))
    with pytest.raises(InputError) as info:
        report.write_report(tmp_path / "r.html", "verify", VERIFY)
    assert "pip install" in info.value.line() and not (tmp_path / "r.html").exists()
    model = Path(__file__).resolve().parents[2] / "fixtures" / "digits_mlp.onnx"
    code = (
        "import sys\n"
        "sys.modules['matplotlib'] = None  # as if not installed: import and find_spec fail\n"
        "from mconv.cli.app import main\n"
        f"sys.argv = ['mconv', 'inspect', {str(model)!r}, '--report', {str(tmp_path / 'r.html')!r}]\n"
        "main()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "matplotlib" in lines[0] and "pip install" in lines[0], out.stderr


def test_commands_do_not_import_matplotlib():
    code = "import sys, mconv.api, mconv.cli.app, mconv.report; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


def test_a_large_model_draws_its_largest_layers_only(tmp_path):
    """30 weight layers, histograms of the 3 largest: the page stays bounded and says so."""
    import mconv.api as api
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(30):
        w = rng.standard_normal((16, 16)).astype(np.float32) * (1 + i)
        w[0, : i % 16] = 0  # sizes equal: the order is by name after size
        inits.append(onnx.numpy_helper.from_array(w, f"w{i:02d}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i:02d}"], [f"h{i}"], name=f"mm{i}"))
        prev = f"h{i}"
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["N", 16])], inits,
    )  # fmt: skip
    path = tmp_path / "deep.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    html = api.inspect(path).write_report(tmp_path / "deep.html", layers=3).read_text()
    assert re.findall(r"<h3>(w\d\d)</h3>", html) == ["w00", "w01", "w02"]
    assert "27 smaller weight tensors not drawn" in html
    assert 'data-chart="ops"' in html and "<td>MatMul</td><td>30</td>" in html
