"""Streaming weight-only compression of safetensors checkpoints (one file or sharded).

``compress_checkpoint(src, dest, scheme)`` compresses an LLM-size weight file tensor by tensor
with bounded memory, writing the output as it goes::

    model-00001-of-00004.safetensors ...  + model.safetensors.index.json   (the input, one model)
        -> dest/model-00001-of-00004.safetensors ... + dest/model.safetensors.index.json

Rules:

1. Input: a ``.safetensors`` file, a ``*.safetensors.index.json`` (``{"metadata": {...},
   "weight_map": {tensor: shard}}``) or a directory holding exactly one such index (else
   exactly one ``.safetensors``). Every shard is validated by
   :func:`mconv.formats.weights.safetensors_layout` (header bounded and checked against the
   real size, the tensors tile the data area) before anything is read. A shard name must be a
   plain file name beside the index (no folder, no ``..``, no link out of the folder); an
   index or file found in a folder the user named is a regular file there (a link out of
   the folder is refused, and a FIFO or a device is refused without being opened); the
   tensors a shard holds must be exactly those the weight map assigns to it, and no tensor may
   be in two shards. Anything else is one :class:`mconv.errors.InputError` naming the file.
2. What is compressed: floating tensors (F16, BF16, F32) of rank >= 2 and at least
   ``min_elements`` values, viewed as ``[shape[0], prod(shape[1:])]`` (rows = output channels
   for ``nn.Linear`` / embeddings). Everything else (norms, biases, integer tensors) is copied
   byte for byte.
3. Schemes: ``blockwise`` (:mod:`mconv.passes.blockwise`: int4/int8, block 32/64/128,
   sym/asym, ``rtn`` or ``hqq``; as the graph pass, a block at most twice a row's length) stores ``NAME.qweight`` (U8: codes packed two per byte at 4
   bits, LSB first; signed codes offset by 2**(bits-1) as ONNX Runtime's ``MatMulNBits``
   stores them), ``NAME.scales`` (F16 ``[rows, blocks]``) and, asymmetric, ``NAME.zeros`` (U8
   ``[rows, blocks]``). ``cluster`` (k-means palettes, :mod:`mconv.passes.cluster`: ``bits``
   1-8, ``groups`` contiguous groups of rows, one palette each) stores ``NAME.indices`` (U8,
   codes packed LSB first at ``bits`` bits per row) and ``NAME.lut`` (F32 ``[groups,
   2**bits]``); with ``block=B`` (per-block palettes, cluster rule 8, within each row: a row's
   last block is shorter when B does not divide it) ``NAME.lut`` is ``[rows, blocks per row,
   2**bits]`` in the tensor's own dtype. Exact zeros stay exact (cluster rule 1). ``__metadata__["mconv.stream"]``
   records, per tensor, the scheme and the original dtype and shape, so :func:`dequantized`
   rebuilds each tensor.
4. Memory: a tensor is read in row chunks of at most ``chunk_bytes`` with ``os.preadv`` into
   private buffers (no memory map, so no page of the input stays in the process), compressed
   by a pool of ``threads`` workers (numpy releases the GIL), and each chunk's output is
   written with ``os.pwrite`` at its final offset: every output size follows from the shapes,
   so each output header is written first. Peak memory is a few chunks, whatever the file size.
   A palette needs the tensor's value histogram first: each group of rows is read twice
   (statistics, then codes). Outputs are written atomically: one file under a temporary name
   renamed into place, a sharded checkpoint as a whole folder written aside and swapped in
   (:func:`mconv.fileio.atomic_dir`; its index says ``"producer": "mconv"``, which lets a later
   run replace it), so a killed run leaves the old folder or the new one, never a mix.
   The kernels (:mod:`mconv.drivers.stream_kernels`) work on pieces of 256K values that stay
   in cache: a 16-bit tensor's palette comes from the exact histogram of its 65,536 bit
   patterns and its codes from a 65,536-entry table; RTN with a row length that is a multiple
   of the block treats the rows as one run of blocks (per-block max/min by ``reduceat``).
   The bytes are those of :func:`mconv.passes.blockwise.quantize_rtn` and of the palette's
   nearest-centroid rule; inf or nan in a tensor is an InputError for either scheme.
5. The report: per tensor name, shape, scheme, bits per weight, MSE and SNR (dB) against the
   input; totals of bytes in and out and the seconds taken. A 16-bit tensor's palette error is
   computed from its histogram (exact, float64).
6. ``mconv optimize SRC --passes SPEC -o OUT`` streams (:func:`stream_scheme`) when SRC is a
   safetensors checkpoint (rule 1), SPEC is one ``cluster`` (options ``bits``, ``init``,
   ``groups``, ``block``, ``min_elements``) or ``blockwise`` (``bits``, ``block``, ``sym``, ``method``,
   ``min_elements``) pass, and OUT is a ``.safetensors`` name (one file in) or a folder (a
   sharded checkpoint in). ``blockwise`` of one file to another name is refused (exit 2);
   ``cluster`` of one file to a folder name writes a weights bundle (rule 7), and to a name
   with another extension runs the graph pipeline.
7. A weights bundle streamed (:func:`compress_to_bundle`): the container's index first (every
   blob's size follows from the shapes), palettes in the tensor's own dtype and packed codes at
   their offsets, the CRCs read back and written into the index in place. Its docstring has
   the details.
"""

from __future__ import annotations

import functools
import json
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from mconv.errors import InputError, show
from mconv.fileio import PRODUCER, atomic_dir, atomic_path, not_regular, note_input, read_regular
from mconv.formats.weights import parse_json, safetensors_layout

STREAM_KEY = "mconv.stream"
INDEX_SUFFIX = ".safetensors.index.json"
MAX_INDEX_BYTES = 64 << 20
_FLOATS = {"float16": "F16", "bfloat16": "BF16", "float32": "F32"}
_ST_CODE = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
    "uint8": "U8",
    "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}


# --- the input ------------------------------------------------------------------------------


@dataclass
class SourceTensor:
    name: str
    path: Path
    offset: int  # absolute byte offset of the data
    nbytes: int
    dtype: np.dtype
    shape: tuple[int, ...]


@dataclass
class Shard:
    path: Path
    tensors: list[SourceTensor]
    metadata: dict[str, str]


def _index_shards(index: Path) -> tuple[list[Path], dict[str, str], dict]:
    raw = read_regular(index, MAX_INDEX_BYTES, "index")  # a FIFO or a device is refused, not waited on
    doc = parse_json(raw, path=str(index), where="byte offset 0", what="index", hint="re-save it")
    wmap = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(wmap, dict) or not wmap:
        raise InputError("index has no 'weight_map' object", path=str(index), hint="re-save the checkpoint")
    folder = index.parent.resolve()
    shards: dict[str, Path] = {}
    for tensor, shard in wmap.items():
        if not isinstance(shard, str) or not shard or shard in (".", "..") or "/" in shard or "\\" in shard:
            raise InputError(
                f"tensor '{show(tensor)}' names shard {show(repr(shard))}, not a file name beside the index",
                path=str(index),
                where=f"weight_map entry '{show(tensor)}'",
                hint="shards must sit in the index's folder",
            )
        if shard not in shards:
            p = folder / shard
            if not p.is_file() or p.resolve().parent != folder:
                raise InputError(
                    f"shard '{show(shard)}' is missing or lies outside the index's folder",
                    path=str(index),
                    where=f"weight_map entry '{show(tensor)}'",
                    hint="put every shard beside the index",
                )
            note_input(p, "shard")
            shards[shard] = p
    assert isinstance(doc, dict)
    meta: dict = doc["metadata"] if isinstance(doc.get("metadata"), dict) else {}
    return list(shards.values()), {str(k): str(v) for k, v in wmap.items()}, meta


def _in_folder(p: Path, folder: Path) -> Path:
    """A file found in the folder the user named: a regular file there, or a link to one in the
    same folder (a link out of it is refused: only the files the user named are read)."""
    try:
        st = os.stat(p)
        inside = p.resolve().parent == folder.resolve()
    except (OSError, RuntimeError) as exc:
        raise InputError(
            f"'{show(p.name)}' cannot be read ({exc})", path=str(folder), hint="check the folder"
        ) from None
    if not inside:
        raise InputError(
            f"'{show(p.name)}' is a link to a file outside the folder",
            path=str(folder),
            hint="copy the file into the folder, or name it directly",
        )
    if not stat.S_ISREG(st.st_mode):
        raise not_regular(p, "checkpoint file", st.st_mode)
    return p


def open_checkpoint(src: str | os.PathLike) -> tuple[list[Shard], Path | None, dict]:
    """Rule 1: the shards of a checkpoint (validated), the index path (or None) and its metadata."""
    src = Path(src)
    note_input(src, "checkpoint")
    index: Path | None = None
    if src.is_dir():
        found = sorted(src.glob(f"*{INDEX_SUFFIX}"))
        if len(found) == 1:
            index = _in_folder(found[0], src)
        elif not found:
            files = sorted(src.glob("*.safetensors"))
            if len(files) != 1:
                raise InputError(
                    f"folder holds {len(files)} .safetensors files and no index",
                    path=str(src),
                    hint="name the file, or add model.safetensors.index.json",
                )
            src = _in_folder(files[0], src)
        else:
            raise InputError(f"folder holds {len(found)} indexes", path=str(src), hint="name one of them")
    elif src.name.endswith(INDEX_SUFFIX) or src.suffix == ".json":
        index = src
    if index is not None:
        note_input(index, "index")
    if index is None:
        specs, start, meta = safetensors_layout(src)
        tensors = [SourceTensor(n, src, start + b, e - b, d, s) for b, e, n, d, s in specs]
        return [Shard(src, tensors, meta)], None, {}
    paths, wmap, imeta = _index_shards(index)
    shards, seen = [], set()
    for p in paths:
        specs, start, meta = safetensors_layout(p)
        tensors = []
        for b, e, n, d, s in specs:
            if wmap.get(n) != p.name:
                raise InputError(
                    f"tensor '{show(n)}' is in shard '{show(p.name)}' but the weight map puts it "
                    + (f"in '{show(wmap[n])}'" if n in wmap else "nowhere"),
                    path=str(index),
                    where=f"shard '{show(p.name)}'",
                    hint="the index does not match the shards; re-save the checkpoint",
                )
            seen.add(n)
            tensors.append(SourceTensor(n, p, start + b, e - b, d, s))
        shards.append(Shard(p, tensors, meta))
    missing = [n for n in wmap if n not in seen]
    if missing:
        raise InputError(
            f"{len(missing)} tensors of the weight map are in no shard (first: '{show(missing[0])}')",
            path=str(index),
            where=f"weight_map entry '{show(missing[0])}'",
            hint="a shard is incomplete; re-save the checkpoint",
        )
    return shards, index, imeta


def _mv(a: np.ndarray) -> memoryview:
    """A byte view of a contiguous array."""
    return memoryview(a.data).cast("B")  # type: ignore[arg-type]


def _pread(fd: int, buf: np.ndarray, offset: int, path: Path) -> None:
    view = _mv(buf)
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise InputError(
                "file shrank while being read",
                path=str(path),
                where=f"byte offset {offset + done}",
                hint="read a stable copy",
            )
        done += n


# --- schemes --------------------------------------------------------------------------------


@dataclass
class Scheme:
    """What to do with every compressible tensor (rule 2-3)."""

    kind: str = "blockwise"  # or "cluster"
    bits: int = 4
    block: int = -1  # not given: blockwise 32, cluster 0 (off; > 0: per-block palettes)
    sym: bool = True
    method: str = "rtn"  # blockwise: rtn | hqq
    groups: int = 1  # cluster: palettes per tensor (groups of rows)
    init: str = "linear"  # cluster
    min_elements: int = 4096
    bundle: bool = False  # cluster: write a weights bundle (rule 7), not packed safetensors

    def __post_init__(self) -> None:
        if self.block == -1:
            self.block = 32 if self.kind == "blockwise" else 0

    def check(self) -> None:
        if self.kind not in ("blockwise", "cluster"):
            raise InputError(f"scheme {self.kind!r}", hint="stream blockwise or cluster")
        if self.kind == "blockwise":
            if self.bits not in (4, 8):
                raise InputError(f"bits={self.bits}", where="pass blockwise", hint="use 4 or 8")
            if self.method not in ("rtn", "hqq"):
                raise InputError(
                    f"method={self.method!r} cannot stream",
                    where="pass blockwise",
                    hint="use rtn or hqq (gptq needs a graph)",
                )
            if self.block < 16 or self.block & (self.block - 1):
                raise InputError(f"block={self.block}", where="pass blockwise", hint="use 32, 64 or 128")
        elif not 1 <= self.bits <= 8 or self.groups < 1:
            raise InputError(
                f"bits={self.bits} groups={self.groups}", where="pass cluster", hint="bits 1..8, groups >= 1"
            )
        elif isinstance(self.block, bool) or not isinstance(self.block, int) or self.block < 0:
            raise InputError(
                f"block={self.block!r}", where="pass cluster", hint="use 0 (off) or a block size"
            )
        elif self.block and (self.groups > 1 or self.init not in ("linear", "density", "optimal")):
            raise InputError(
                f"block={self.block} with groups={self.groups}, init={self.init!r}",
                where="pass cluster",
                hint="per-block palettes take no groups, and init linear, density or optimal",
            )


def _packed_row(k: int, bits: int) -> int:
    return (k * bits + 7) // 8


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Rows of uint8 codes packed LSB first at ``bits`` bits (each row padded to whole bytes)."""
    if bits == 8:
        return codes
    r, k = codes.shape
    if bits == 4:
        if k % 2:
            codes = np.concatenate([codes, np.zeros((r, 1), np.uint8)], axis=1)
        return codes[:, 0::2] | (codes[:, 1::2] << 4)
    bitsarr = np.unpackbits(codes[..., None], axis=-1, bitorder="little")[..., :bits].reshape(r, k * bits)
    return np.packbits(bitsarr, axis=1, bitorder="little")


def _unpack(packed: np.ndarray, bits: int, k: int) -> np.ndarray:
    if bits == 8:
        return packed[:, :k]
    r = packed.shape[0]
    if bits == 4:
        out = np.empty((r, packed.shape[1] * 2), np.uint8)
        out[:, 0::2] = packed & 15
        out[:, 1::2] = packed >> 4
        return out[:, :k]
    b = np.unpackbits(packed, axis=1, bitorder="little")[:, : k * bits].reshape(r, k, bits)
    return np.packbits(b, axis=-1, bitorder="little")[..., 0]


@dataclass
class _Plan:
    """One output tensor: name, safetensors dtype code, shape, bytes."""

    name: str
    code: str
    shape: tuple[int, ...]
    nbytes: int
    offset: int = 0


@dataclass
class _Job:
    src: SourceTensor
    rows: int
    cols: int
    outputs: list[_Plan] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    # the dtype palettes are stored in when not float32 (a weights bundle stores the tensor's
    # own: rule 7), and the report's error is that of the stored values
    lut_dtype: np.dtype | None = None


def _stored_lut(lut: np.ndarray, job: _Job) -> np.ndarray:
    return lut if job.lut_dtype is None else lut.astype(job.lut_dtype)


def _is_target(t: SourceTensor, scheme: Scheme) -> bool:
    # a weights bundle clusters vectors too (rule 7: the graph pass's selection on a weight file)
    rank = 1 if scheme.bundle else 2
    return t.dtype.name in _FLOATS and len(t.shape) >= rank and int(np.prod(t.shape)) >= scheme.min_elements


def _rows_cols(shape: tuple[int, ...]) -> tuple[int, int]:
    """A tensor as ``[rows, cols]``: ``[shape[0], prod(shape[1:])]``, a vector as one row."""
    return (1, shape[0]) if len(shape) == 1 else (shape[0], int(np.prod(shape[1:])))


def _plan_tensor(t: SourceTensor, scheme: Scheme) -> _Job:
    if not _is_target(t, scheme):
        code = _ST_CODE[t.dtype.name]
        return _Job(t, 0, 0, [_Plan(t.name, code, t.shape, t.nbytes)], {"scheme": "copy"})
    rows, cols = _rows_cols(t.shape)
    info = {
        "scheme": scheme.kind,
        "dtype": _FLOATS[t.dtype.name],
        "shape": list(t.shape),
        "bits": scheme.bits,
    }
    if scheme.kind == "blockwise":
        if scheme.block > 2 * cols:  # a row is padded to a whole block: more would mostly be padding
            raise InputError(
                f"block={scheme.block} is longer than twice the rows of {show(t.name)} ({cols} values)",
                where="pass blockwise",
                hint=f"use a block of at most {2 * cols}",
            )
        nb = -(-cols // scheme.block)
        outs = [
            _Plan(
                f"{t.name}.qweight",
                "U8",
                (rows, _packed_row(cols, scheme.bits)),
                rows * _packed_row(cols, scheme.bits),
            ),
            _Plan(f"{t.name}.scales", "F16", (rows, nb), rows * nb * 2),
        ]
        if not scheme.sym:
            outs.append(_Plan(f"{t.name}.zeros", "U8", (rows, nb), rows * nb))
        info.update(block=scheme.block, sym=scheme.sym, method=scheme.method)
    else:
        g = min(scheme.groups, rows)
        indices = _Plan(
            f"{t.name}.indices",
            "U8",
            (rows, _packed_row(cols, scheme.bits)),
            rows * _packed_row(cols, scheme.bits),
        )
        if scheme.block:
            nb = -(-cols // scheme.block)
            # the palettes in the tensor's own dtype: at 16 bits per entry they cost half
            size = t.dtype.itemsize
            lut = _Plan(
                f"{t.name}.lut",
                _FLOATS[t.dtype.name],
                (rows, nb, 1 << scheme.bits),
                rows * nb * (size << scheme.bits),
            )
            info.update(block=scheme.block, init=scheme.init)
        else:
            lut = _Plan(f"{t.name}.lut", "F32", (g, 1 << scheme.bits), g * (4 << scheme.bits))
            info.update(groups=g, init=scheme.init)
        outs = [indices, lut]
    return _Job(t, rows, cols, outs, info)


def _header(jobs: list[_Job], metadata: dict[str, str]) -> bytes:
    """The safetensors header of the planned outputs; offsets filled in place."""
    entries: dict[str, object] = {"__metadata__": metadata}
    pos = 0
    for job in jobs:
        for o in job.outputs:
            o.offset = pos
            entries[o.name] = {"dtype": o.code, "shape": list(o.shape), "data_offsets": [pos, pos + o.nbytes]}
            pos += o.nbytes
    raw = json.dumps(entries, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


# --- per-chunk work -------------------------------------------------------------------------


def _blockwise_chunk(x: np.ndarray, scheme: Scheme) -> tuple:
    from mconv.passes import blockwise as bw

    if scheme.method == "hqq":
        qz = bw.quantize_hqq(x, scheme.bits, scheme.block, scheme.sym)
    else:
        qz = bw.quantize_rtn(x, scheme.bits, scheme.block, scheme.sym)
    codes = (
        qz.q.view(np.uint8)
        if qz.zero is not None
        else (qz.q.astype(np.int16) + (1 << (scheme.bits - 1))).astype(np.uint8)
    )
    return _pack(codes, scheme.bits), qz.scale.astype(np.float16), qz.zero, qz


def _as_float32(raw: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return raw.view(dtype).astype(np.float32)


def _rtn_chunk(raw: np.ndarray, dtype: np.dtype, scheme: Scheme) -> tuple:
    """Round-to-nearest of whole rows whose length is a multiple of the block: the rows are one
    run of blocks, quantized piece by piece in cache (:mod:`mconv.drivers.stream_kernels`)."""
    from mconv.drivers import stream_kernels as K

    size = dtype.itemsize
    n, block, bits = raw.size // size, scheme.block, scheme.bits
    packed = np.empty(n * bits // 8, np.uint8)
    scales = np.empty(n // block, np.float16)
    zeros = None if scheme.sym else np.empty(n // block, np.uint8)
    sig = noise = 0.0
    for i in range(0, n, K.SUB):
        x = K.to_float32(raw[i * size : (i + K.SUB) * size], dtype)
        scale, zero = K.block_params(x, bits, block, scheme.sym)
        codes, s2, e2 = K.rtn_blocks(x, scale, zero, bits, block)
        sig += s2
        noise += e2
        j, m = i // block, x.size // block
        scales[j : j + m] = scale
        if zeros is not None and zero is not None:
            zeros[j : j + m] = zero
        if bits == 4:
            packed[i // 2 : (i + x.size) // 2] = K.pack4(codes.reshape(1, -1)).reshape(-1)
        else:
            packed[i : i + x.size] = codes
    return packed, scales, zeros, sig, noise


class _Stats:
    """Sums for MSE / SNR, accumulated over chunks."""

    def __init__(self) -> None:
        self.signal = 0.0
        self.noise = 0.0
        self.n = 0

    def add(self, x: np.ndarray, approx: np.ndarray) -> None:
        d = (approx - x).ravel()
        xf = x.ravel()
        self.noise += float(np.dot(d, d))
        self.signal += float(np.dot(xf, xf))
        self.n += x.size


def _palette_for(hist: np.ndarray, dtype: np.dtype, bits: int, init: str) -> tuple[np.ndarray, np.ndarray]:
    """Centroids (sorted float32 LUT, zero first when the tensor holds zeros) and the code ->
    index table of a 16-bit float tensor from its histogram of bit patterns."""
    from mconv.drivers.stream_kernels import values16
    from mconv.passes.cluster import ValueBins, bin_centroids

    values = values16(dtype)
    finite = np.isfinite(values)
    if hist[~finite].any():
        raise InputError("weights hold inf or nan", hint="clean the weights before clustering")
    zero_codes = values == 0
    zeros = int(hist[zero_codes].sum())
    occ = np.flatnonzero((hist > 0) & finite & ~zero_codes)
    k_total = 1 << bits
    lut = np.zeros(k_total, np.float32)
    table = np.zeros(1 << 16, np.uint8)
    if occ.size == 0:
        return lut, table
    order = occ[np.argsort(values[occ], kind="stable")]
    v = values[order]
    n = hist[order].astype(np.int64)
    bins = ValueBins(n, v * n, v, v, None, True, np.dtype(np.float64))
    k = k_total - 1 if zeros else k_total
    c = bin_centroids(bins, k, init)  # type: ignore[arg-type]
    c32 = c.astype(np.float32)
    mids = (c[1:] + c[:-1]) / 2
    idx = np.searchsorted(mids, values[finite], side="left")
    base = 1 if zeros else 0
    t = np.zeros(1 << 16, np.int64)
    t[finite] = idx + base
    if zeros:
        t[zero_codes] = 0
        lut[1 : 1 + c32.size] = c32
    else:
        lut[: c32.size] = c32
    table[:] = t.astype(np.uint8)
    return lut, table


@functools.lru_cache(maxsize=4)
def _sorted_patterns(dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For a 16-bit float dtype: the finite nonzero bit patterns sorted by value (stable) and
    their values; all finite patterns sorted by value and theirs (:func:`_palettes_linear`)."""
    from mconv.drivers.stream_kernels import values16

    values = values16(dtype)
    finite = np.isfinite(values)
    nz = np.flatnonzero(finite & (values != 0))
    nz = nz[np.argsort(values[nz], kind="stable")]
    fin = np.flatnonzero(finite)
    fin = fin[np.argsort(values[fin], kind="stable")]
    return nz, values[nz], fin, values[fin]


def _palettes_linear(
    hists: np.ndarray, dtype: np.dtype, bits: int, max_iter: int = 300
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_palette_for` with ``init="linear"`` for many groups at once (``hists`` ``[G,
    65536]``): the same Lloyd steps (:func:`mconv.passes.cluster.lloyd_bins`) on every group's
    histogram together, over the value-sorted bit patterns (a pattern a group does not hold
    weighs nothing: its prefix sums do not move), so the same centroids, luts and tables, bit
    for bit, without a Python loop per group."""
    from mconv.drivers.stream_kernels import values16

    values = values16(dtype)
    if hists[:, ~np.isfinite(values)].any():
        raise InputError("weights hold inf or nan", hint="clean the weights before clustering")
    nz, v, fin, vf = _sorted_patterns(dtype)
    g_all = hists.shape[0]
    k_total = 1 << bits
    luts = np.zeros((g_all, k_total), np.float32)
    tables = np.zeros((g_all, 1 << 16), np.uint8)
    zeros = hists[:, values == 0].sum(axis=1) > 0
    n = hists[:, nz]
    held = n > 0
    union = np.flatnonzero(held.any(axis=0))  # patterns no group holds weigh nothing anywhere
    n, held, v = n[:, union], held[:, union], v[union]
    some = held.any(axis=1)
    first = np.where(some, held.argmax(axis=1), 0)
    last = np.where(some, n.shape[1] - 1 - held[:, ::-1].argmax(axis=1), 0)
    for with_zero in (False, True):
        rows = np.flatnonzero(some & (zeros == with_zero))
        if rows.size == 0:
            continue
        k = k_total - 1 if with_zero else k_total
        lo, hi = v[first[rows]], v[last[rows]]
        single = lo == hi
        # np.linspace's own arithmetic row by row (its array form switches every row to
        # another formula when one row's step is zero)
        if k == 1:
            c = lo[:, None].copy()
        else:
            c = np.arange(k)[None, :] * ((hi - lo) / (k - 1))[:, None] + lo[:, None]
            c[:, -1] = hi
        counts_ = n[rows]
        pc2 = np.zeros((rows.size, v.size + 1), np.int64)
        np.cumsum(counts_, axis=1, out=pc2[:, 1:])
        pt2 = np.zeros((rows.size, v.size + 1))
        np.cumsum(v[None, :] * counts_, axis=1, out=pt2[:, 1:])
        stride = v.size + 1
        pc, pt = pc2.ravel(), pt2.ravel()
        active = np.arange(rows.size)  # rows not yet at their fixed point (they stay there)
        for _ in range(max_iter):
            ca = c[active]
            b = np.empty((active.size, k + 1), np.intp)
            b[:, 0], b[:, -1] = 0, v.size
            b[:, 1:-1] = v.searchsorted((ca[:, 1:] + ca[:, :-1]) / 2, side="right")
            b += (active * stride)[:, None]
            cb, tb = pc[b], pt[b]
            cnt = cb[:, 1:] - cb[:, :-1]
            new = np.where(cnt > 0, (tb[:, 1:] - tb[:, :-1]) / np.maximum(cnt, 1), ca)
            new.sort(axis=1)
            moved = (new != ca).any(axis=1)
            c[active] = new
            active = active[moved]
            if active.size == 0:
                break
        base = 1 if with_zero else 0
        # a group of one value: that value alone (bin_centroids' early return)
        c32 = c.astype(np.float32)
        c32[single] = 0.0
        c32[single, 0] = lo[single].astype(np.float32)
        luts[rows, base : base + k] = c32
        # codes of every finite pattern: how many midpoints lie below its value
        mids = (c[:, 1:] + c[:, :-1]) / 2
        mids[single] = np.inf  # one centroid: every value takes code 0
        at = np.searchsorted(vf, mids, side="right")  # patterns at or below each midpoint
        width = vf.size + 1
        marks = np.bincount(
            (at + (np.arange(rows.size) * width)[:, None]).ravel(), minlength=rows.size * width
        ).reshape(rows.size, width)
        idx = np.cumsum(marks[:, : vf.size], axis=1, dtype=np.uint8)
        idx += np.uint8(base)
        t = tables[rows]
        t[:, fin] = idx
        if with_zero:
            t[:, values == 0] = 0
        tables[rows] = t
    return luts, tables


# --- the driver -----------------------------------------------------------------------------


@dataclass
class StreamReport:
    files: list[str]
    bytes_in: int
    bytes_out: int
    seconds: float
    tensors: list[dict]

    @property
    def mb_per_s(self) -> float:
        return self.bytes_in / 1e6 / max(self.seconds, 1e-9)

    def as_dict(self) -> dict:
        return {
            "files": self.files,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "seconds": round(self.seconds, 3),
            "mb_per_s": round(self.mb_per_s, 1),
            "tensors": self.tensors,
        }


def _row_chunks(
    job: _Job, chunk_bytes: int, lo: int = 0, hi: int | None = None, align: int = 1
) -> Iterator[tuple[int, int]]:
    hi = job.rows if hi is None else hi
    row_bytes = max(job.cols * job.src.dtype.itemsize, 1)
    step = max(chunk_bytes // row_bytes // align * align, align)
    for r0 in range(lo, hi, step):
        yield r0, min(r0 + step, hi)


def _stream_shard(
    shard: Shard,
    dest: Path,
    scheme: Scheme,
    pool: ThreadPoolExecutor,
    chunk_bytes: int,
    stats: list[dict],
    tick: Callable[[str], None] | None,
) -> int:
    jobs = [_plan_tensor(t, scheme) for t in shard.tensors]
    meta = dict(shard.metadata)
    meta[STREAM_KEY] = json.dumps(
        {j.src.name: j.info for j in jobs if j.info["scheme"] != "copy"}, sort_keys=True
    )
    meta["producer"] = "mconv"
    head = _header(jobs, meta)
    base = len(head)
    total = base + sum(o.nbytes for j in jobs for o in j.outputs)
    with atomic_path(dest) as tmp, open(tmp, "wb") as out, open(shard.path, "rb") as src:
        out.write(head)
        out.truncate(total)
        _run_jobs(jobs, scheme, pool, chunk_bytes, src.fileno(), out.fileno(), base, stats, tick)
        os.fchmod(out.fileno(), 0o644)
    return total


def _run_jobs(
    jobs: list[_Job],
    scheme: Scheme,
    pool: ThreadPoolExecutor,
    chunk_bytes: int,
    ifd: int,
    ofd: int,
    base: int,
    stats: list[dict],
    tick: Callable[[str], None] | None,
) -> None:
    """Every job's output written at ``base`` + its planned offsets in ``ofd`` (rule 4): copies
    byte for byte, the others compressed chunk by chunk on ``pool``; a report row per
    compressed tensor appended to ``stats`` in the jobs' order."""

    def read_rows(job: _Job, r0: int, r1: int) -> np.ndarray:
        t = job.src
        row = job.cols * t.dtype.itemsize
        buf = np.empty((r1 - r0) * row, np.uint8)
        _pread(ifd, buf, t.offset + r0 * row, t.path)
        return buf

    pending: list[tuple[_Job, list]] = []
    for job in jobs:
        t = job.src
        if job.info["scheme"] == "copy":
            done = 0
            while done < t.nbytes:
                n = min(chunk_bytes, t.nbytes - done)
                buf = np.empty(n, np.uint8)
                _pread(ifd, buf, t.offset + done, t.path)
                os.pwrite(ofd, _mv(buf), base + job.outputs[0].offset + done)
                done += n
            continue
        if scheme.kind == "blockwise":
            qw, sc = job.outputs[0], job.outputs[1]
            zp = job.outputs[2] if len(job.outputs) > 2 else None
            prow = _packed_row(job.cols, scheme.bits)
            nb = sc.shape[1]

            def work(r0: int, r1: int, job=job, qw=qw, sc=sc, zp=zp, prow=prow, nb=nb) -> tuple[float, float]:
                raw = read_rows(job, r0, r1)
                if scheme.method == "rtn" and job.cols % scheme.block == 0:
                    packed, scales, zeros, sig, noise = _rtn_chunk(raw, job.src.dtype, scheme)
                else:
                    x = _as_float32(raw, job.src.dtype).reshape(r1 - r0, job.cols)
                    packed, scales, zeros, qz = _blockwise_chunk(x, scheme)
                    s = _Stats()
                    s.add(x, qz.dequantize())
                    sig, noise = s.signal, s.noise
                os.pwrite(ofd, _mv(np.ascontiguousarray(packed)), base + qw.offset + r0 * prow)
                os.pwrite(
                    ofd,
                    _mv(np.ascontiguousarray(scales)),
                    base + sc.offset + r0 * nb * 2,
                )
                if zp is not None and zeros is not None:
                    os.pwrite(ofd, _mv(np.ascontiguousarray(zeros)), base + zp.offset + r0 * nb)
                return sig, noise

            futures = [pool.submit(work, r0, r1) for r0, r1 in _row_chunks(job, chunk_bytes)]
        else:
            futures = _cluster_tensor(job, scheme, pool, chunk_bytes, read_rows, ofd, base)
        # not waited for here: the next tensor's chunks queue behind these, so the pool's
        # threads never idle at a tensor's end (the report is summed below, in order)
        pending.append((job, futures))
    for job, futures in pending:
        if tick:
            tick(job.src.name)
        st = _Stats()
        for f in futures:
            sig, noise = f.result()
            st.signal += sig
            st.noise += noise
        t = job.src
        n = job.rows * job.cols
        bpw = sum(o.nbytes for o in job.outputs) * 8 / n
        stats.append(
            {
                "name": t.name,
                "shape": list(t.shape),
                "scheme": scheme.kind,
                "bits_per_weight": round(bpw, 4),
                "mse": st.noise / n,
                "snr_db": 10 * np.log10(st.signal / st.noise) if st.noise > 0 else float("inf"),
            }
        )


def _cluster_blocks(job, scheme: Scheme, pool, chunk_bytes, read_rows, ofd, base) -> list:
    """Per-block palettes (cluster rule 8, within each row): one pass, chunk by chunk of rows,
    each chunk's blocks clustered on their own (:func:`mconv.passes.cluster.block_palettes`)."""
    from mconv.drivers import stream_kernels as K
    from mconv.passes.cluster import block_palettes

    ind, lutp = job.outputs
    prow = _packed_row(job.cols, scheme.bits)
    block, bits, cols = scheme.block, scheme.bits, job.cols
    nb, full = lutp.shape[1], cols // block * block

    def work(r0: int, r1: int) -> tuple[float, float]:
        x = K.to_float32(read_rows(job, r0, r1), job.src.dtype).reshape(r1 - r0, cols)
        lut = np.zeros((r1 - r0, nb, 1 << bits), job.src.dtype)
        codes = np.empty((r1 - r0, cols), np.uint8)
        if full:  # whole blocks: the rows' first ``full`` values, as one run of blocks
            head = np.ascontiguousarray(x[:, :full])
            p, c = block_palettes(head, bits, block, init=scheme.init)
            lut[:, : full // block] = p.reshape(r1 - r0, full // block, -1)
            codes[:, :full] = c
        if full < cols:  # each row's shorter last block
            p, c = block_palettes(np.ascontiguousarray(x[:, full:]), bits, cols - full, init=scheme.init)
            lut[:, -1] = p
            codes[:, full:] = c
        approx = lut[np.arange(r1 - r0)[:, None], (np.arange(cols) // block)[None, :], codes]
        s = _Stats()
        s.add(x, approx.astype(np.float32))
        os.pwrite(ofd, lut.tobytes(), base + lutp.offset + r0 * nb * (job.src.dtype.itemsize << bits))
        packed = K.pack4(codes) if bits == 4 else _pack(codes, bits)
        os.pwrite(ofd, _mv(np.ascontiguousarray(packed)), base + ind.offset + r0 * prow)
        return s.signal, s.noise

    return [pool.submit(work, r0, r1) for r0, r1 in _row_chunks(job, chunk_bytes)]


def _cluster_tensor(job, scheme: Scheme, pool, chunk_bytes, read_rows, ofd, base) -> list:
    """Palettes per group of rows: histogram pass, centroids, code pass (rule 4)."""
    if scheme.block:
        return _cluster_blocks(job, scheme, pool, chunk_bytes, read_rows, ofd, base)
    t = job.src
    if t.dtype.itemsize != 2:  # float32: through float16 bit patterns would change values
        return _cluster_f32(job, scheme, pool, chunk_bytes, read_rows, ofd, base)
    if scheme.init == "linear" and job.info["groups"] > 1:  # (one group: the loop below is as fast)
        return _cluster_groups_linear(job, scheme, pool, chunk_bytes, read_rows, ofd, base)
    from mconv.drivers import stream_kernels as K

    ind, lutp = job.outputs
    prow = _packed_row(job.cols, scheme.bits)
    groups = np.array_split(np.arange(job.rows), job.info["groups"])
    values = K.values16(t.dtype)
    futures = []
    for g, rows in enumerate(groups):
        lo, hi = int(rows[0]), int(rows[-1]) + 1
        acc: dict[int, np.ndarray] = {}  # one histogram per worker thread

        def count(r0: int, r1: int, acc=acc) -> None:
            h = K.hist16(read_rows(job, r0, r1).view(np.uint16))
            mine = acc.setdefault(threading.get_ident(), np.zeros(1 << 16, np.int64))
            mine += h

        for f in [pool.submit(count, r0, r1) for r0, r1 in _row_chunks(job, chunk_bytes, lo, hi)]:
            f.result()
        hist = np.sum(list(acc.values()), axis=0)
        lut, table = _palette_for(hist, t.dtype, scheme.bits, scheme.init)
        lut = _stored_lut(lut, job)
        os.pwrite(ofd, lut.tobytes(), base + lutp.offset + g * lut.nbytes)
        # the report's error from the histogram: exact, and no pass over the tensor
        errors = K.hist_error(hist, values, lut.astype(np.float32)[table])

        def work(r0: int, r1: int, table=table) -> tuple[float, float]:
            raw = read_rows(job, r0, r1).view(np.uint16).reshape(r1 - r0, job.cols)
            codes = K.lookup16(raw, table)
            packed = K.pack4(codes) if scheme.bits == 4 else _pack(codes, scheme.bits)
            os.pwrite(ofd, _mv(np.ascontiguousarray(packed)), base + ind.offset + r0 * prow)
            return 0.0, 0.0

        futures += [pool.submit(work, r0, r1) for r0, r1 in _row_chunks(job, chunk_bytes, lo, hi)]
        futures.append(pool.submit(lambda e=errors: e))
    return futures


GROUP_BATCH = 64  # groups whose histograms are counted together (64 x 512 KB per thread)


def _cluster_groups_linear(job, scheme: Scheme, pool, chunk_bytes, read_rows, ofd, base) -> list:
    """16-bit tensors, ``init="linear"``: the groups' histograms counted in one parallel pass
    over a batch of groups (a chunk of rows adds to every group it spans), the batch's palettes
    by :func:`_palettes_linear` (the same bytes as :func:`_palette_for` per group), then the
    code pass, queued without waiting."""
    from mconv.drivers import stream_kernels as K

    t = job.src
    ind, lutp = job.outputs
    prow = _packed_row(job.cols, scheme.bits)
    bounds = [0]
    for rows in np.array_split(np.arange(job.rows), job.info["groups"]):
        bounds.append(bounds[-1] + rows.size)
    edges = np.array(bounds)
    values = K.values16(t.dtype)
    futures = []
    for g0 in range(0, len(bounds) - 1, GROUP_BATCH):
        g1 = min(g0 + GROUP_BATCH, len(bounds) - 1)
        lo, hi = bounds[g0], bounds[g1]
        acc: dict[int, np.ndarray] = {}  # per worker thread: [groups of the batch, 65536]

        def count(r0: int, r1: int, acc=acc, g0=g0, g1=g1) -> None:
            raw = read_rows(job, r0, r1).view(np.uint16).reshape(r1 - r0, job.cols)
            mine = acc.get(threading.get_ident())
            if mine is None:  # (not setdefault: its default would be allocated on every call)
                mine = acc[threading.get_ident()] = np.zeros((g1 - g0, 1 << 16), np.int64)
            first = int(np.searchsorted(edges, r0, side="right")) - 1
            for g in range(first, g1):
                a, b = max(edges[g], r0), min(edges[g + 1], r1)
                if a >= b:
                    break
                mine[g - g0] += K.hist16(raw[a - r0 : b - r0])

        for f in [pool.submit(count, r0, r1) for r0, r1 in _row_chunks(job, chunk_bytes, lo, hi)]:
            f.result()
        hists = np.sum(list(acc.values()), axis=0)
        luts, tables = _palettes_linear(hists, t.dtype, scheme.bits)
        luts = _stored_lut(luts, job)
        os.pwrite(ofd, luts.tobytes(), base + lutp.offset + g0 * luts[0].nbytes)
        # the report's error from the histograms: exact, and no pass over the tensor
        sig = noise = 0.0
        for h, lut, table in zip(hists, luts, tables):
            e = K.hist_error(h, values, lut.astype(np.float32)[table])
            sig, noise = sig + e[0], noise + e[1]

        def work(r0: int, r1: int, tables=tables, g0=g0, g1=g1) -> tuple[float, float]:
            raw = read_rows(job, r0, r1).view(np.uint16).reshape(r1 - r0, job.cols)
            codes = np.empty(raw.shape, np.uint8)
            first = int(np.searchsorted(edges, r0, side="right")) - 1
            for g in range(first, g1):
                a, b = max(edges[g], r0), min(edges[g + 1], r1)
                if a >= b:
                    break
                K.lookup16(raw[a - r0 : b - r0], tables[g - g0], out=codes[a - r0 : b - r0])
            packed = K.pack4(codes) if scheme.bits == 4 else _pack(codes, scheme.bits)
            os.pwrite(ofd, _mv(np.ascontiguousarray(packed)), base + ind.offset + r0 * prow)
            return 0.0, 0.0

        futures += [pool.submit(work, r0, r1) for r0, r1 in _row_chunks(job, chunk_bytes, lo, hi)]
        futures.append(pool.submit(lambda e=(sig, noise): e))
    return futures


def _cluster_f32(job, scheme: Scheme, pool, chunk_bytes, read_rows, ofd, base) -> list:
    """float32 tensors: each group is clustered in memory by :func:`mconv.passes.cluster.cluster_array`
    (one group of rows at a time; bounded by the group's size)."""
    from mconv.passes.cluster import cluster_array

    ind, lutp = job.outputs
    prow = _packed_row(job.cols, scheme.bits)
    out = []
    for g, rows in enumerate(np.array_split(np.arange(job.rows), job.info["groups"])):
        lo, hi = int(rows[0]), int(rows[-1]) + 1
        x = read_rows(job, lo, hi).view(np.float32).reshape(hi - lo, job.cols)
        c = cluster_array(x, scheme.bits, scheme.init)  # type: ignore[arg-type]
        lut = np.zeros(1 << scheme.bits, np.float32)
        distinct = np.unique(c)
        lut[: distinct.size] = distinct
        codes = np.searchsorted(distinct, c).astype(np.uint8)
        os.pwrite(ofd, lut.tobytes(), base + lutp.offset + g * lut.nbytes)
        os.pwrite(
            ofd,
            _mv(np.ascontiguousarray(_pack(codes, scheme.bits))),
            base + ind.offset + lo * prow,
        )
        s = _Stats()
        s.add(x, c)
        done = pool.submit(lambda a=s.signal, b=s.noise: (a, b))
        out.append(done)
    return out


def compress_checkpoint(
    src: str | os.PathLike,
    dest: str | os.PathLike,
    scheme: Scheme,
    *,
    threads: int | None = None,
    chunk_bytes: int = 4 << 20,
    tick: Callable[[str], None] | None = None,
) -> StreamReport:
    """Compress a checkpoint (rule 1) into ``dest``: a ``.safetensors`` file for a single-file
    input, a folder of shards plus the index for a sharded one (rules 2-5)."""
    scheme.check()
    shards, index, imeta = open_checkpoint(src)
    dest = Path(dest)
    t0 = time.perf_counter()
    stats: list[dict] = []
    files: list[str] = []
    bytes_out = 0
    threads = threads or min(4, os.cpu_count() or 1)
    with ThreadPoolExecutor(threads) as pool, ExitStack():
        if index is None:
            bytes_out += _stream_shard(shards[0], dest, scheme, pool, chunk_bytes, stats, tick)
            files.append(str(dest))
        else:  # the whole folder is written aside and swapped in (mconv.fileio.atomic_dir)
            wmap = {}
            with atomic_dir(dest) as tmp:
                for shard in shards:
                    bytes_out += _stream_shard(
                        shard, tmp / shard.path.name, scheme, pool, chunk_bytes, stats, tick
                    )
                    files.append(str(dest / shard.path.name))
                    for job in (_plan_tensor(t, scheme) for t in shard.tensors):
                        for o in job.outputs:
                            wmap[o.name] = shard.path.name
                # "producer": what tells a later run that this folder is mconv's to replace
                meta = {**imeta, "total_size": bytes_out, "producer": PRODUCER}
                doc = {"metadata": meta, "weight_map": wmap}
                (tmp / index.name).write_text(json.dumps(doc, indent=2, sort_keys=True))
                os.chmod(tmp / index.name, 0o644)
                os.chmod(tmp, 0o755)
            files.append(str(dest / index.name))
    bytes_in = sum(t.nbytes for s in shards for t in s.tensors)
    return StreamReport(files, bytes_in, bytes_out, time.perf_counter() - t0, stats)


def dequantized(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The tensors of a compressed file (rule 3) rebuilt, in their original dtype and shape."""
    from mconv.formats.weights import read_safetensors

    arrays, meta = read_safetensors(Path(path))
    byname = dict(arrays)
    try:
        info = json.loads(meta.get(STREAM_KEY, "{}"))
    except json.JSONDecodeError:
        raise InputError(
            f"__metadata__ '{STREAM_KEY}' is not JSON", path=str(path), hint="re-compress"
        ) from None
    out: dict[str, np.ndarray] = {}
    parts = {f"{n}.{s}" for n in info for s in ("qweight", "scales", "zeros", "indices", "lut")}
    for name, arr in arrays:
        if name not in parts:
            out[name] = np.array(arr)
    import ml_dtypes

    for name, d in info.items():
        shape = tuple(d["shape"])
        rows, cols = shape[0], int(np.prod(shape[1:]))
        dtype = (
            np.dtype(ml_dtypes.bfloat16)
            if d["dtype"] == "BF16"
            else np.dtype(d["dtype"].replace("F", "float"))
        )
        bits = int(d["bits"])
        if d["scheme"] == "blockwise":
            from mconv.passes.blockwise import dequantize

            codes = _unpack(np.asarray(byname[f"{name}.qweight"]), bits, cols)
            scales = np.asarray(byname[f"{name}.scales"]).astype(np.float32)
            if d["sym"]:
                w = dequantize(codes.astype(np.int16) - (1 << (bits - 1)), scales, None, int(d["block"]))
            else:
                w = dequantize(codes, scales, np.asarray(byname[f"{name}.zeros"]), int(d["block"]))
        else:
            codes = _unpack(np.asarray(byname[f"{name}.indices"]), bits, cols)
            lut = np.asarray(byname[f"{name}.lut"])
            if "block" in d:  # [rows, blocks per row, 2**bits]
                at = np.arange(cols) // int(d["block"])
                w = lut[np.arange(rows)[:, None], at[None, :], codes].astype(np.float32)
            else:
                w = np.empty((rows, cols), np.float32)
                for g, r in enumerate(np.array_split(np.arange(rows), lut.shape[0])):
                    w[r] = lut[g][codes[r]]
        out[name] = w.astype(dtype).reshape(shape)
    return out


# --- mconv optimize on a checkpoint ---------------------------------------------------------

# Options of the passes that stream, and the Scheme field each one sets.
_STREAMABLE = {
    "cluster": {"bits", "init", "groups", "block", "min_elements"},
    "blockwise": {"bits", "block", "sym", "method", "min_elements"},
}


def is_checkpoint(src: Path) -> bool:
    """A safetensors file, a ``*.safetensors.index.json`` or a folder holding either."""
    if src.is_dir():
        return any(src.glob(f"*{INDEX_SUFFIX}")) or any(src.glob("*.safetensors"))
    return src.is_file() and (src.suffix == ".safetensors" or src.name.endswith(INDEX_SUFFIX))


def _sharded(src: Path) -> bool:
    return src.name.endswith(INDEX_SUFFIX) or (src.is_dir() and any(src.glob(f"*{INDEX_SUFFIX}")))


def stream_scheme(src: Path, passes: str, output: Path, format: str | None) -> Scheme | None:
    """The scheme when ``mconv optimize SRC --passes SPEC -o OUT`` streams (docs/passes.md,
    "Weight files and safetensors checkpoints"): SRC a safetensors checkpoint, SPEC one
    ``cluster`` or ``blockwise`` pass with only the options above, and OUT a ``.safetensors`` name
    (one file in) or a folder (a sharded checkpoint in). None: the graph pipeline runs as for any
    other model."""
    from mconv import passes as P
    from mconv.passes.blockwise import Blockwise
    from mconv.passes.cluster import Cluster

    if format not in (None, "safetensors") or not is_checkpoint(src):
        return None
    specs = P.parse_spec(passes)
    if len(specs) != 1 or specs[0].name not in _STREAMABLE or specs[0].op_type or specs[0].op_name:
        return None
    spec = specs[0]
    if set(spec.config) - _STREAMABLE[spec.name]:
        return None
    sharded = _sharded(src) or (src.is_dir() and len(list(src.glob("*.safetensors"))) != 1)
    bundle = not sharded and output.suffix != ".safetensors"
    if bundle:
        if spec.name == "blockwise":  # the graph pass quantizes MatMul/Gemm weights: a weight file has none
            raise InputError(
                f"blockwise on a weight file writes packed safetensors, not '{show(output.name)}'",
                path=str(src),
                where="-o",
                hint="name the output OUT.safetensors",
            )
        if output.suffix:  # out.onnx, out.npz ...: the graph pipeline writes that format
            return None
    if sharded and output.suffix:
        raise InputError(
            f"a sharded checkpoint is written as a folder, not '{show(output.name)}'",
            path=str(src),
            where="-o",
            hint="name a folder without an extension",
        )
    defaults = Cluster.Config() if spec.name == "cluster" else Blockwise.Config()
    cfg = {k: spec.config.get(k, getattr(defaults, k)) for k in _STREAMABLE[spec.name] - {"min_elements"}}
    scheme = Scheme(kind=spec.name, **cfg)
    if "min_elements" in spec.config:
        scheme.min_elements = int(spec.config["min_elements"])
    scheme.check()
    if bundle:  # a weights bundle (rule 7), streamed when the rows pack as the container does
        if "min_elements" not in spec.config:  # the graph pass's selection on a weight file
            scheme.min_elements = Cluster.Config().min_elements
        if not bundle_streamable(src, scheme):
            return None  # the graph pipeline writes it
        scheme.bundle = True
    return scheme


# --- a weights bundle, streamed (rule 7) -----------------------------------------------------


def bundle_streamable(src: str | os.PathLike, scheme: Scheme) -> bool:
    """Rule 7's precondition: one ``.safetensors`` file, ``cluster``, and every tensor it
    compresses has rows of whole bytes of codes (``cols * bits % 8 == 0``) and, with ``block``,
    rows of whole blocks, so that the rows' packed codes and palettes are the container's
    flat ones."""
    if scheme.kind != "cluster":
        return False
    shards, index, _ = open_checkpoint(src)
    if index is not None:
        return False
    bundle, scheme.bundle = scheme.bundle, True
    try:
        for t in shards[0].tensors:
            if _is_target(t, scheme):
                cols = _rows_cols(t.shape)[1]
                if cols * scheme.bits % 8 or (scheme.block and cols % scheme.block):
                    return False
                if len(t.shape) == 1 and scheme.groups > 1:  # the graph pass splits its values
                    return False
    finally:
        scheme.bundle = bundle
    return True


def _crc_range(fd: int, offset: int, nbytes: int, piece: int = 8 << 20) -> int:
    import zlib

    crc, done = 0, 0
    while done < nbytes:
        n = min(piece, nbytes - done)
        crc = zlib.crc32(os.pread(fd, n, offset + done), crc)
        done += n
    return crc


def compress_to_bundle(
    src: str | os.PathLike,
    dest: str | os.PathLike,
    scheme: Scheme,
    *,
    config: dict | None = None,
    threads: int | None = None,
    chunk_bytes: int = 4 << 20,
    tick: Callable[[str], None] | None = None,
) -> StreamReport:
    """Rule 7: a ``.safetensors`` file clustered into a weights bundle at ``dest`` (the
    ``weights`` target's ``manifest.json`` + ``weights.mcw``, container version 3), tensor by
    tensor with the memory of rule 4.

    7. ``mconv optimize FILE.safetensors --passes "cluster(...)" -o FOLDER`` streams here when
       :func:`bundle_streamable` holds (else the graph pipeline writes the bundle). The
       tensors are those the graph pass clusters in a weight file: float, ndim >= 1 (a vector
       is one row), at least ``min_elements`` values (the pass's default, 16). Every
       size follows from the shapes: the container's index is written first with the blobs'
       sizes and records, the blobs at their offsets as the chunks finish, then each blob's
       CRC-32 is read back and the index rewritten in place (the CRCs are fixed-width). A
       compressed tensor is a palette record (``bits``, ``groups`` or ``block``, no entropy
       coder) whose codebook is the palettes in the tensor's own dtype and whose index stream
       is the rows' packed codes; everything else is a ``raw`` record. Tensors are stored
       sorted by name, as every bundle stores them. The manifest is the ``weights`` target's:
       provenance names the source and its sha256 (hashed on a thread of its own while the
       tensors stream) and the pass with ``config``; the account is read from the index.
       The folder is written atomically."""
    import mconv
    from mconv.account import account_summary, container_account
    from mconv.bundle import FORMAT, FORMAT_VERSION, MANIFEST, WEIGHTS, manifest_bytes
    from mconv.container import HEADER, MAGIC, TensorEntry, _alignment_v3, _index_v3, _pad_to
    from mconv.fileio import sha256_file

    scheme.check()
    shards, index, _ = open_checkpoint(src)
    if index is not None or not bundle_streamable(shards[0].path, scheme):
        raise InputError(
            "this checkpoint does not stream into a weights bundle",
            path=str(src),
            hint="one .safetensors file, cluster, rows of whole bytes of codes (and of whole blocks)",
        )
    shard = shards[0]
    scheme.bundle = True
    jobs = sorted((_plan_tensor(t, scheme) for t in shard.tensors), key=lambda j: j.src.name)
    entries: list[TensorEntry] = []
    for job in jobs:
        t = job.src
        if job.info["scheme"] == "copy":
            record: dict = {"codec": "raw", "dtype": t.dtype.name, "shape": list(t.shape)}
            record["streams"] = {"data": t.nbytes}
            nbytes = t.nbytes
        else:
            job.lut_dtype = t.dtype
            count, size = job.rows * job.cols, 1 << scheme.bits
            groups = count // scheme.block if scheme.block else int(job.info["groups"])
            codebook, codes = groups * size * t.dtype.itemsize, count * scheme.bits // 8
            record = {"codec": "palette", "bits": scheme.bits, "codebook_size": size}
            record |= {"codebook_dtype": t.dtype.name, "groups": groups, "huffman": False}
            if scheme.block:
                record["block"] = scheme.block
            record |= {"streams": {"codebook": codebook, "indices": codes}}
            record |= {"shape": list(t.shape), "dtype": t.dtype.name}
            nbytes = codebook + codes
        entries.append(TensorEntry(t.name, 0, nbytes, "", record))
    placeholder = _index_v3(entries, [0] * len(entries))
    offset = HEADER.size + len(placeholder)
    for e in entries:
        offset += _pad_to(offset, _alignment_v3(e.record))
        e.offset = offset
        offset += e.nbytes
    total = offset
    for job, e in zip(jobs, entries):
        if job.info["scheme"] == "copy":
            job.outputs[0].offset = e.offset
        else:  # the palettes first, then the codes (palette rule: codebook, then index stream)
            ind, lutp = job.outputs
            lutp.offset = e.offset
            ind.offset = e.offset + e.record["streams"]["codebook"]

    t0 = time.perf_counter()
    stats: list[dict] = []
    hasher = ThreadPoolExecutor(1)
    source_sha = hasher.submit(sha256_file, shard.path)
    dest = Path(dest)
    threads = threads or min(4, os.cpu_count() or 1)
    with atomic_dir(dest) as tmp:
        mcw = tmp / WEIGHTS
        with ThreadPoolExecutor(threads) as pool, open(mcw, "w+b") as out, open(shard.path, "rb") as inp:
            ofd = out.fileno()
            out.write(HEADER.pack(MAGIC, 3, len(placeholder)))
            out.truncate(total)
            _run_jobs(jobs, scheme, pool, chunk_bytes, inp.fileno(), ofd, 0, stats, tick)
            crcs = list(pool.map(lambda e: _crc_range(ofd, e.offset, e.nbytes), entries))
            final = _index_v3(entries, crcs)
            assert len(final) == len(placeholder)  # a CRC is 4 bytes whatever its value
            os.pwrite(ofd, final, HEADER.size)
        digest = sha256_file(mcw, 8 << 20)
        sha = source_sha.result()
        hasher.shutdown()
        account = container_account(entries)
        summary = account_summary(account)
        summary["total"]["predicted_bytes"] = summary["total"]["bytes"]  # sizes follow from shapes
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "target": "weights",
            "model_name": shard.path.stem,
            "inputs": [],
            "outputs": [],
            "files": {WEIGHTS: {"bytes": total, "sha256": digest}},
            "weights": [],
            "provenance": {
                "source_name": shard.path.name,
                "source_sha256": sha,
                "source_format": "safetensors",
                "mconv_version": mconv.__version__,
                "passes": [{"name": scheme.kind, "config": dict(config or {})}],
            },
            "verification": None,
            "options": {},
            "account": summary,
        }
        (tmp / MANIFEST).write_bytes(manifest_bytes(manifest))
        for f in tmp.rglob("*"):
            f.chmod(0o644)
        tmp.chmod(0o755)
    bytes_in = sum(t.nbytes for t in shard.tensors)
    files = [str(dest / MANIFEST), str(dest / WEIGHTS)]
    return StreamReport(files, bytes_in, total, time.perf_counter() - t0, stats)
