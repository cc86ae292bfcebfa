"""Check a webgpu bundle's WGSL kernels with naga, wgpu's own shader translator.

naga (https://github.com/gfx-rs/wgpu/tree/trunk/naga) is the WGSL front end wgpu uses and the
translator that runs WGSL on Metal (WGSL -> MSL) and Vulkan (WGSL -> SPIR-V). Here it is the npm
package ``naga-wasm`` (naga compiled to WebAssembly), loaded from ``node``. Nothing is installed
at run time: :func:`find_naga` looks for an install made beforehand with
``npm install --prefix DIR naga-wasm@30.1.0`` (:func:`install_command`), in ``$MCONV_CACHE/naga``
or ``~/.cache/mconv/naga``.

Rules:

1. :func:`check_sources` sends every kernel to one ``node`` process. Each kernel is parsed
   (naga's WGSL front end), validated (naga's validator: types, uniformity, bindings, the
   capabilities ``enable f16`` asks for) and written as MSL and SPIR-V. A kernel that fails any
   step carries the step (``parse``, ``validation``, ``write``) and naga's message.
2. :func:`check_bundle` checks every kernel of a webgpu bundle (the f16 header where the plan
   stores half) as mconv regenerates it from the bundle's graph, the shipped modules checked
   identical (:func:`mconv.targets.webgpu.regenerate`): no shipped text reaches naga or a
   compiler.
3. :func:`msl_runner` runs naga's MSL on the CPU: every translated kernel goes, each in its own
   C++ namespace, through the Metal target's C++ shim (``targets/metal/metal_shim.h`` plus
   :data:`SHIM_EXTRAS`, the few more Metal names naga's output uses) and the Metal harness's
   runner (:mod:`mconv.targets.metal.harness`), one adapter per kernel mapping the harness's grid
   point to the workgroup ids and counts the WGSL kernel reads. Runtime-sized arrays (naga
   writes ``T[1]`` references) become pointers. Its outputs are compared with the Metal target's
   own MSL run through the same harness (tests/targets/webgpu/test_naga.py).
4. Failures of the checker itself (no node, no naga, a node crash, a timeout) are one-line
   InputErrors; a kernel naga refuses is a result, not an exception.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from mconv.bundle import Bundle, load_bundle
from mconv.errors import InputError
from mconv.targets.gpu.plan import GpuPlan
from mconv.targets.metal.harness import HarnessRunner, compile_harness
from mconv.targets.webgpu.tiled import DIRECT
from mconv.targets.webgpu.wgsl import WORKGROUP, dispatch_size

__all__ = [
    "NAGA_PACKAGE",
    "KernelCheck",
    "check_bundle",
    "check_sources",
    "find_naga",
    "install_command",
    "every_layer",
    "metal_runner",
    "msl_runner",
]

NAGA_PACKAGE = "naga-wasm@30.1.0"

# The node side: read [{name, source}] as JSON on stdin, write one result per kernel as JSON.
_SCRIPT = r"""
import { pathToFileURL } from "node:url";
const naga = await import(pathToFileURL(process.argv[1]).href);
let text = "";
for await (const chunk of process.stdin) text += chunk;
const out = [];
for (const { name, source } of JSON.parse(text)) {
  const r = { name, ok: false, stage: "parse", error: "", msl: "", spirv_words: 0 };
  let module = null, info = null;
  try {
    module = naga.parseWgsl(source);
    r.stage = "validation";
    info = naga.validate(module);
    r.stage = "write";
    r.msl = naga.writeMsl(module, info, { langVersion: [2, 4] });
    r.spirv_words = naga.writeSpirv(module, info).length;
    r.ok = true;
    r.stage = "";
  } catch (e) {
    r.error = String((e && (e.formatted || e.message)) || e);
  } finally {
    if (info) info.free();
    if (module) module.free();
  }
  out.push(r);
}
process.stdout.write(JSON.stringify({ version: naga.nagaVersion, kernels: out }));
"""


@dataclass
class KernelCheck:
    """What naga made of one kernel."""

    name: str
    ok: bool
    stage: str  # the step that failed: "parse", "validation", "write"; "" when ok
    error: str
    msl: str  # naga's MSL translation ("" when not ok)
    spirv_words: int  # length of naga's SPIR-V translation in 32-bit words
    naga_version: str = ""


def cache_dir() -> Path:
    """Where the naga install is looked for: ``$MCONV_CACHE/naga`` or ``~/.cache/mconv/naga``."""
    base = os.environ.get("MCONV_CACHE") or str(Path.home() / ".cache" / "mconv")
    return Path(base) / "naga"


def install_command(prefix: Path | None = None) -> list[str]:
    """The npm command that installs naga-wasm where :func:`find_naga` looks (run by tests, CI)."""
    return ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(prefix or cache_dir()), NAGA_PACKAGE]


def find_naga(prefix: Path | None = None) -> Path | None:
    """naga-wasm's node entry point under ``prefix`` (default :func:`cache_dir`), or None."""
    entry = (prefix or cache_dir()) / "node_modules" / "naga-wasm" / "dist" / "node.js"
    return entry if entry.is_file() else None


def check_sources(
    sources: Mapping[str, str],
    naga: Path | None = None,
    label: str = "kernels",
    timeout: float = 300.0,
) -> dict[str, KernelCheck]:
    """Kernel name -> naga's verdict on its WGSL source (rule 1)."""
    node = shutil.which("node")
    hint = f"install node and `{' '.join(install_command())}`"
    if node is None:
        raise InputError("node is not installed; naga cannot run", path=label, hint=hint)
    entry = naga or find_naga()
    if entry is None:
        raise InputError(f"naga-wasm is not installed under {cache_dir()}", path=label, hint=hint)
    request = json.dumps([{"name": k, "source": v} for k, v in sources.items()])
    try:
        proc = subprocess.run(
            [node, "--input-type=module", "-e", _SCRIPT, str(entry)],
            input=request,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise InputError(f"naga did not finish within {timeout:.0f} s", path=label, hint=hint) from None
    try:
        if proc.returncode != 0:
            raise ValueError(proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"])
        answer = json.loads(proc.stdout)
        version = str(answer["version"])
        results = {
            r["name"]: KernelCheck(
                str(r["name"]),
                bool(r["ok"]),
                str(r["stage"]) if not r["ok"] else "",
                str(r["error"]),
                str(r["msl"]),
                int(r["spirv_words"]),
                version,
            )
            for r in answer["kernels"]
        }
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"naga failed: {str(exc)[:120]}", path=label, hint=hint) from None
    if set(results) != set(sources):
        raise InputError("naga answered for other kernels than asked", path=label, hint=hint)
    return results


def check_bundle(bundle: Bundle | str | os.PathLike, naga: Path | None = None) -> dict[str, KernelCheck]:
    """naga's verdict on every kernel of a webgpu bundle (rule 2), in plan order."""
    from mconv.targets.webgpu import NAME, regenerate

    if not isinstance(bundle, Bundle):
        bundle = load_bundle(bundle)
    label = str(bundle.root)
    if bundle.target != NAME:
        raise InputError(f"bundle is for target '{bundle.target}', not '{NAME}'", path=label, hint="")
    _, sources, _ = regenerate(bundle, label)
    return check_sources(sources, naga, label)


# The Metal names naga's MSL uses that metal_shim.h (written for the Metal target's kernels) lacks.
SHIM_EXTRAS = r"""
#include <cstring>
struct bool2 {
    bool x, y;
};
struct uint2 {
    uint x, y;
    uint2(uint v) : x(v), y(v) {}
    uint2(uint a, uint b) : x(a), y(b) {}
    uint2 &operator-=(const uint2 &o) { x -= o.x; y -= o.y; return *this; }
    bool2 operator==(const uint2 &o) const { return bool2{x == o.x, y == o.y}; }
};
namespace metal {
using ::uint;
using ::uint3;
inline bool all(bool2 b) { return b.x && b.y; }
template <class T> inline T select(T a, T b, bool c) { return c ? b : a; }
inline float fmod(double x, double y) { return std::fmod(float(x), float(y)); }
}  // namespace metal
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wliteral-suffix"
inline half operator""h(long double v) { return half(v); }
inline half operator""h(unsigned long long v) { return half(v); }
#pragma GCC diagnostic pop
"""  # as_type<T>(x) comes from metal_shim.h

_TYPEDEF_RE = re.compile(r"typedef (\w+) (type_\d+)\[1\];")
_ENTRY_RE = re.compile(r"kernel void (\w+)\(\s*(.*?)\)\s*\{", re.S)
_WGSL_BINDING_RE = re.compile(r"@binding\((\d+)\)\s*var<[^>]*>\s*(\w+)")


def _block_end(text: str, start: int) -> int:
    """The index just past the ``}`` that closes the ``{`` at ``start``."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    raise ValueError("an entry point of naga's MSL does not close")


def _shim_kernel(index: int, kernel: str, wgsl: str, msl: str, storage: str, grid: list[int]) -> str:
    """naga's MSL for one kernel in namespace ``nagaN`` plus the harness-shaped adapter."""
    body = "\n".join(ln for ln in msl.splitlines() if not ln.startswith("#include"))
    for elem, name in _TYPEDEF_RE.findall(body):
        body = body.replace(f"device {name} const& ", f"device const {elem}* ")
        body = body.replace(f"device {name}& ", f"device {elem}* ")
    entries = list(_ENTRY_RE.finditer(body))
    # a tiled module's per-invocation entry (tiled rule 6): the harness runs invocations one by
    # one, without workgroup memory or barriers, as a software adapter does
    entry = next((e for e in entries if e.group(1).endswith(DIRECT)), entries[0] if entries else None)
    if entry is None:
        raise ValueError(f"no entry point in naga's MSL for {kernel}")
    if len(entries) > 1:  # the others (workgroup memory, barriers) are not compiled
        chosen = entry.group(1)
        for other in reversed([e for e in entries if e.group(1) != chosen]):
            body = body[: other.start()] + body[_block_end(body, other.end() - 1) :]
        entry = next(e for e in _ENTRY_RE.finditer(body) if e.group(1) == chosen)
    binding = {name: int(i) for i, name in _WGSL_BINDING_RE.findall(wgsl)}
    args: list[str] = []
    sizes = ""
    for param in (p.strip() for p in entry.group(2).split(",")):
        name = re.sub(r"\s*\[\[.*\]\]$", "", param).split()[-1].lstrip("*&")
        if "thread_position_in_grid" in param:
            args.append("id")
        elif "threadgroups_per_grid" in param:
            args.append("nwg")
        elif "threadgroup_position_in_grid" in param:
            args.append(f"uint3{{id.x / {WORKGROUP}u, id.y, 0u}}")
        elif "thread_index_in_threadgroup" in param:
            args.append(f"id.x % {WORKGROUP}u")
        elif name == "_buffer_sizes":
            sizes = f"nagak{index}::_mslBufferSizes sizes = {{}};"
            args.append("sizes")
        else:
            b = binding.get(name, binding.get(name.rstrip("_")))
            if b is None:
                raise ValueError(f"parameter {name} of {kernel} is no WGSL binding")
            args.append(f"b{b}")
    body = body.replace("kernel void ", "void ")
    nb = len(binding)
    params = ", ".join(
        f"device {'' if i == nb - 1 else 'const '}{storage}* b{i} [[buffer({i})]]" for i in range(nb)
    )
    gx, gy, gz = grid
    wx, wy, _ = dispatch_size(grid)
    return "\n".join(
        [
            f"namespace nagak{index} {{",
            body,
            "}",
            f"kernel void {kernel}({params}, uint3 gid [[thread_position_in_grid]]) {{",
            f"    const uint lin = gid.x + {gx}u * (gid.y + {gy}u * gid.z);",
            f"    const uint3 id = uint3{{lin % {wx * WORKGROUP}u, lin / {wx * WORKGROUP}u, 0u}};",
            f"    const uint3 nwg = uint3{{{wx}u, {wy}u, 1u}};",
            f"    {sizes}",
            f"    nagak{index}::{entry.group(1)}({', '.join(args)});",
            "}",
        ]
    )


def shim_source(plan: GpuPlan, wgsl: Mapping[str, str], checks: Mapping[str, KernelCheck]) -> str:
    """One C++ translation unit with naga's MSL of every kernel, as the Metal harness compiles it."""
    storage = plan.dtype
    parts = ["#include <metal_stdlib>", SHIM_EXTRAS]
    for i, layer in enumerate(plan.layers):
        parts.append(
            _shim_kernel(i, layer.kernel, wgsl[layer.kernel], checks[layer.kernel].msl, storage, layer.grid)
        )
    return "\n".join(parts) + "\n"


def read_webgpu_plan(bundle: Bundle) -> GpuPlan:
    """The webgpu bundle's plan (:func:`mconv.targets.webgpu.read_plan`)."""
    from mconv.targets.webgpu import read_plan

    return read_plan(bundle)


def every_layer(plan: GpuPlan) -> GpuPlan:
    """``plan`` with every buffer a layer writes as an output (named by the buffer), so a run
    returns each layer's result (the last writer's, where several layers write one buffer)."""
    written = dict.fromkeys(layer.bindings[-1] for layer in plan.layers)
    outputs = [{"name": plan.buffers[b].name, "buffer": b, "shape": [plan.buffers[b].count]} for b in written]
    return replace(plan, outputs=outputs)


def _runner(
    plan: GpuPlan, source: str, bundle: Bundle, weights: Mapping[str, np.ndarray], probe: bool
) -> HarnessRunner:
    label = str(bundle.root)
    if probe:
        plan = every_layer(plan)
    exe = compile_harness(plan, source, label, threads_per_element=WORKGROUP)  # as the webgpu runner
    outputs = [o["name"] for o in plan.outputs] if probe else [o.name for o in bundle.outputs]
    dtypes = {} if probe else {o.name: o.dtype for o in bundle.outputs}
    return HarnessRunner(plan, exe, weights, bundle.inputs, outputs, label, output_dtypes=dtypes)


def metal_runner(bundle: Bundle | str | os.PathLike, probe: bool = False) -> HarnessRunner:
    """The Metal target's own runner for a metal bundle (its kernels as mconv regenerates them);
    with ``probe``, every layer's result."""
    from mconv.targets.metal import NAME, regenerate

    if not isinstance(bundle, Bundle):
        bundle = load_bundle(bundle)
    if bundle.target != NAME:
        raise InputError(
            f"bundle is for target '{bundle.target}', not '{NAME}'", path=str(bundle.root), hint=""
        )
    plan, kernels, weights = regenerate(bundle, str(bundle.root))
    return _runner(plan, kernels, bundle, weights, probe)


def msl_runner(
    bundle: Bundle | str | os.PathLike, naga: Path | None = None, probe: bool = False
) -> HarnessRunner:
    """A runner for a webgpu bundle that runs naga's MSL translation on the CPU (rule 3); with
    ``probe``, every layer's result (:func:`every_layer`)."""
    from mconv.targets.webgpu import kernel_path, regenerate

    if not isinstance(bundle, Bundle):
        bundle = load_bundle(bundle)
    label = str(bundle.root)
    checks = check_bundle(bundle, naga)
    bad = [k for k, r in checks.items() if not r.ok]
    if bad:
        r = checks[bad[0]]
        raise InputError(
            f"naga refuses kernel {bad[0]} ({r.stage}: {r.error.splitlines()[0][:120] if r.error else ''})",
            path=label,
            where=kernel_path(bad[0]),
            hint="re-export the bundle",
        )
    plan, wgsl, weights = regenerate(bundle, label)
    try:
        source = shim_source(plan, wgsl, checks)
    except ValueError as exc:
        raise InputError(str(exc), path=label, hint="naga's MSL changed shape; update naga.py") from None
    return _runner(plan, source, bundle, weights, probe)
