"""Rendering of the API's results for people: tables and summary lines (stderr, or stdout for a
command whose result is the table). Nothing here computes a result."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from mconv.cli.output import Out, human_bytes
from rich.markup import escape
from rich.table import Table


def render_pass_reports(out: Out, reports) -> None:
    if not out.show or not reports:
        return
    table = Table(title="passes", title_justify="left")
    for col in ("pass", "nodes", "params", "bytes", "time"):
        table.add_column(col, justify="left" if col == "pass" else "right")
    for r in reports:
        d = r.as_dict() if hasattr(r, "as_dict") else r
        table.add_row(
            d["name"],
            f"{d['nodes_before']} -> {d['nodes_after']}",
            f"{d['params_before']:,} -> {d['params_after']:,}",
            f"{human_bytes(d['bytes_before'])} -> {human_bytes(d['bytes_after'])}",
            f"{d['seconds']:.2f}s",
        )
    out.print(table)
    for r in reports:
        d = r.as_dict() if hasattr(r, "as_dict") else r
        for note in d.get("notes", []):
            out.print(f"  {d['name']}: {note}", markup=False)


def optimize_summary(
    output: Path, weights_before: int, weights_after: int, file_bytes: int, predicted: int | None
) -> str:
    """optimize's last line: weights before -> after in the .onnx, and (when the byte account
    predicts one) what a bundle will store; pruned and clustered weights stay dense in the
    .onnx (exact zeros, repeated values) until export encodes them."""
    onnx = Path(output).suffix.lower() == ".onnx"  # else a streamed checkpoint (packed safetensors)
    where = "in the .onnx" if onnx else "in the output"
    line = (
        f"wrote {output} ({human_bytes(file_bytes)}): weights {human_bytes(weights_before)} -> "
        f"{human_bytes(weights_after)} {where} ({weights_before / max(weights_after, 1):.1f}x)"
    )
    if predicted is not None:
        dense = "; stored dense in the .onnx until export" if onnx else ""
        line += f"; predicted bundle weights {human_bytes(predicted)} ({weights_before / max(predicted, 1):.1f}x{dense})"
    return line


def export_summary(
    output: Path,
    target: str,
    n_files: int,
    weights_before: int,
    weights_after: int,
    file_before: int,
    file_after: int,
) -> str:
    """export's last line: weights before -> after and files before -> after, never mixed."""
    return (
        f"wrote bundle {output} for {target}: weights {human_bytes(weights_before)} -> "
        f"{human_bytes(weights_after)} ({weights_before / max(weights_after, 1):.2f}x); files "
        f"{human_bytes(file_before)} -> {human_bytes(file_after)} ({n_files} files + manifest)"
    )


def render_byte_account(
    out: Out, manifest: dict, title: str = "weight storage (per tensor)", *, result: bool = False
) -> None:
    """The per-layer byte account (the Deep Compression paper's Table 4) when the manifest has one.

    ``result``: part of a command's result (inspect), printed on stdout; else a report on stderr."""
    account = manifest.get("account")
    if not out.show or not account:
        return
    say = out.print_result if result else out.print
    rows = account.get("layers", [])
    table = Table(title=title, title_justify="left")
    for col in (
        "tensor",
        "codec",
        "kept",
        "w bits",
        "idx bits",
        "codebook",
        "bytes",
        "% of orig",
        "predicted",
    ):
        table.add_column(col, justify="left" if col in ("tensor", "codec") else "right")
    for r in rows:
        table.add_row(
            escape(r["name"]),
            r.get("codec", ""),
            "" if r.get("kept") is None else f"{100 * r['kept']:.1f}%",
            str(r.get("weight_bits", "")),
            str(r.get("index_bits", "") or ""),
            str(r.get("codebook_bytes", "") or ""),
            f"{r['bytes']:,}",
            f"{100 * r['bytes'] / max(r['original_bytes'], 1):.2f}%",
            f"{r.get('predicted_bytes', '')}",
        )
    tot = account.get("total", {})
    if tot:
        table.add_row(
            "total",
            "",
            "" if tot.get("kept") is None else f"{100 * tot['kept']:.1f}%",
            "",
            "",
            "",
            f"{tot['bytes']:,}",
            f"{100 * tot['bytes'] / max(tot['original_bytes'], 1):.2f}%",
            f"{tot.get('predicted_bytes', '')}",
        )
    say(table)


def render_verify(out: Out, report) -> None:
    if not out.show:
        return
    how = (report.batching or {}).get("how")
    table = Table(title=f"verify ({report.samples} samples{', ' + how if how else ''})", title_justify="left")
    cols = [
        "output",
        "max_abs",
        "max_rel",
        "mean_abs",
        "cosine",
        "rel_l2",
        "snr_db",
        "top1",
        "top5",
        "acc ref",
        "acc cand",
        "gate",
    ]
    for c in cols:
        table.add_column(c, justify="left" if c == "output" else "right")

    def f(v, fmt="{:.3g}"):
        return "" if v is None else (str(v) if isinstance(v, str) else fmt.format(v))

    for name, m in report.outputs.items():
        table.add_row(
            name,
            f(m["max_abs"]),
            f(m["max_rel"]),
            f(m["mean_abs"]),
            f(m["cosine"], "{:.6f}"),
            f(m.get("rel_l2")),
            f(m["snr_db"], "{:.1f}"),
            f(m.get("top1_agreement"), "{:.4f}"),
            f(m.get("top5_agreement"), "{:.4f}"),
            f(m.get("accuracy_reference"), "{:.4f}"),
            f(m.get("accuracy_candidate"), "{:.4f}"),
            "FAIL" if name in report.failures else "ok",
        )
    out.print(table)
    gates = ", ".join(f"{k} {v:g}" for k, v in report.gates.items()) or "none"
    out.print(f"gates ({getattr(report, 'gates_source', 'user')}): {gates}", markup=False)
    if report.localized:
        out.print(localize_line(report.localized), markup=False)


def _metric(value, fmt: str = "{:.3g}") -> str | None:
    """A metric for a sentence, or None when there is none to show (missing, NaN)."""
    if value is None or isinstance(value, str):
        return value
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return None if np.isnan(v) else fmt.format(v)


def localize_line(loc: dict) -> str:
    """What ``--localize`` found, as a sentence: the first drifting node (its name, or its op and
    output when unnamed) with the metrics that exist, or that no node drifts and why; never a
    ``None`` or ``nan`` standing in for something unknown."""
    from mconv.errors import show

    node, value = loc.get("node"), loc.get("value")
    if not node and not value:  # nothing named: localize's reason says why
        return f"localize: {loc.get('note') or 'no drifting node found'}"
    op = loc.get("op_type")
    who = f"node '{show(node)}'" if node else "an unnamed node"
    if op:
        who += f" ({show(op)})"
    if value:
        who += f", output '{show(value)}'"
    facts = [
        f"{k} {v}"
        for k, v in (
            ("max_abs", _metric(loc.get("max_abs"))),
            ("cosine", _metric(loc.get("cosine"), "{:.6f}")),
            ("snr_db", _metric(loc.get("snr_db"), "{:.1f}")),
        )
        if v is not None
    ]
    fails = loc.get("failures") or []
    if fails:
        facts.append("fails " + ", ".join(map(str, fails)))
    if loc.get("fused_from"):
        facts.append(f"fused from {show(loc['fused_from'])}")
    line = f"first drifting node: {who}"
    if facts:
        line += ": " + "; ".join(facts)
    if loc.get("note"):
        line += f" ({loc['note']})"
    return line


def format_shape(shape) -> str:
    """``[1,3,224,224]``, ``[N,3,?,?]`` (a symbolic dim by its name, an unknown one as ``?``),
    ``[]`` for a scalar, ``?`` when the rank is unknown."""
    if shape is None:
        return "?"
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def render_inspect(out: Out, doc: dict) -> None:
    """inspect's result in human form, on stdout (``--json`` prints the document instead)."""
    if not out.show or out.json:
        return
    say = out.print_result
    say(
        f"{doc['path']} ({doc['kind']}): {doc['nodes']} nodes, {doc['params']:,} parameters, "
        f"{human_bytes(doc['bytes'])}",
        markup=False,
    )
    io = Table(title="inputs and outputs", title_justify="left")
    for c in ("", "name", "dtype", "shape"):
        io.add_column(c)
    for kind in ("inputs", "outputs"):
        for v in doc[kind]:
            io.add_row(kind[:-1], escape(v["name"]), v["dtype"], escape(format_shape(v["shape"])))
    say(io)
    ops = Table(title="ops", title_justify="left")
    ops.add_column("op")
    ops.add_column("count", justify="right")
    for op, n in sorted(doc["ops"].items(), key=lambda kv: (-kv[1], kv[0])):
        ops.add_row(escape(op), str(n))
    say(ops)
    if doc.get("bytes_by_dtype"):
        say(
            "bytes by dtype: " + ", ".join(f"{k} {human_bytes(v)}" for k, v in doc["bytes_by_dtype"].items()),
            markup=False,
        )
    big = Table(title="largest tensors", title_justify="left")
    for c in ("name", "dtype", "shape", "bytes"):
        big.add_column(c, justify="right" if c == "bytes" else "left")
    for t in doc["largest"]:
        big.add_row(escape(t["name"]), t["dtype"], escape(format_shape(t["shape"])), f"{t['bytes']:,}")
    say(big)
    if doc.get("manifest"):
        render_byte_account(out, {"account": doc.get("account")}, result=True)
        m = doc["manifest"]
        say(
            f"bundle: target {m.get('target')}, files: "
            + ", ".join(f"{k} ({human_bytes(v['bytes'])})" for k, v in sorted(m.get("files", {}).items())),
            markup=False,
        )


def render_sensitivity(out: Out, report) -> None:
    """One row per layer: metric at each sparsity (unclustered), a sparkline, bits, the choice."""
    from mconv.api.analyze import sparkline

    if not out.show:
        return
    sparsities = sorted({p.sparsity for layer in report.layers for p in layer.sweep})
    bit_list = sorted({p.bits for layer in report.layers for p in layer.sweep if p.bits}, reverse=True)
    metrics = [p.metric for layer in report.layers for p in layer.sweep]
    lo = min(metrics, default=0.0)
    table = Table(
        title=f"sensitivity: {report.metric} per layer, pruned alone ({report.samples} samples, "
        f"baseline {report.baseline:.4f})",
        title_justify="left",
    )
    table.add_column("layer")
    table.add_column("op")
    table.add_column("params", justify="right")
    for s in sparsities:
        table.add_column(f"s={s:g}", justify="right")
    table.add_column("curve")
    for b in bit_list:
        table.add_column(f"{b}b@s=0", justify="right")
    if report.max_drop is not None:
        table.add_column(f"choice (drop <= {report.max_drop:g})")
    for layer in report.layers:
        plain = {p.sparsity: p.metric for p in layer.sweep if p.bits is None}
        at_zero = {p.bits: p.metric for p in layer.sweep if p.bits and p.sparsity == 0.0}
        row = [layer.name, layer.op_type, f"{layer.params:,}"]
        row += [f"{plain[s]:.4f}" if s in plain else "" for s in sparsities]
        row.append(sparkline([plain[s] for s in sparsities if s in plain], lo, report.baseline))
        row += [f"{at_zero[b]:.4f}" if b in at_zero else "" for b in bit_list]
        if report.max_drop is not None:
            c = layer.choice or {}
            row.append(
                f"sparsity {c.get('sparsity', 0):g}" + (f", {c['bits']} bits" if c.get("bits") else "")
            )
        table.add_row(*row)
    out.print(table)
    for note in report.notes:
        out.print(f"  note: {note}", markup=False)


def render_run(out: Out, doc: dict) -> None:
    """run's outputs: a table of each output's dtype, shape and range; how inputs were drawn."""
    table = Table(title="outputs", title_justify="left")
    for col in ("name", "dtype", "shape", "min", "max", "mean"):
        table.add_column(col)
    for name, s in doc["outputs"].items():
        num = s["min"] is not None
        table.add_row(
            escape(name),
            s["dtype"],
            format_shape(s["shape"]),
            f"{s['min']:.4g}" if num else "",
            f"{s['max']:.4g}" if num else "",
            f"{s['mean']:.4g}" if num else "",
        )
    out.print(table)
    if "batching" in doc:
        out.print(f"random inputs: {doc['samples']} samples, {doc['batching']['how']}", markup=False)


def render_demo(out: Out, result) -> None:
    """demo's report: the passes, the byte account, accuracy before and after, the gate."""
    render_pass_reports(out, result.reports)
    render_byte_account(out, result.manifest)
    m = result.metrics
    table = Table(
        title=f"mconv demo: LeNet-300-100-style MLP on real handwritten digits ({result.held_out} held-out)",
        title_justify="left",
    )
    for c in ("", "weights", "ratio", "top-1 accuracy"):
        table.add_column(c, justify="left" if not c else "right")
    table.add_row(
        "original (float32)", human_bytes(result.bytes_before), "1.0x", f"{m['accuracy_reference']:.4f}"
    )
    table.add_row(
        f"bundle ({result.recipe}, cpu)",
        human_bytes(result.bytes_after),
        f"{result.bytes_before / max(result.bytes_after, 1):.1f}x",
        f"{m['accuracy_candidate']:.4f}",
    )
    out.print(table)
    out.print(
        f"agreement with the original: top-1 {m['top1_agreement']:.4f}, cosine {m['cosine']:.6f}, "
        f"SNR {m['snr_db']:.1f} dB; whole bundle {human_bytes(result.bundle_bytes)}; {result.seconds:.1f}s"
    )
    out.print(
        f"verification {'passed' if result.passed else 'FAILED'} (gate: top-1 agreement >= 0.97)"
        + (f"; files in {result.workdir}" if result.workdir else "")
    )
