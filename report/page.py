"""The report's page: sections built from a command's result dict, each chart with its table."""

from __future__ import annotations

import html
import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
ROWS = 40  # rows a table shows before it says how many it left out
JSON_LIMIT = 400_000  # characters of the JSON appendix; a larger document is left out

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1180px;
padding:0 16px 40px;color:#222}
h1{font-size:22px;margin:18px 0 4px}h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:3px;
margin-top:28px}h3{font-size:15px;margin:14px 0 4px}
.chart{display:flex;flex-wrap:wrap;gap:14px;align-items:flex-start;margin:10px 0 18px}
.chart svg{flex:1 1 560px;max-width:760px;height:auto}
.numbers{flex:1 1 300px;overflow:auto;max-height:460px}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ddd;padding:2px 6px;text-align:right}
td:first-child,th:first-child{text-align:left}th{background:#f4f4f4}
.bad{color:#b00020;font-weight:600}.ok{color:#1b7a1b;font-weight:600}.note{color:#555;font-size:12px}
pre{background:#f7f7f7;padding:8px;overflow:auto;max-height:400px;font-size:11px}
"""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return str(value)
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:,.0f}"
    return str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], limit: int = ROWS) -> str:
    rows = list(rows)
    out = ["<table><thead><tr>", *(f"<th>{esc(h)}</th>" for h in headers), "</tr></thead><tbody>"]
    for row in rows[:limit]:
        out.append("<tr>" + "".join(f"<td>{esc(fmt(c))}</td>" for c in row) + "</tr>")
    out.append("</tbody></table>")
    if len(rows) > limit:
        out.append(f'<p class="note">{len(rows) - limit:,} more rows left out (the JSON has them all)</p>')
    return "".join(out)


def chart(name: str, svg: str, numbers: str) -> str:
    """One chart and its numbers side by side (``data-chart`` names it for tests and readers)."""
    return (
        f'<figure class="chart" data-chart="{esc(name)}">{svg}<div class="numbers">{numbers}</div></figure>'
    )


def section(sid: str, title: str, body: str) -> str:
    return f'<section id="{esc(sid)}"><h2>{esc(title)}</h2>{body}</section>'


# --------------------------------------------------------------------------- the model


def model_section(summary: dict[str, Any], title: str = "Model") -> str:
    from mconv.report import charts

    facts = [
        ("file", summary.get("path")),
        ("kind", summary.get("kind")),
        ("nodes", summary.get("nodes")),
        ("parameters", summary.get("params")),
        ("weight bytes", summary.get("bytes")),
    ]
    body = table(["fact", "value"], facts)

    def io_rows(specs):
        return [(s.get("name"), s.get("dtype"), "x".join(str(d) for d in s.get("shape") or []) or "scalar")
                for s in specs or []]  # fmt: skip

    body += "<h3>Inputs</h3>" + table(["name", "dtype", "shape"], io_rows(summary.get("inputs")))
    body += "<h3>Outputs</h3>" + table(["name", "dtype", "shape"], io_rows(summary.get("outputs")))
    ops = sorted((summary.get("ops") or {}).items(), key=lambda kv: (-kv[1], kv[0]))
    if ops:
        shown = ops[:25]
        svg = charts.counts([k for k, _ in shown], [v for _, v in shown], "nodes", "op counts")
        body += chart("ops", svg, table(["op", "nodes"], ops))
    manifest = summary.get("manifest") or {}
    target = {
        k: manifest.get(k) for k in ("target", "options", "format_version", "provenance") if k in manifest
    }
    meta = {
        k: v
        for k, v in (summary.get("metadata") or {}).items()
        if k.startswith("mconv.") and len(str(v)) < 2000
    }
    if target or meta:
        rows = [(k, json.dumps(v, sort_keys=True)[:600]) for k, v in {**target, **meta}.items()]
        body += "<h3>Target, options and provenance</h3>" + table(["key", "value"], rows)
    return section("model", title, body)


# --------------------------------------------------------------------------- the byte account


def components(row: dict[str, Any]) -> dict[str, int]:
    """A tensor's stored bytes by component: palette (codebook and indices), sparse index (the
    gaps), entropy-coded (a Huffman or rANS coded stream), raw (dense or fp16 values), header
    (the blob's own bytes beyond its streams). Without per-stream counts (a predicted account)
    the whole tensor goes to its codec chain's leading component."""
    label = str(row.get("codec", "raw"))
    parts = label.split("+")
    coded = "huffman" in parts or "rans" in parts
    total = int(row.get("bytes") or 0)
    streams = row.get("streams") or {}
    out = {"raw": 0, "palette": 0, "sparse index": 0, "entropy-coded": 0, "header": 0}
    if not streams:
        kind = "entropy-coded" if coded else "sparse index" if parts[0] == "sparse" else (
            "palette" if parts[0] == "palette" else "raw")  # fmt: skip
        out[kind] = total
        return out
    palette_values = "palette" in parts
    for name, n in streams.items():
        if name in ("indices", "gaps") and coded:
            kind = "entropy-coded"
        elif name in ("codebook", "indices"):
            kind = "palette"
        elif name == "gaps":
            kind = "sparse index"
        elif name == "symbols":
            kind = "entropy-coded"
        elif name == "values" and palette_values:
            kind = "palette"
        else:
            kind = "raw"
        out[kind] += int(n)
    out["header"] = max(total - sum(int(n) for n in streams.values()), 0)
    return out


def account_section(account: dict[str, Any], title: str, source_bytes: dict[str, int], layers: int) -> str:
    from mconv.report import charts

    rows = sorted(account.get("layers") or [], key=lambda r: -int(r.get("original_bytes") or 0))
    if not rows:
        return ""
    shown = rows[: max(layers * 2, 12)]
    split = [components(r) for r in shown]
    parts = {k: [s[k] for s in split] for k in ("raw", "palette", "sparse index", "entropy-coded", "header")}
    predicted = bool(account.get("predicted"))
    svg = charts.stacked_bytes(
        [r["name"] for r in shown], [int(r.get("original_bytes") or 0) for r in shown], parts,
        "bytes per tensor, before and after" + (" (predicted)" if predicted else ""),
    )  # fmt: skip
    numbers = table(
        ["tensor", "codec", "kept", "bits", "index bits", "before B", "after B", *parts],
        [(r["name"], r.get("codec"), r.get("kept"), r.get("weight_bits"), r.get("index_bits"),
          r.get("original_bytes"), r.get("bytes"), *components(r).values()) for r in rows],
    )  # fmt: skip
    body = chart("account", svg, numbers)
    if predicted:
        body += ('<p class="note">Predicted before encoding: each tensor is drawn in its codec chain\'s '
                 "leading component; a bundle's report (mconv report BUNDLE) splits it by stream.</p>")  # fmt: skip
    total = account.get("total") or {}
    bars = [("dense weights (before)", int(total.get("original_bytes") or 0))]
    bars += [(k, v) for k, v in source_bytes.items() if v]
    bars.append(("weights stored (after)", int(total.get("bytes") or 0)))
    svg = charts.totals([b[0] for b in bars], [b[1] for b in bars], "total bytes against the source")
    ratio = total.get("compression")
    body += chart("totals", svg, table(["what", "bytes"], bars) + f"<p>compression {esc(fmt(ratio))}x</p>")
    return section("account", title, body)


def sparsity_section(rows: list[tuple[str, float, float]], title: str) -> str:
    from mconv.report import charts

    if not rows:
        return ""
    shown = rows[:30]
    svg = charts.sparsity_bits([r[0] for r in shown], [r[1] for r in shown], [r[2] for r in shown], title)
    return section("layers", title, chart("sparsity", svg, table(["layer", "sparsity", "bits"], rows)))


# --------------------------------------------------------------------------- weight histograms


def _tensors(model: Any) -> dict[str, Any]:
    """The model's float weight tensors of rank 2 or more, not read yet (name -> IR tensor)."""
    out: dict[str, Any] = {}
    if model is None:
        return out
    for name, value in model.graph.initializers.items():
        t = value.const_value
        if t is not None and len(t.shape) >= 2 and t.dtype.is_floating_point():
            out[name] = t
    return out


def _read(tensor: Any) -> np.ndarray | None:
    if tensor is None:
        return None
    try:
        return np.asarray(tensor.numpy())
    except Exception:  # noqa: BLE001 - a tensor that cannot be read is not drawn
        return None


def _sample(a: np.ndarray, n: int = 200_000) -> np.ndarray:
    """At most ``n`` values (an even stride: the histogram's shape, bounded work)."""
    flat = a.ravel().astype(np.float64)
    return flat if flat.size <= n else flat[:: flat.size // n + 1]


def histogram_section(before: Any, after: Any, layers: int) -> str:
    from mconv.report import charts

    ta, tb = _tensors(after), _tensors(before)
    pool = ta or tb
    if not pool:
        return ""
    # only the largest are read (a large model's other weights stay on disk)
    names = sorted(pool, key=lambda k: (-int(np.prod(pool[k].shape.numpy())), k))[:layers]
    body = ""
    for name in names:
        a0, a1 = _read(tb.get(name)), _read(ta.get(name))
        if a1 is not None and a0 is not None and a0.shape != a1.shape:
            a0 = None
        nz = a1[a1 != 0] if a1 is not None else None
        centroids = np.unique(nz) if nz is not None and nz.size else np.zeros(0)
        centroids = centroids if 0 < centroids.size <= 256 else np.zeros(0)
        threshold = None
        sparsity = float(np.mean(a1 == 0)) if a1 is not None else None
        if a1 is not None and sparsity and (a0 is None or sparsity > float(np.mean(a0 == 0)) + 1e-6):
            if a0 is not None:
                pruned = np.abs(a0[(a1 == 0) & (a0 != 0)])
                threshold = float(pruned.max()) if pruned.size else None
            elif nz is not None and nz.size:
                threshold = float(np.abs(nz).min())
        title = f"{name}: weight values"
        svg = charts.histogram(
            name,
            _sample(a0) if a0 is not None else None,
            _sample(nz) if nz is not None else None,
            [float(c) for c in centroids],
            threshold,
            title,
        )
        facts = [
            ("elements", int((a1 if a1 is not None else a0).size)),  # type: ignore[union-attr]
            ("sparsity after", sparsity),
            ("distinct nonzero values", int(np.unique(nz).size) if nz is not None else None),
            ("pruning threshold", threshold),
            ("std before", float(a0.std()) if a0 is not None else None),
            ("std after", float(a1.std()) if a1 is not None else None),
        ]
        numbers = table(["fact", "value"], facts)
        if centroids.size:
            numbers += table(["centroid"], [(float(c),) for c in centroids], limit=16)
        body += f"<h3>{esc(name)}</h3>" + chart("histogram", svg, numbers)
    more = len(pool) - len(names)
    if more > 0:
        body += f'<p class="note">{more} smaller weight tensors not drawn.</p>'
    return section("histograms", "Weight histograms (largest layers)", body)


# --------------------------------------------------------------------------- the budget search


def budget_sections(b: dict[str, Any]) -> str:
    from mconv.report import charts

    out = ""
    verdict = (
        '<span class="ok">BUDGET MET</span>' if b.get("met") else '<span class="bad">BUDGET NOT MET</span>'
    )
    facts = [
        ("metric", b.get("metric")), ("baseline (held out)", b.get("baseline")), ("final (held out)", b.get("final")),
        ("drop", b.get("held_out_drop")), ("max drop", b.get("max_drop")), ("target size", b.get("target_size")),
        ("weights.mcw", (b.get("size") or {}).get("weights_file")), ("cpu bundle", (b.get("size") or {}).get("bundle")),
        ("held-out samples", (b.get("split") or {}).get("held_out")), ("seconds", b.get("seconds")),
    ]  # fmt: skip
    body = f"<p>{verdict}</p>" + table(["fact", "value"], facts)
    est = b.get("estimator") or {}
    front = [
        (int(p["predicted_bytes"]), float(p["estimated_cost"])) for p in est.get("frontier_points") or []
    ]
    attempts = b.get("attempts") or []
    svg = charts.frontier(front, attempts, b.get("target_size"), "budget search: frontier and attempts")
    numbers = table(
        ["attempt", "predicted B", "weights.mcw B", "estimated cost", "drop", "passed", "chosen"],
        [(a.get("index"), a.get("predicted_bytes"), a.get("weights_file"), a.get("estimated_cost"),
          a.get("held_out_drop"), a.get("passed"), a.get("chosen")) for a in attempts],
    ) + table(["frontier B", "estimated cost"], front, limit=12)  # fmt: skip
    body += chart("frontier", svg, numbers)
    st = [s for s in b.get("stages") or [] if s.get("metric_after") is not None]
    if st:
        base, drop = b.get("baseline"), b.get("max_drop")
        svg = charts.stages(
            [s["stage"] for s in st], [s["metric_before"] for s in st], [s["metric_after"] for s in st],
            [bool(s.get("rolled_back")) for s in st], base,
            base - drop if base is not None and drop is not None else None, b.get("metric", "metric"),
            "held-out metric after every stage (chosen attempt)",
        )  # fmt: skip
        numbers = table(
            ["stage", "before", "after", "rolled back", "seconds"],
            [(s["stage"], s["metric_before"], s["metric_after"], s.get("rolled_back"), s.get("seconds")) for s in st],
        )  # fmt: skip
        body += chart("stages", svg, numbers)
    out += section("budget", "Budget search", body)
    return out


# --------------------------------------------------------------------------- analyze


def analyze_sections(doc: dict[str, Any]) -> str:
    from mconv.report import charts

    layers = doc.get("layers") or []
    if not layers:
        return ""
    body = ""
    series: dict[str, tuple[list[float], list[float]]] = {}
    rows = []
    for layer in layers:
        groups: dict[Any, list[dict]] = {}
        for p in layer.get("sweep") or []:
            groups.setdefault(p.get("bits"), []).append(p)
            rows.append((layer["name"], p.get("sparsity"), p.get("bits"), p.get("metric"), p.get("drop")))
        for bits, pts in groups.items():
            pts = sorted(pts, key=lambda p: p["sparsity"])
            label = layer["name"] + ("" if bits is None else f" ({bits} bits)")
            series[label] = ([p["sparsity"] for p in pts], [p["metric"] for p in pts])
    shown = dict(list(series.items())[:16])
    metric = doc.get("metric", "metric")
    svg = charts.curves(shown, doc.get("baseline"), "sparsity", metric, f"sensitivity: {metric} per layer")
    body += chart("sensitivity", svg, table(["layer", "sparsity", "bits", metric, "drop"], rows, limit=80))
    if len(series) > len(shown):
        body += f'<p class="note">{len(series) - len(shown)} more curves in the table only.</p>'
    chosen = [(ly["name"], (ly.get("choice") or {}).get("sparsity"), (ly.get("choice") or {}).get("bits"))
              for ly in layers if ly.get("choice")]  # fmt: skip
    if chosen:
        body += "<h3>Choice within the max drop</h3>" + table(["layer", "sparsity", "bits"], chosen)
    return section("sensitivity", "Sensitivity (analyze)", body)


# --------------------------------------------------------------------------- verify


def verify_sections(doc: dict[str, Any]) -> str:
    from mconv.report import charts

    outs = doc.get("outputs") or {}
    verdict = '<span class="ok">PASSED</span>' if doc.get("passed") else '<span class="bad">FAILED</span>'
    keys = ("cosine", "rel_l2", "max_abs", "mean_abs", "snr_db", "top1_agreement")
    body = f"<p>{verdict} on {esc(fmt(doc.get('samples')))} samples; gates ({esc(doc.get('gates_source'))}): " \
        f"{esc(json.dumps(doc.get('gates') or {}, sort_keys=True))}</p>"  # fmt: skip
    body += table(["output", *keys, "failures"],
                  [(n, *(m.get(k) for k in keys), "; ".join((doc.get("failures") or {}).get(n, [])))
                   for n, m in outs.items()])  # fmt: skip
    top1 = [(n, m["top1_agreement"]) for n, m in outs.items() if m.get("top1_agreement") is not None]
    if top1:
        svg = charts.counts(
            [t[0] for t in top1], [t[1] for t in top1], "top-1 agreement", "top-1 agreement per output"
        )
        body += chart("top1", svg, table(["output", "top-1 agreement"], top1))
    for name, dist in list((doc.get("error_distribution") or {}).items())[:12]:
        if not dist.get("counts"):
            body += f"<p>{esc(name)}: {esc(fmt(dist.get('zeros')))} values, all equal.</p>"
            continue
        svg = charts.error_histogram(
            dist["log10_edges"], dist["counts"], dist.get("zeros", 0), f"{name}: error distribution"
        )
        q = dist.get("quantiles") or {}
        numbers = table(["fact", "value"], [("values", dist.get("values")), ("exactly equal", dist.get("zeros")),
                        ("non-finite", dist.get("nonfinite")), *((f"|error| {k}", v) for k, v in q.items())])  # fmt: skip
        numbers += table(
            ["log10 bin from", "values"],
            list(zip(dist["log10_edges"], dist["counts"], strict=False)),
            limit=30,
        )
        body += f"<h3>{esc(name)}</h3>" + chart("errors", svg, numbers)
    out = section("verify", "Verify", body)
    loc = doc.get("localized")
    if loc:
        out += localize_section(loc)
    return out


def localize_section(loc: dict[str, Any]) -> str:
    from mconv.report import charts

    trace = loc.get("trace") or []
    first = loc.get("first_drift")
    if loc.get("node"):
        head = (f'<p class="bad">first drifting node: {esc(loc["node"])} ({esc(loc.get("op_type"))}), value '
                f'{esc(loc.get("value"))}: {esc("; ".join(loc.get("failures") or []))}</p>')  # fmt: skip
    else:
        head = f"<p>{esc(loc.get('note', 'no node drifts'))}</p>"
    body = head
    if trace:
        names = [t["node"] for t in trace]
        errs = [t.get("rel_l2", 0.0) for t in trace]
        svg = charts.trace(names, errs, first, "error along the graph (topological order)")
        lo = max((first or 0) - 10, 0)
        rows = [(i, t["node"], t["op_type"], t.get("cosine"), t.get("rel_l2"), t.get("max_abs"), t["drift"])
                for i, t in enumerate(trace)][lo:]  # fmt: skip
        body += chart("trace", svg, table(["#", "node", "op", "cosine", "rel L2", "max abs", "drift"], rows))
    return section("localize", "Localization (--localize)", body)


# --------------------------------------------------------------------------- optimize


def optimize_sections(doc: dict[str, Any], before: Any, after: Any, layers: int) -> str:
    out = ""
    if doc.get("warnings"):
        out += section(
            "warnings", "Warnings", "".join(f'<p class="bad">{esc(w)}</p>' for w in doc["warnings"])
        )
    src = doc.get("source")
    sizes = {}
    if src and os.path.isfile(src):
        sizes["source file"] = os.path.getsize(src)
    if doc.get("file_bytes_after"):
        sizes["optimized .onnx file"] = int(doc["file_bytes_after"])
    b = doc.get("budget")
    if b:
        sizes["weights.mcw (measured)"] = int((b.get("size") or {}).get("weights_file") or 0)
    if doc.get("account"):
        out += account_section(doc["account"], "Byte account (what export stores)", sizes, layers)
    if b and b.get("layers"):
        wbits = {r["name"]: r.get("weight_bits") for r in (doc.get("account") or {}).get("layers", [])}
        rows = [
            (r["name"], r["sparsity"], r["bits"] or wbits.get(r.get("tensor")) or 32) for r in b["layers"]
        ]
        out += sparsity_section(rows, "Sparsity and bits per layer (chosen)")
    elif doc.get("account"):
        rows = [(r["name"], 1 - (r.get("kept") or 1.0), r.get("weight_bits") or 32)
                for r in doc["account"]["layers"] if r.get("elements", 0) > 64]  # fmt: skip
        out += sparsity_section(rows, "Sparsity and bits per tensor")
    out += histogram_section(before, after, layers)
    if b:
        out += budget_sections(b)
    passes = doc.get("passes") or []
    if passes:
        prows = [(p.get("name"), p.get("bytes_before"), p.get("bytes_after"), p.get("seconds"),
                 json.dumps(p.get("config"), sort_keys=True)[:300]) for p in passes]  # fmt: skip
        out += section(
            "passes", "Passes", table(["pass", "bytes before", "bytes after", "seconds", "config"], prows)
        )
    if b and b.get("recipe"):
        rrows = [(s.get("name"), json.dumps(s.get("config"), sort_keys=True)[:400]) for s in b["recipe"]]
        out += section("recipe", "Recipe chosen", table(["pass", "config"], rrows))
    return out


# --------------------------------------------------------------------------- the page


def build(
    command: str,
    doc: dict[str, Any],
    *,
    summary: dict[str, Any] | None = None,
    before: Any = None,
    after: Any = None,
    layers: int = 6,
) -> str:
    """The whole page (see :mod:`mconv.report`)."""
    from mconv import __version__

    parts: list[str] = []
    title = f"mconv {command}"
    if command == "optimize":
        parts.append(optimize_sections(doc, before, after, layers))
    elif command == "verify":
        parts.append(verify_sections(doc))
    elif command == "analyze":
        parts.append(analyze_sections(doc))
    else:  # inspect / report: what a model or bundle holds
        if doc.get("account"):
            parts.append(account_section(doc["account"], "Byte account", {}, layers))
            rows = [(r["name"], 1 - r["kept"] if r.get("kept") is not None else 0.0, r.get("weight_bits") or 32)
                    for r in doc["account"].get("layers", []) if r.get("elements", 0) > 64]  # fmt: skip
            parts.append(sparsity_section(rows, "Sparsity and bits per tensor"))
        parts.append(histogram_section(None, after, layers))
    if summary is not None:
        parts.append(model_section(summary))
    elif command in ("inspect", "report"):
        parts.append(model_section(doc))
    blob = json.dumps(doc, sort_keys=True, indent=1, default=str)
    if len(blob) <= JSON_LIMIT:
        appendix = f"<details><summary>The JSON document (--json)</summary><pre>{esc(blob)}</pre></details>"
    else:
        appendix = (
            f'<p class="note">The JSON document ({len(blob):,} characters) is left out; --json prints it.</p>'
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
        f'<h1>{esc(title)}</h1><p class="note">mconv {esc(__version__)}; every chart has its numbers '
        "beside it; the JSON below is the command's --json.</p>"
        + "".join(parts)
        + section("json", "Data", appendix)
        + "</body></html>\n"
    )
