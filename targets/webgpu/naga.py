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
2. :func:`check_bundle` checks every kernel of a webgpu bundle as the bundle ships it (the f16
   header where the plan stores half).
3. Failures of the checker itself (no node, no naga, a node crash, a timeout) are one-line
   InputErrors; a kernel naga refuses is a result, not an exception.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mconv.bundle import Bundle, load_bundle
from mconv.errors import InputError

__all__ = ["NAGA_PACKAGE", "KernelCheck", "check_bundle", "check_sources", "find_naga", "install_command"]

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
    """naga's verdict on every kernel of a webgpu bundle, as shipped (rule 2), in plan order."""
    from mconv.targets.webgpu import NAME, kernel_path, read_plan

    if not isinstance(bundle, Bundle):
        bundle = load_bundle(bundle)
    label = str(bundle.root)
    if bundle.target != NAME:
        raise InputError(f"bundle is for target '{bundle.target}', not '{NAME}'", path=label, hint="")
    plan = read_plan(bundle)
    sources: dict[str, str] = {}
    for layer in plan.layers:
        try:
            sources[layer.kernel] = bundle.read_bytes(kernel_path(layer.kernel)).decode()
        except UnicodeDecodeError:
            raise InputError(
                "kernel is not UTF-8 text",
                path=label,
                where=kernel_path(layer.kernel),
                hint="re-export the bundle",
            ) from None
    return check_sources(sources, naga, label)
