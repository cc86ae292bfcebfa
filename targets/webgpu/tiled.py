"""Workgroup-tiled WGSL kernels: convolution as an implicit GEMM, Gemm/MatMul, and the
split-K matrix-vector product of a fully connected layer at batch 1.

Rules (the conventions of :mod:`mconv.targets.webgpu.wgsl` hold, except its rules 3 and 4):

1. A tiled kernel runs workgroups of 64 invocations, dispatched as the other kernels are (the
   plan's grid counts invocations, ``64 * workgroups``, so :func:`~mconv.targets.webgpu.wgsl.
   dispatch_size` gives one workgroup per tile). Each invocation reads its workgroup's index
   from ``workgroup_id`` and ``num_workgroups`` (uniform values: every barrier is reached by
   the whole workgroup) and its place in it from ``local_invocation_index``.
2. GEMM tiles: a workgroup computes a ``TM x TN`` tile of the output, each invocation an
   ``RM x RN`` register block of it (rows ``ty + i*TY``, columns ``tx + j*TX``: neighbouring
   invocations store neighbouring outputs). The K loop walks ``TK``-deep slices of both
   operands staged in ``var<workgroup>`` memory as f32 (zero outside the matrix), with a
   barrier before and after each slice is used. Sums are f32 whatever the storage.
3. A convolution is that GEMM over rows = the group's output channels, columns = the output
   pixels of one image, depth = input channels x kernel window: the weight rows are read as
   they are stored, the input columns are gathered on the fly (padding reads as zero); no
   im2col buffer exists. The depth runs kernel tap first, then input channel (a tap's input
   offsets and padding tests hold for all its channels); a 1x1 convolution without padding
   (any stride) reads its pixels without padding tests. Bias and the fused activation are
   applied as the tile is stored. Depthwise convolutions (one input channel a group) stay the direct kernel.
4. The tile shape is chosen per layer (:func:`choose_tile`): the candidate that keeps at least
   :data:`MIN_WORKGROUPS` workgroups (a GPU needs many in flight at batch 1), wastes little of
   its tiles at the matrix edges, and is largest (fewer loads per multiply-add). A layer whose
   tiles would hold more invocations than its output has elements keeps the direct kernel
   (the plan's check that a grid never exceeds its output).
6. Software adapters (a CPU running the shaders: lavapipe, SwiftShader) pay for every barrier,
   and for a shader that has one even where it is not reached, and gain nothing from workgroup
   memory. So a tiled module has a second entry point, ``<kernel>_direct``: the same tiles
   computed from storage alone, each invocation looping over K (in the same order: the same
   sums), no workgroup memory and no barrier; a matrix-vector product's is one invocation per
   column. Its register blocks have :data:`DIRECT_FOLD` times the rows (:func:`direct_tile`)
   and the workgroup's other invocations do nothing: a CPU runs invocations a SIMD register at
   a time and gathers every load lane by lane, so fewer, fatter invocations load less per
   multiply-add. The runner and the page run it on such an adapter
   (:func:`uses_shared_memory`, :func:`entry_point`); the plan and the WGSL are the same for
   every adapter.
7. Matrix-vector (a Gemm or MatMul whose A has fewer than :data:`GEMV_ROWS` rows): each
   workgroup owns ``CW`` output columns and splits their K loop over ``64 / CW`` lanes; the
   lanes' partial sums meet in workgroup memory and are added in a fixed tree order (the
   result does not depend on scheduling). A lane keeps :data:`GEMV_UNROLL` independent
   sums over its K positions, added in order at the end, so that many loads are in flight:
   a matrix-vector product streams its weights once and is bound by memory, not arithmetic. Lanes walk B in its storage order (along K when B is
   transposed, along N otherwise) so neighbouring invocations read neighbouring words.
8. Split K inside the workgroup (:func:`k_groups`): a layer with few tiles and a long K (a
   late ResNet layer at batch 1: 512 x 49 outputs, K = 4,608) leaves most of a GPU idle while
   each workgroup walks K alone. There the workgroup has ``KS`` (2 or 4) groups of 64
   invocations; group ``g`` takes the TK-slices ``g, g + KS, g + 2 KS, ...`` into its own
   workgroup memory and its own register block, and at the end groups 1..KS-1 leave their
   sums in workgroup memory for group 0, which adds them in group order and stores. The
   dispatch is unchanged (one workgroup a tile); the loop runs the same number of times in
   every group (slices past K read zeros), so every barrier is reached by the whole
   workgroup. The software path (rule 6) keeps one K loop per output: there the sums are
   ordered differently and agree to float32 rounding.
9. Softmax and LogSoftmax over rows of at least :data:`SOFTMAX_ROW` values (a classifier's
   1,000 classes at batch 1: one invocation walking the row three times left a GPU idle for
   a quarter of a millisecond) take a workgroup a row: each lane takes every 64th value, the
   maximum and the sum of exponentials meet in workgroup memory in a fixed tree order, and
   every lane writes its values. The software path (rule 6) walks the row in one invocation.
"""

from __future__ import annotations

from dataclasses import dataclass

LANES = 64
MIN_WORKGROUPS = 128
GEMV_ROWS = 8
TK = 16
DIRECT_FOLD = 4  # rule 6: rows of a direct register block per row of the tiled one
KSPLIT = 4  # rule 8: at most this many lane groups share a tile's K loop
SPLIT_BELOW = 512  # rule 8: split K while a layer has fewer workgroups than this
SPLIT_MIN_SLICES = 8  # rule 8: every lane group walks at least this many TK slices
WORKGROUP_BYTES = 16384  # WebGPU's default maxComputeWorkgroupStorageSize
SOFTMAX_ROW = 256  # rule 9: a Softmax row at least this long gets a workgroup
GEMV_UNROLL = 4  # rule 7: independent partial sums a lane keeps (loads in flight)
GEMV_COLS_T = 4  # rule 7: columns a workgroup when B is transposed (lanes along K)
GEMV_COLS_N = 16  # rule 7: columns a workgroup otherwise (lanes along N)
TILING = True  # False: every layer keeps wgsl.py's direct kernel (tests and benches compare)
DIRECT = "_direct"  # rule 6's entry point: the kernel's name and this
SOFTWARE = ("llvmpipe", "lavapipe", "swiftshader")


def uses_shared_memory(info: dict) -> bool:
    """Rule 6: whether the adapter described by ``info`` (wgpu's adapter info) runs the
    workgroup-memory path: not on a CPU adapter."""
    if str(info.get("adapter_type", "")).lower() == "cpu":
        return False
    text = " ".join(str(v) for v in info.values()).lower()
    return not any(name in text for name in SOFTWARE)


def entry_point(kernel: str, source: str, shared: bool) -> str:
    """The entry point to run (rule 6): ``<kernel>_direct`` where the adapter does not use
    workgroup memory and the module has one."""
    direct = f"{kernel}{DIRECT}"
    return direct if not shared and f"fn {direct}(" in source else kernel


@dataclass(frozen=True)
class Tile:
    tm: int
    tn: int
    rm: int
    rn: int

    @property
    def ty(self) -> int:
        return self.tm // self.rm

    @property
    def tx(self) -> int:
        return self.tn // self.rn


CANDIDATES = (
    Tile(32, 32, 4, 4),
    Tile(32, 16, 4, 2),
    Tile(16, 32, 2, 4),
    Tile(16, 16, 2, 2),
    Tile(8, 32, 1, 4),
    Tile(32, 8, 4, 1),
    Tile(8, 16, 1, 2),
    Tile(16, 8, 2, 1),
)


def _tiles(m: int, n: int, t: Tile) -> int:
    return -(-m // t.tm) * -(-n // t.tn)


def choose_tile(m: int, n: int, batches: int) -> Tile | None:
    """Rule 4: the tile of an ``m x n`` output repeated ``batches`` times, or None (direct)."""
    if not TILING:
        return None
    best, best_key = None, None
    for t in CANDIDATES:
        tiles = _tiles(m, n, t) * batches
        if tiles * LANES > m * n * batches:
            continue
        eff = m * n / (-(-m // t.tm) * t.tm * -(-n // t.tn) * t.tn)
        key = (tiles >= MIN_WORKGROUPS, eff >= 0.7, t.tm * t.tn, eff)
        if best_key is None or key > best_key:
            best, best_key = t, key
    return best


def k_groups(workgroups: int, kd: int, t: Tile) -> int:
    """Rule 8's lane groups for a tiled layer of ``workgroups`` tiles and depth ``kd``: 1, 2 or
    4 (at most :data:`KSPLIT`), doubling while the layer has fewer than :data:`SPLIT_BELOW`
    workgroups' worth of groups, each group keeps at least :data:`SPLIT_MIN_SLICES` slices,
    and the workgroup memory fits."""
    ks = 1
    while (
        ks < KSPLIT
        and workgroups * ks < SPLIT_BELOW
        and kd >= 2 * ks * TK * SPLIT_MIN_SLICES
        and 4 * max(2 * ks * TK * (t.tm + t.tn), 2 * ks * t.tm * t.tn) <= WORKGROUP_BYTES
    ):
        ks *= 2
    return ks


def entry(kernel: str, workgroups: int, body: str, direct: str | None = None, ks: int = 1) -> str:
    """The entry point of rule 1, and rule 6's ``<kernel>_direct`` where ``direct`` is given;
    a body sees ``wg`` (the workgroup) and ``t`` (the lane), the workgroup-memory body with
    ``ks`` lane groups (rule 8) also ``kg`` (its group)."""
    out = ""
    for name, code, groups in ((kernel, body, ks), (f"{kernel}{DIRECT}", direct, 1)):
        if code is None:
            continue
        lane = (
            "let t = i32(li);" if groups == 1 else f"let kg = i32(li) / {LANES}; let t = i32(li) % {LANES};"
        )
        out += f"""
@compute @workgroup_size({LANES * groups})
fn {name}(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
    let wg = i32(wid.x + wid.y * nwg.x);
    if (wg >= {workgroups}) {{ return; }}
    {lane}
{code}}}
"""
    return out


def _indent(text: str, by: str = "    ") -> str:
    return "".join(f"{by}{ln}\n" if ln.strip() else "\n" for ln in text.strip("\n").splitlines())


def gemm_body(
    t: Tile, load_a: str, load_b: str, store: str, prologue: str, direct: str, ks: int = 1
) -> tuple[str, str, str]:
    """(workgroup declarations, body, rule 6's body) of rule 2's tiled GEMM. ``prologue`` sets ``m0``, ``n0``
    (the tile's origin) and whatever the loads and the store use; ``load_a`` is a statement
    setting ``a`` from ``gm, gk`` (in range), ``load_b`` one setting ``b`` from ``gk, gn``;
    ``store`` is the statements writing ``v`` at ``gm, gn`` (in range). Constants ``M, N, KD``
    are the GEMM's sizes. ``ks > 1``: rule 8's lane groups."""
    head, tail = _block(t, prologue, store)
    accs = [[f"c{i}{j}" for j in range(t.rn)] for i in range(t.rm)]
    if ks > 1:
        decls, lines = _lane_groups(t, load_a, load_b, accs, tail, ks)
    else:
        decls = f"var<workgroup> As: array<f32, {TK * t.tm}>;\nvar<workgroup> Bs: array<f32, {TK * t.tn}>;\n"
        lines = _k_loop(t, load_a, load_b, accs, lambda i: f"As[{i}]", lambda i: f"Bs[{i}]", 1) + tail
    shared = _indent("\n".join(head + lines))
    dt = direct_tile(t)
    dhead, dtail = _block(dt, prologue, store)
    body = [*dhead, f"if (ty < {dt.ty}) {{", _indent(direct), *_indent("\n".join(dtail)).splitlines(), "}"]
    return decls, shared, _indent("\n".join(body))


def _k_loop(t: Tile, load_a: str, load_b: str, accs: list[list[str]], a_at, b_at, ks: int) -> list[str]:
    """Rule 2's K loop: TK-deep slices of A and B staged in workgroup memory (``a_at(i)``,
    ``b_at(i)``: the element at index expression ``i``), a barrier before and after their use;
    with ``ks`` lane groups (rule 8) group ``kg`` takes slices ``kg, kg + ks, ...``, every group
    running the loop the same number of times."""
    lines = [f"for (var k1: i32 = 0; k1 < KD; k1 += {ks * TK}) {{"]
    lines.append(f"    let k0 = k1 + kg * {TK};" if ks > 1 else "    let k0 = k1;")
    # A slice: TM rows x TK deep, lanes along k (weights are contiguous in k)
    lines.append(f"    for (var e: i32 = t; e < {TK * t.tm}; e += {LANES}) {{")
    lines.append(f"        let gm = m0 + e / {TK}; let gk = k0 + e % {TK};")
    lines.append("        var a: f32 = 0.0f;")
    lines.append(f"        if (gm < M && gk < KD) {{ {load_a} }}")
    lines.append(f"        {a_at(f'(e % {TK}) * {t.tm} + e / {TK}')} = a;")
    lines.append("    }")
    # B slice: TK deep x TN columns, lanes along n
    lines.append(f"    for (var e: i32 = t; e < {TK * t.tn}; e += {LANES}) {{")
    lines.append(f"        let gk = k0 + e / {t.tn}; let gn = n0 + e % {t.tn};")
    lines.append("        var b: f32 = 0.0f;")
    lines.append(f"        if (gk < KD && gn < N) {{ {load_b} }}")
    lines.append(f"        {b_at('e')} = b;")
    lines.append("    }")
    lines.append("    workgroupBarrier();")
    lines.append(f"    for (var kk: i32 = 0; kk < {TK}; kk++) {{")
    lines += [f"        let a{i} = {a_at(f'kk * {t.tm} + ty + {i * t.ty}')};" for i in range(t.rm)]
    lines += [f"        let b{j} = {b_at(f'kk * {t.tn} + tx + {j * t.tx}')};" for j in range(t.rn)]
    lines += [f"        {accs[i][j]} += a{i} * b{j};" for i in range(t.rm) for j in range(t.rn)]
    lines.append("    }")
    lines.append("    workgroupBarrier();")
    lines.append("}")
    return lines


def _lane_groups(
    t: Tile, load_a: str, load_b: str, accs: list[list[str]], tail: list[str], ks: int
) -> tuple[str, list[str]]:
    """Rule 8: the workgroup memory and the body of ``ks`` lane groups sharing one tile's K
    loop; group 0 adds the others' sums in group order and stores (``tail``)."""
    slab = TK * (t.tm + t.tn)  # one group's A and B slices
    decls = f"var<workgroup> Sh: array<f32, {max(ks * slab, (ks - 1) * t.tm * t.tn)}>;\n"
    lines = [f"let sa = kg * {slab}; let sb = sa + {TK * t.tm};"]
    lines += _k_loop(t, load_a, load_b, accs, lambda i: f"Sh[sa + {i}]", lambda i: f"Sh[sb + {i}]", ks)
    # groups 1..ks-1 leave their sums for group 0 (the loop's last barrier ended every read)
    place = [f"(ty + {i * t.ty}) * {t.tn} + tx + {j * t.tx}" for i in range(t.rm) for j in range(t.rn)]
    lines.append("if (kg > 0) {")
    lines.append(f"    let so = (kg - 1) * {t.tm * t.tn};")
    lines += [f"    Sh[so + {q}] = {accs[i][j]};" for (i, j), q in zip(_pairs(t), place)]
    lines.append("}")
    lines.append("workgroupBarrier();")
    lines.append("if (kg == 0) {")
    for g in range(1, ks):
        lines += [
            f"    {accs[i][j]} = {accs[i][j]} + Sh[{(g - 1) * t.tm * t.tn} + {q}];"
            for (i, j), q in zip(_pairs(t), place)
        ]
    lines += [f"    {ln}" for ln in tail]
    lines.append("}")
    return decls, lines


def _pairs(t: Tile) -> list[tuple[int, int]]:
    return [(i, j) for i in range(t.rm) for j in range(t.rn)]


def direct_tile(t: Tile) -> Tile:
    """Rule 6's register block: the tile's, :data:`DIRECT_FOLD` times as many rows, so that
    ``64 / DIRECT_FOLD`` invocations of the workgroup compute its whole tile (the others return)."""
    fold = DIRECT_FOLD if t.ty % DIRECT_FOLD == 0 else 1
    return Tile(t.tm, t.tn, t.rm * fold, t.rn)


def _block(t: Tile, prologue: str, store: str) -> tuple[list[str], list[str]]:
    """The head (origin, lane place, accumulators ``c<i><j>``, rows ``gm<i>``, columns
    ``gn<j>``) and the tail (the stores) of an ``RM x RN`` register block of tile ``t``."""
    head = [prologue.strip("\n"), f"let tx = t % {t.tx}; let ty = t / {t.tx};"]
    head += [f"var c{i}{j}: f32 = 0.0f;" for i in range(t.rm) for j in range(t.rn)]
    head += [f"let gm{i} = m0 + ty + {i * t.ty};" for i in range(t.rm)]
    head += [f"let gn{j} = n0 + tx + {j * t.tx};" for j in range(t.rn)]
    tail = [
        f"if (gm{i} < M && gn{j} < N) {{ let gm = gm{i}; let gn = gn{j}; let v = c{i}{j}; {store} }}"
        for i in range(t.rm)
        for j in range(t.rn)
    ]
    return head, tail


def gemv_body(
    rows: int, cw: int, trans_b: bool, load_a: str, load_b: str, store: str
) -> tuple[str, str, str]:
    """(workgroup declarations, body, rule 6's body) of rule 7 for ``rows`` rows (< GEMV_ROWS), ``cw`` columns a
    workgroup. ``load_a`` is an expression of ``kk`` with ``{r}`` for the row (A's element), ``load_b`` one of
    ``kk, col``; ``store`` the statements writing ``v`` at ``row, col`` (in range)."""
    kl = LANES // cw
    decls = f"var<workgroup> Red: array<f32, {LANES * rows}>;\n"
    if trans_b:  # lanes along K: neighbouring invocations read neighbouring words of a row of B
        place = f"let c = t / {kl}; let l = t % {kl};"
    else:
        place = f"let c = t % {cw}; let l = t / {cw};"
    lines = [place, f"let col = wg * {cw} + c;"]
    u = max(1, GEMV_UNROLL)  # independent sums a lane keeps: loads in flight (rule 7)
    lines += [f"var s{r}_{q}: f32 = 0.0f;" for r in range(rows) for q in range(u)]
    lines.append("if (col < N) {")
    lines.append(f"    for (var k0: i32 = l; k0 < KD; k0 += {kl * u}) {{")
    for q in range(u):
        lines.append(f"        {{ let kk = k0 + {q * kl}; if (kk < KD) {{")
        lines.append(f"            let bv = f32({load_b});")
        lines += [f"            s{r}_{q} += f32({load_a.replace('{r}', str(r))}) * bv;" for r in range(rows)]
        lines.append("        } }")
    lines.append("    }")
    lines.append("}")
    for r in range(rows):
        lines.append(f"let s{r} = {' + '.join(f's{r}_{q}' for q in range(u))};")
    lines += [f"Red[{r * LANES} + c * {kl} + l] = s{r};" for r in range(rows)]
    lines.append("workgroupBarrier();")
    s = kl // 2
    while s >= 1:
        lines.append(f"if (l < {s}) {{")
        lines += [
            f"    Red[{r * LANES} + c * {kl} + l] += Red[{r * LANES} + c * {kl} + l + {s}];"
            for r in range(rows)
        ]
        lines.append("}")
        lines.append("workgroupBarrier();")
        s //= 2
    lines.append("if (l == 0 && col < N) {")
    for r in range(rows):
        lines.append(f"    {{ let row = {r}; let v = Red[{r * LANES} + c * {kl}]; {store} }}")
    lines.append("}")
    direct = [f"let col = wg * {cw} + t;", "if (t < " + str(cw) + " && col < N) {"]
    direct += [f"    var s{r}: f32 = 0.0f;" for r in range(rows)]
    direct.append("    for (var kk: i32 = 0; kk < KD; kk++) {")
    direct.append(f"        let bv = f32({load_b});")
    direct += [f"        s{r} += f32({load_a.replace('{r}', str(r))}) * bv;" for r in range(rows)]
    direct.append("    }")
    direct += [f"    {{ let row = {r}; let v = s{r}; {store} }}" for r in range(rows)]
    direct.append("}")
    return decls, _indent("\n".join(lines)), _indent("\n".join(direct))


def gemv_columns(n: int, trans_b: bool) -> int:
    """Rule 7's columns a workgroup: along-K lanes (B transposed) favour few columns, along-N
    lanes many; fewer when that leaves too few workgroups."""
    cw = GEMV_COLS_T if trans_b else GEMV_COLS_N
    while cw > 1 and -(-n // cw) < MIN_WORKGROUPS:
        cw //= 2
    return cw


# -- lowering -------------------------------------------------------------------------------


def _module(
    ctx,
    kernel: str,
    reads: list[str],
    decls: str,
    constants: dict[str, int],
    workgroups: int,
    body: str,
    direct: str,
    ks: int = 1,
) -> str:
    from mconv.targets.webgpu.wgsl import HEADER_F16, HEADER_F32, PRELUDE, consts

    header = HEADER_F16 if ctx.storage == "half" else HEADER_F32
    binds = [
        f"@group(0) @binding({i}) var<storage, read> {name}: array<T>;\n" for i, name in enumerate(reads)
    ]
    binds.append(f"@group(0) @binding({len(reads)}) var<storage, read_write> Y: array<T>;\n")
    return (
        header
        + PRELUDE
        + "\n"
        + consts(constants)
        + decls
        + "".join(binds)
        + entry(kernel, workgroups, body, direct, ks)
    )


def _grid(workgroups: int) -> tuple[int, int, int]:
    return (LANES, workgroups, 1)


def lower_conv_tiled(ctx, node, kernel: str, act):
    """Rule 3: a grouped or plain convolution as an implicit GEMM; None where rule 3 or 4
    keeps the direct kernel."""
    from mconv.targets.gpu.params.conv import spatial_params
    from mconv.targets.webgpu.wgsl import KernelSource, activation_expr, inp, outp

    x, w = inp(node, 0), inp(node, 1)
    b = node.inputs[2] if len(node.inputs) > 2 else None
    xs, ws, ys = ctx.shape(x), ctx.shape(w), ctx.shape(outp(node))
    (ih, iw), (oh, ow), (kh, kw), (sh, sw), (dh, dw), (ph, pw) = spatial_params(node, xs, ys, ws[2:])
    group = node.attributes.get_int("group", 1)
    n, c, oc = xs[0], xs[1], ys[1]
    icg, ocg = c // group, oc // group
    kd = icg * kh * kw
    if icg == 1 and ocg == 1 or kd < 4:
        return None  # depthwise: the direct kernel
    p = oh * ow
    tile = choose_tile(ocg, p, n * group)
    if tile is None:
        return None
    mt, nt = -(-ocg // tile.tm), -(-p // tile.tn)
    workgroups = mt * nt * n * group
    reads, names = [x, w], ["X", "W"]
    if b is not None:
        reads.append(b)
        names.append("B")
    prologue = f"""
let pt = wg % {nt}; let mt = (wg / {nt}) % {mt}; let ng = wg / {nt * mt};
let g = ng % {group}; let img = ng / {group};
let m0 = mt * {tile.tm}; let n0 = pt * {tile.tn};
let xbase = (img * IC + g * ICG) * IH * IW;
let wbase = g * OCG * KD;
"""
    pointwise = kh == kw == 1 and ph == pw == 0
    if pointwise and sh == sw == 1:
        load_a = "a = f32(W[wbase + gm * KD + gk]);"
        load_b = "b = f32(X[xbase + gk * IH * IW + gn]);"
    elif pointwise:
        load_a = "a = f32(W[wbase + gm * KD + gk]);"
        load_b = "b = f32(X[xbase + gk * IH * IW + (gn / OW) * SH * IW + (gn % OW) * SW]);"
    else:  # rule 3's depth order: kernel tap, then input channel
        load_a = "a = f32(W[wbase + gm * KD + (gk % ICG) * KH * KW + gk / ICG]);"
        load_b = (
            "let ic = gk % ICG; let r = gk / ICG; let oy = gn / OW; let ox = gn % OW; "
            "let iy = oy * SH - PH + (r / KW) * DH; let ix = ox * SW - PW + (r % KW) * DW; "
            "if (iy >= 0 && iy < IH && ix >= 0 && ix < IW) { b = f32(X[xbase + (ic * IH + iy) * IW + ix]); }"
        )
    bias = " + f32(B[oc])" if b is not None else ""
    store = f"let oc = g * OCG + gm; let o = v{bias}; Y[(img * OC + oc) * {p} + gn] = T({activation_expr(act, 'o')});"
    ks = k_groups(workgroups, kd, tile)
    decls, body, direct = gemm_body(
        tile, load_a, load_b, store, prologue, _direct_conv(direct_tile(tile), pointwise, sh == sw == 1), ks
    )
    cs = dict(IC=c, IH=ih, IW=iw, OC=oc, OW=ow, KH=kh, KW=kw, SH=sh, SW=sw, DH=dh, DW=dw, PH=ph, PW=pw)
    cs.update(ICG=icg, OCG=ocg, KD=kd, M=ocg, N=p)
    grid = _grid(workgroups)
    module = _module(ctx, kernel, names, decls, cs, workgroups, body, direct, ks)
    return KernelSource(kernel, module, reads, grid)


def lower_softmax_rows(ctx, node, kernel: str, outer: int, size: int, inner: int):
    """Rule 9: Softmax / LogSoftmax with a workgroup a row; None where the row is short."""
    from mconv.targets.webgpu.wgsl import LOWEST, KernelSource, inp

    if not TILING or size < SOFTMAX_ROW:
        return None
    rows = outer * inner
    out = "tv - m - log(total)" if node.op_type == "LogSoftmax" else "exp(tv - m) / total"

    def tree(op: str) -> list[str]:  # rule 9's fixed-order reduction of Red[0..LANES)
        lines, s = [], LANES // 2
        while s >= 1:
            lines += [
                f"if (t < {s}) {{ Red[t] = {op.format(a='Red[t]', b=f'Red[t + {s}]')}; }}",
                "workgroupBarrier();",
            ]
            s //= 2
        return lines

    x = "f32(X[base + j * INNER])"
    lines = ["let o = wg / INNER; let ii = wg % INNER; let base = o * SIZE * INNER + ii;"]
    lines += [
        f"var mx: f32 = {LOWEST};",
        f"for (var j: i32 = t; j < SIZE; j += {LANES}) {{ mx = max(mx, {x}); }}",
    ]
    lines += [
        "Red[t] = mx;",
        "workgroupBarrier();",
        *tree("max({a}, {b})"),
        "let m = Red[0];",
        "workgroupBarrier();",
    ]
    lines += [
        "var sum: f32 = 0.0f;",
        f"for (var j: i32 = t; j < SIZE; j += {LANES}) {{ sum += exp({x} - m); }}",
    ]
    lines += ["Red[t] = sum;", "workgroupBarrier();", *tree("{a} + {b}"), "let total = Red[0];"]
    lines += [
        f"for (var j: i32 = t; j < SIZE; j += {LANES}) {{ let tv = {x}; Y[base + j * INNER] = T({out}); }}"
    ]
    direct = [
        "if (t == 0) {",
        "    let o = wg / INNER; let ii = wg % INNER; let base = o * SIZE * INNER + ii;",
    ]
    direct += [
        f"    var m: f32 = {LOWEST};",
        f"    for (var j: i32 = 0; j < SIZE; j++) {{ m = max(m, {x}); }}",
    ]
    direct += [
        "    var total: f32 = 0.0f;",
        f"    for (var j: i32 = 0; j < SIZE; j++) {{ total += exp({x} - m); }}",
    ]
    direct += [
        f"    for (var j: i32 = 0; j < SIZE; j++) {{ let tv = {x}; Y[base + j * INNER] = T({out}); }}",
        "}",
    ]
    decls = f"var<workgroup> Red: array<f32, {LANES}>;\n"
    module = _module(
        ctx,
        kernel,
        ["X"],
        decls,
        dict(SIZE=size, INNER=inner),
        rows,
        _indent("\n".join(lines)),
        _indent("\n".join(direct)),
    )
    return KernelSource(kernel, module, [inp(node, 0)], _grid(rows))


def lower_gemm_tiled(
    ctx,
    node,
    kernel: str,
    act,
    m: int,
    n: int,
    k: int,
    ta: int,
    tb: int,
    alpha: float,
    bias_read,
    beta: float,
    sr: int | None,
    sc: int | None,
):
    """Rules 2 and 7 for a 2-D Gemm/MatMul; None where the direct kernel stays (rule 4)."""
    from mconv.targets.gpu.ops import flit
    from mconv.targets.webgpu.wgsl import KernelSource, activation_expr, inp

    a, bm = inp(node, 0), inp(node, 1)
    reads, names = [a, bm], ["A", "B"]
    if sr is not None:
        reads.append(bias_read)
        names.append("C")
    scale = "" if alpha == 1.0 else f"{flit(alpha)} * "
    bias = "" if sr is None else f" + {flit(beta)} * f32(C[row * {sr} + col * {sc}])"
    store = f"let o = {scale}v{bias}; Y[row * N + col] = T({activation_expr(act, 'o')});"
    cs = dict(M=m, N=n, KD=k)
    if m < GEMV_ROWS:
        if k < LANES or not TILING:
            return None
        cw = gemv_columns(n, bool(tb))
        workgroups = -(-n // cw)
        if workgroups * LANES > LANES * m * n:
            return None
        a_el = "A[kk * M + {r}]" if ta else "A[{r} * KD + kk]"
        b_el = "B[col * KD + kk]" if tb else "B[kk * N + col]"
        decls, body, direct = gemv_body(m, cw, bool(tb), a_el, b_el, store)
        module = _module(ctx, kernel, names, decls, cs, workgroups, body, direct)
        return KernelSource(kernel, module, reads, _grid(workgroups))
    tile = choose_tile(m, n, 1)
    if tile is None or k < 4:
        return None
    mt, nt = -(-m // tile.tm), -(-n // tile.tn)
    workgroups = mt * nt
    prologue = f"let pt = wg % {nt}; let mt = wg / {nt}; let m0 = mt * {tile.tm}; let n0 = pt * {tile.tn};"
    load_a = f"a = f32(A[{'gk * M + gm' if ta else 'gm * KD + gk'}]);"
    load_b = f"b = f32(B[{'gn * KD + gk' if tb else 'gk * N + gn'}]);"
    direct = _direct_gemm(
        direct_tile(tile),
        "A[k * M + @r]" if ta else "A[@r * KD + k]",
        "B[@c * KD + k]" if tb else "B[k * N + @c]",
    )
    ks = k_groups(workgroups, k, tile)
    decls, body, direct = gemm_body(
        tile, load_a, load_b, "let row = gm; let col = gn; " + store, prologue, direct, ks
    )
    module = _module(ctx, kernel, names, decls, cs, workgroups, body, direct, ks)
    return KernelSource(kernel, module, reads, _grid(workgroups))


def _direct_gemm(t: Tile, a_el: str, b_el: str) -> str:
    """Rule 6's loop for a matrix product: ``a_el`` of ``r`` (a clamped row) and ``k``,
    ``b_el`` of ``k`` and ``c`` (a clamped column)."""
    lines = [f"let r{i} = min(gm{i}, M - 1);" for i in range(t.rm)]
    lines += [f"let q{j} = min(gn{j}, N - 1);" for j in range(t.rn)]
    lines.append("for (var k: i32 = 0; k < KD; k++) {")
    lines += [f"    let a{i} = f32({a_el.replace('@r', f'r{i}')});" for i in range(t.rm)]
    lines += [f"    let b{j} = f32({b_el.replace('@c', f'q{j}')});" for j in range(t.rn)]
    lines += [f"    c{i}{j} += a{i} * b{j};" for i in range(t.rm) for j in range(t.rn)]
    lines.append("}")
    return "\n".join(lines)


def _direct_conv(t: Tile, pointwise: bool, unit_stride: bool) -> str:
    """Rule 6's loop for a convolution, in rule 3's depth order (kernel tap, then input
    channel): a tap's input offsets and padding tests are computed once for all its channels,
    padding read as zero."""
    lines = [f"let wr{i} = wbase + min(gm{i}, M - 1) * KD;" for i in range(t.rm)]
    if pointwise:
        for j in range(t.rn):
            lines.append(f"let q{j} = min(gn{j}, N - 1);")
            if not unit_stride:
                lines.append(f"let s{j} = (q{j} / OW) * SH * IW + (q{j} % OW) * SW;")
        lines.append("for (var k: i32 = 0; k < KD; k++) {")
        lines.append("    let xc = xbase + k * IH * IW;")
        lines += [f"    let a{i} = f32(W[wr{i} + k]);" for i in range(t.rm)]
        lines += [f"    let b{j} = f32(X[xc + {'q' if unit_stride else 's'}{j}]);" for j in range(t.rn)]
        lines += [f"    c{i}{j} += a{i} * b{j};" for i in range(t.rm) for j in range(t.rn)]
        lines.append("}")
        return "\n".join(lines)
    for j in range(t.rn):
        lines.append(f"let y{j} = (gn{j} / OW) * SH - PH; let x{j} = (gn{j} % OW) * SW - PW;")
    lines.append("for (var kh: i32 = 0; kh < KH; kh++) {")
    lines.append("    for (var kw: i32 = 0; kw < KW; kw++) {")
    lines.append("        let r = kh * KW + kw;")
    for j in range(t.rn):
        lines.append(
            f"        let iy{j} = y{j} + kh * DH; let ix{j} = x{j} + kw * DW; "
            f"let in{j} = iy{j} >= 0 && iy{j} < IH && ix{j} >= 0 && ix{j} < IW && gn{j} < N; "
            f"let p{j} = xbase + select(0, iy{j} * IW + ix{j}, in{j});"
        )
    lines.append("        for (var ic: i32 = 0; ic < ICG; ic++) {")
    lines.append("            let xo = ic * IH * IW; let wo = ic * KH * KW + r;")
    lines += [f"            let a{i} = f32(W[wr{i} + wo]);" for i in range(t.rm)]
    lines += [f"            let b{j} = select(0.0f, f32(X[p{j} + xo]), in{j});" for j in range(t.rn)]
    lines += [f"            c{i}{j} += a{i} * b{j};" for i in range(t.rm) for j in range(t.rn)]
    lines.append("        }")
    lines.append("    }")
    lines.append("}")
    return "\n".join(lines)
