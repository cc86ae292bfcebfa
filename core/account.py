"""Codec choice for compressed tensors and the per-layer byte account of a bundle.

Deep Compression's Table 4 lists, per layer, the weights kept, the bits per weight, the bits per
relative index and the compressed size. A bundle's manifest carries the same under ``account``.

Rules:

1. :func:`compression_hints` reads what the prune and cluster passes recorded for a tensor in the
   model's ``metadata_props["mconv.compression"]`` (see :mod:`mconv.passes._weights`).
2. :func:`choose_compressed_spec` sizes, from one analysis of the tensor, every applicable
   encoding: raw; fp16 when exact; a dense palette when the distinct values (zero included) fit
   ``bits`` (any width up to 8 when no bits are recorded); a grouped palette when the cluster
   pass used output-channel groups along axis 0; sparse relative indices (``index_bits`` as
   recorded, else 2..8) with raw, fp16 or palette values; each with and without canonical
   Huffman coding. It returns the smallest (ties go to the simpler, listed first).
3. :func:`byte_account` builds ``{"layers": [...], "total": {...}}`` from the specs and the
   container records: per tensor ``name, codec, kept`` (fraction nonzero), ``weight_bits``,
   ``index_bits``, ``codebook_bytes``, ``bytes`` (actual blob), ``original_bytes`` (dense),
   ``predicted_bytes`` (:func:`mconv.codecs.predict_bytes` of the same spec).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import numpy as np
import onnx_ir as ir
from mconv.codecs.choose import TensorStats, predict
from mconv.codecs.palette import bits_for
from mconv.irio import owned_array

COMPRESSION_KEY = "mconv.compression"


def compression_hints(model_metadata: Mapping[str, str] | None, name: str | None) -> dict:
    """The recorded facts of tensor ``name`` (rule 1), or {}."""
    if not model_metadata or not name or COMPRESSION_KEY not in model_metadata:
        return {}
    try:
        info = json.loads(model_metadata[COMPRESSION_KEY])
    except (TypeError, ValueError):
        return {}
    entry = info.get(name) if isinstance(info, dict) else None
    return dict(entry) if isinstance(entry, dict) else {}


def choose_compressed_spec(array: np.ndarray, hints: Mapping, stats: TensorStats | None = None) -> dict:
    """The smallest spec for a pruned and/or clustered tensor (rule 2); ``stats`` when the caller
    has analysed ``array`` already."""
    array = np.asarray(array)
    if array.dtype.kind not in "fiu" or array.size == 0:
        return {"codec": "raw"}
    bits = hints.get("bits")
    bits = int(bits) if bits is not None else None
    index_bits = hints.get("index_bits")
    stats = stats if stats is not None else TensorStats.of(array)
    limit = 256 if bits is None else 1 << bits
    fp16 = stats.fp16_exact and array.dtype.itemsize > 2
    base: list[dict] = [{"codec": "raw"}]
    if fp16:
        base.append({"codec": "fp16"})
    coded: list[dict] = []
    distinct = stats.dense_histogram()[0].size
    if 0 < distinct <= limit:
        coded.append({"codec": "palette", "bits": bits or bits_for(distinct)})
    groups = int(hints.get("groups", 1) or 1)
    if groups > 1 and int(hints.get("axis", 0)) == 0 and array.ndim >= 1 and array.shape[0] >= groups:
        coded.append({"codec": "palette", "bits": bits or 8, "groups": groups})
    nonzero_distinct = stats.nonzero_histogram()[0].size
    for ib in [int(index_bits)] if index_bits else range(2, 9):
        sparse = {"codec": "sparse", "index_bits": ib}
        coded.append({**sparse, "values": "raw"})
        if fp16:
            coded.append({**sparse, "values": "fp16"})
        need = nonzero_distinct + bool((stats.gaps >= 1 << ib).any())
        if need <= limit:
            coded.append({**sparse, "values": "palette", "bits": bits or bits_for(need)})
    candidates = base + [{**c, "huffman": h} for c in coded for h in (False, True)]
    sizes = []
    for c in candidates:
        try:
            sizes.append(predict(stats, c))
        except Exception:  # a candidate the codec refuses (e.g. a group over its bits): not chosen
            sizes.append(np.iinfo(np.int64).max)
    return candidates[int(np.argmin(sizes))]


def codec_label(record: Mapping) -> str:
    """``sparse+palette+huffman`` style name of a record's codec chain."""
    parts = [record.get("codec", "raw")]
    if parts[0] == "sparse":
        parts.append(record.get("values", "raw"))
    if record.get("groups", 1) not in (None, 1):
        parts.append(f"g{record['groups']}")
    if record.get("huffman"):
        parts.append("huffman")
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
    name: str, a: np.ndarray, record: Mapping, stored: int, predicted: int, codebook: int | None
) -> dict:
    """One layer of the account (rule 3)."""
    return {
        "name": name,
        "codec": codec_label(record),
        "kept": float(np.count_nonzero(a)) / max(a.size, 1),
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
       beyond raw/fp16 sizes).
    """
    from mconv.container import choose_codec

    meta = dict(model.metadata_props)
    if COMPRESSION_KEY not in meta:
        return None
    layers = []
    for name, value in model.graph.initializers.items():
        if value.const_value is None:
            continue
        tensor = value.const_value
        # An external tensor is read into a private copy: a memory map would keep its pages
        # resident until exit, one whole model's worth after the loop.
        a = owned_array(tensor) if isinstance(tensor, ir.ExternalTensor) else tensor.numpy()
        if a.dtype.kind != "f" or a.ndim == 0:
            continue
        hints = compression_hints(meta, name)
        if hints and (hints.get("bits") is not None or hints.get("pruned")):
            stats = TensorStats.of(a)  # analysed once: the choice and the prediction share it
            spec = choose_compressed_spec(a, hints, stats)
            predicted = _predicted_bytes(a, spec, stats)
            del stats
        else:
            spec = choose_codec(a, meta, name)
            predicted = _predicted_bytes(a, spec)
        record = {**spec, "codec": spec.get("codec", "raw")}
        layers.append(_row(name, a, record, predicted, predicted, None))
    return {"layers": layers, "total": _totals(layers), "predicted": True}
