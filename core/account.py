"""The per-layer byte account of a bundle (and of an export, predicted).

Deep Compression's Table 4 lists, per layer, the weights kept, the bits per weight, the bits per
relative index and the compressed size. A bundle's manifest carries the same under ``account``.

Rules:

1. A tensor's codec is decided in one place, :func:`mconv.codecs.choose.choose_spec`, from the
   hints :func:`compression_hints` reads out of the model's metadata; this module only
   accounts for the choice (``choose_compressed_spec`` is that same function, an old name).
2. A predicted size is the one the choice computed (:func:`mconv.codecs.choose.best_spec`).
3. :func:`byte_account` builds ``{"layers": [...], "total": {...}}`` from the specs and the
   container records: per tensor ``name, codec, kept`` (fraction nonzero), ``weight_bits``,
   ``index_bits``, ``codebook_bytes``, ``bytes`` (actual blob), ``original_bytes`` (dense),
   ``predicted_bytes`` (:func:`mconv.codecs.predict_bytes` of the same spec). That is the
   account of an export (its report and ``--json``); the manifest keeps only
   :func:`account_summary` of it (``weights.mcw``'s index already lists every tensor, and a
   small bundle must not carry its weights' list twice), and :func:`container_account` rebuilds the per-tensor rows from that index
   (``mconv inspect``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx_ir as ir
from mconv.codecs.choose import COMPRESSION_KEY, TensorStats, best_spec, compression_hints, predict
from mconv.codecs.choose import choose_spec as choose_compressed_spec  # noqa: F401 (old name)
from mconv.codecs.palette import bit_view, known_histogram
from mconv.irio import owned_array


def codec_label(record: Mapping) -> str:
    """``sparse+palette+huffman`` style name of a record's codec chain."""
    parts = [record.get("codec", "raw")]
    if parts[0] == "sparse":
        parts.append(record.get("values", "raw"))
    if record.get("block"):  # per-block palettes: the block length, not the count of blocks
        parts.append(f"b{record['block']}")
    elif record.get("groups", 1) not in (None, 1):  # along axis 0, else g<G>a<axis>
        axis = record.get("axis", 0)
        parts.append(f"g{record['groups']}" + (f"a{axis}" if axis else ""))
    if record.get("huffman"):
        parts.append("huffman")
    if record.get("rans"):
        parts.append("rans")
    return "+".join(parts)


def _weight_bits(record: Mapping, itemsize: int) -> int:
    codec = record.get("codec", "raw")
    if codec == "palette" or (codec == "sparse" and record.get("values") == "palette"):
        return int(record.get("bits", 0))
    if codec == "fp16" or (codec == "sparse" and record.get("values") == "fp16"):
        return 16
    return itemsize * 8


def _predicted_bytes(a: np.ndarray, spec: Mapping, stats: TensorStats | None = None) -> int:
    """Blob bytes of ``spec`` for ``a``: raw and fp16 by size, coded specs by ``predict``."""
    codec = spec.get("codec", "raw")
    if codec in ("raw", "fp16"):
        return a.size * (2 if codec == "fp16" else a.dtype.itemsize)
    return predict(stats if stats is not None else TensorStats.of(a), dict(spec))


def _row(
    name: str,
    a: np.ndarray,
    record: Mapping,
    stored: int,
    predicted: int,
    codebook: int | None,
    nonzeros: int | None = None,
) -> dict:
    """One layer of the account (rule 3); ``nonzeros`` is ``a``'s count when known."""
    nonzeros = int(np.count_nonzero(a)) if nonzeros is None else nonzeros
    return {
        "name": name,
        "codec": codec_label(record),
        "kept": float(nonzeros) / max(a.size, 1),
        "elements": int(a.size),
        "weight_bits": _weight_bits(record, a.dtype.itemsize),
        "index_bits": record.get("index_bits"),
        "codebook_bytes": codebook,
        "bytes": int(stored),
        "original_bytes": int(a.nbytes),
        "predicted_bytes": int(predicted),
    }


def _totals(layers: list[dict], *extra: str) -> dict:
    """Sums over the layers (kept weighted by elements), plus the ``extra`` columns."""
    elements = sum(r["elements"] for r in layers)
    total = {
        "kept": sum(r["kept"] * r["elements"] for r in layers) / max(elements, 1),
        "elements": elements,
        "bytes": sum(r["bytes"] for r in layers),
        "original_bytes": sum(r["original_bytes"] for r in layers),
        "predicted_bytes": sum(r["predicted_bytes"] for r in layers),
    }
    for key in extra:
        total[key] = sum(r[key] for r in layers)
    total["compression"] = total["original_bytes"] / max(total["bytes"], 1)
    return total


def byte_account(
    weights: Sequence[tuple[str, np.ndarray, dict | None]], records: Mapping[str, Mapping]
) -> dict:
    """The per-layer account (rule 3) of the tensors stored in the container."""
    layers = []
    for name, array, spec in weights:
        record = records.get(name)
        if record is None:
            continue
        a = np.asarray(array)
        predicted = _predicted_bytes(a, spec or {"codec": record.get("codec", "raw")})
        codebook = int(record.get("streams", {}).get("codebook", 0))
        layers.append(_row(name, a, record, record["nbytes"], predicted, codebook))
    return {"layers": layers, "total": _totals(layers, "codebook_bytes")}


def predicted_account(model) -> dict | None:
    """The byte account an export of ``model`` would have, predicted without encoding (rule 4).

    4. For ``mconv optimize``'s report: every initializer gets the spec export would choose
       (:func:`mconv.container.choose_codec`) and its predicted size; ``bytes`` is that
       prediction. ``None`` when no tensor carries compression facts (nothing to account for
       beyond raw/fp16 sizes). A tensor whose histogram the cluster pass left is sized from it
       (:mod:`mconv.codecs.choose` rule 8), its kept fraction too: one without zeros is not
       read at all (the account must stay cheap beside the pass it reports on).
    """
    meta = dict(model.metadata_props)
    if COMPRESSION_KEY not in meta:
        return None
    layers = []
    for name, value in model.graph.initializers.items():
        if value.const_value is None:
            continue
        tensor = value.const_value
        known = known_histogram(tensor)  # the cluster pass's counts (palette rule 8)
        # An external tensor is read into a private copy (a memory map would keep its pages
        # resident until exit, one whole model's worth after the loop), unless its histogram
        # says there is nothing to read: no +0.0, no gaps (choose rule 8)
        unread = known is not None and not np.any(bit_view(known[0]) == 0)
        a = owned_array(tensor) if isinstance(tensor, ir.ExternalTensor) and not unread else tensor.numpy()
        if a.dtype.kind != "f" or a.ndim == 0:
            continue
        stats = None if known is None else TensorStats.of(a, known=known)
        nonzeros = None if known is None else int(known[1][known[0] != 0].sum())
        # the choice export makes (mconv.container.choose_codec) and the size it computed
        spec, predicted = best_spec(a, compression_hints(meta, name), stats)
        record = {**spec, "codec": spec.get("codec", "raw")}
        layers.append(_row(name, a, record, predicted, predicted, None, nonzeros))
    return {"layers": layers, "total": _totals(layers), "predicted": True}


def account_summary(account: Mapping) -> dict:
    """What a manifest keeps of an account: its ``total`` and one row per codec chain
    (``codecs``: label -> ``tensors``, ``elements``, ``bytes``, ``original_bytes``); the
    per-tensor rows live in ``weights.mcw``'s index (:func:`container_account`)."""
    codecs: dict[str, dict] = {}
    for r in account.get("layers", []):
        row = codecs.setdefault(r["codec"], {"tensors": 0, "elements": 0, "bytes": 0, "original_bytes": 0})
        row["tensors"] += 1
        for key in ("elements", "bytes", "original_bytes"):
            row[key] += int(r[key])
    return {"total": dict(account.get("total", {})), "codecs": dict(sorted(codecs.items()))}


def container_account(entries: Sequence) -> dict:
    """The per-tensor account (rule 3) read back from a container's index (its
    ``TensorEntry`` list), without decoding: ``kept`` is known for sparse records (their
    ``nonzeros``) and ``None`` otherwise; ``predicted_bytes`` is not stored and left out."""
    layers = []
    for e in entries:
        r = e.record
        shape = [int(d) for d in r.get("shape", [])]
        elements = int(np.prod(shape, dtype=np.int64)) if shape else 1
        itemsize = np.dtype(r["dtype"]).itemsize
        kept = None
        if r.get("codec") == "sparse" and "nonzeros" in r:
            kept = int(r["nonzeros"]) / max(elements, 1)
        layers.append(
            {
                "name": e.name,
                "codec": codec_label(r),
                "kept": kept,
                "elements": elements,
                "weight_bits": _weight_bits(r, itemsize),
                "index_bits": r.get("index_bits"),
                "codebook_bytes": int(r.get("streams", {}).get("codebook", 0)),
                "streams": {str(k): int(v) for k, v in (r.get("streams") or {}).items()},
                "bytes": int(e.nbytes),
                "original_bytes": elements * itemsize,
            }
        )
    total = {
        "elements": sum(r["elements"] for r in layers),
        "bytes": sum(r["bytes"] for r in layers),
        "original_bytes": sum(r["original_bytes"] for r in layers),
        "codebook_bytes": sum(r["codebook_bytes"] for r in layers),
    }
    total["compression"] = total["original_bytes"] / max(total["bytes"], 1)
    return {"layers": layers, "total": total}
