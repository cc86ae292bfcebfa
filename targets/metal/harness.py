"""The Linux harness: run a metal bundle's kernels on the CPU, driven by its plan.

No Metal compiler runs on Linux, so ``kernels.metal`` is compiled as C++17 against
``metal_shim.h`` (standing in for ``<metal_stdlib>``) together with a runner generated from
``metal_plan.json``. The runner does what the Swift host does, in the same order:

1. allocate one storage-typed buffer per plan buffer; convert the float32 weights (decoded from
   ``weights.mcw``) and inputs to the storage type (half or float);
2. for each layer in encode order, call its kernel once per grid point (x fastest, then y, z),
   with the plan's buffers in binding order;
3. write each output buffer back as float32.

Before generating the runner, :func:`check_plan` checks the plan against the kernel source: each
kernel exists once, its ``[[buffer(i)]]`` parameters are numbered 0..n-1 and match the layer's
bindings in number, only the last one is writable, every binding names a buffer, grids are
non-empty and cover no more threads than the output buffer has elements.

The text compiled is mconv's own: :func:`mconv.targets.metal.load` hands over the kernels it
regenerated from the bundle's graph (never the shipped ``kernels.metal``), and
:func:`compile_harness` refuses kernel text with any preprocessor line but
``#include <metal_stdlib>`` (and ``<cstring>`` and ``#pragma GCC diagnostic``, which the naga
shim of the webgpu tests uses).
The compiler runs in a private temporary folder (mode 0700) holding
the shim, the kernels and the runner, with that folder as its working directory and its only
``-I``; the runner includes only those files.

Binaries are cached under ``$TMPDIR/mconv-metal-harness-<uid>/<sha256>`` (of kernels, runner,
shim, compiler and flags), so a model compiles once. The cache folder is used only when it is
a real directory owned by this user with no access for others (created 0700); otherwise
nothing is cached and the binary lives in a private temporary folder removed at exit.
``MCONV_CXX`` picks the compiler (default g++, then clang++).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from mconv.errors import InputError, IntegrityError
from mconv.targets.gpu.plan import GpuPlan
from mconv.targets.gpu.values import typed_output

SHIM = Path(__file__).with_name("metal_shim.h")
FLAG_SETS = (["-O2", "-march=native"], ["-O2"])
_KERNEL_RE = re.compile(r"kernel\s+void\s+(\w+)\s*\((.*?)\)\s*\{", re.S)
_DIRECTIVE_RE = re.compile(r"^[ \t]*#.*$", re.M)
# the first is the kernels'; the others the naga shim's (tests of the webgpu target)
_ALLOWED_DIRECTIVES = re.compile(
    r'#include <metal_stdlib>|#include <cstring>|#pragma GCC diagnostic (push|pop|ignored "-W[a-z-]+")'
)
_COMMENT_SAFE = re.compile(r"[^A-Za-z0-9 _.,:;=+\-()\[\]{}<>/#@|!%&^~$]")
_BUFFER_RE = re.compile(r"(device\s+(?:const\s+)?)\w+\s*\*\s*\w+\s*\[\[\s*buffer\((\d+)\)\s*\]\]")


def find_compiler() -> str | None:
    """The C++ compiler the harness uses: $MCONV_CXX, else g++, clang++ or c++ on PATH."""
    env = os.environ.get("MCONV_CXX")
    if env:
        return shutil.which(env)
    for name in ("g++", "clang++", "c++"):
        found = shutil.which(name)
        if found:
            return found
    return None


def comment_text(text: str, limit: int = 200) -> str:
    """``text`` (names from a model) safe inside a ``//`` comment of generated C++/MSL: one line,
    printable ASCII without backslashes, quotes or ``?`` (trigraphs; each other character becomes
    ``_``), at most ``limit`` characters."""
    text = _COMMENT_SAFE.sub("_", text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_directives(source: str, label: str = "bundle") -> None:
    """Generated kernel text has no preprocessor line but ``#include <metal_stdlib>``."""
    for m in _DIRECTIVE_RE.finditer(source):
        if not _ALLOWED_DIRECTIVES.fullmatch(m.group(0).strip()):
            raise IntegrityError(
                f"kernel text holds a preprocessor line ({comment_text(m.group(0).strip(), 60)})",
                path=label,
                where="kernels.metal",
                hint="mconv compiles only kernels it generates; re-export the bundle",
            )


def kernel_signatures(source: str) -> dict[str, list[tuple[int, bool]]]:
    """Kernel name -> its buffer parameters as (index, writable), in declaration order."""
    found: dict[str, list[tuple[int, bool]]] = {}
    for m in _KERNEL_RE.finditer(source):
        name, params = m.group(1), m.group(2)
        if name in found:
            raise IntegrityError(f"kernel {name} is defined twice", where="kernels.metal", hint="re-export")
        found[name] = [(int(b.group(2)), "const" not in b.group(1)) for b in _BUFFER_RE.finditer(params)]
    return found


def check_plan(plan: GpuPlan, source: str, label: str = "bundle", threads_per_element: int = 1) -> None:
    """Check the plan against the kernels (see the module rules); IntegrityError names the layer.
    ``threads_per_element``: how many threads a kernel may run per output element (1 for the
    Metal target's own kernels; a WebGPU plan's split-K kernels run a workgroup per few)."""
    sigs = kernel_signatures(source)
    for i, layer in enumerate(plan.layers):
        where = f"metal_plan.json layer {i} ({layer.kernel})"

        def bad(msg: str, where: str = where) -> IntegrityError:
            return IntegrityError(
                msg, path=label, where=where, hint="the plan and kernels.metal disagree; re-export"
            )

        if layer.kernel not in sigs:
            raise bad("kernel not found in kernels.metal")
        params = sigs[layer.kernel]
        if [p[0] for p in params] != list(range(len(params))):
            raise bad(f"buffer indices {[p[0] for p in params]} are not 0..{len(params) - 1}")
        if len(params) != len(layer.bindings):
            raise bad(f"{len(layer.bindings)} bindings for {len(params)} buffer parameters")
        if [w for _, w in params] != [False] * (len(params) - 1) + [True]:
            raise bad("only the last buffer parameter may be writable")
        if any(not 0 <= b < len(plan.buffers) for b in layer.bindings):
            raise bad("a binding names no buffer")
        if len(layer.grid) != 3 or min(layer.grid) < 1:
            raise bad(f"grid {layer.grid} is empty")
        out = plan.buffers[layer.bindings[-1]]
        if int(np.prod(layer.grid)) > out.count * threads_per_element:
            raise bad(f"grid {layer.grid} has more threads than output {out.name} has elements ({out.count})")


def runner_source(plan: GpuPlan) -> str:
    """The C++ runner for ``plan`` (includes kernels.metal; reads/writes float32 files)."""
    t = plan.dtype
    lines = [
        "// Generated by mconv from metal_plan.json: runs every kernel over its grid, in encode order.",
        "#include <cstdio>",
        "#include <cstdlib>",
        "#include <string>",
        "#include <vector>",
        '#include "kernels.metal"',
        "",
        f"typedef {t} storage_t;",
        f"static const size_t COUNTS[{len(plan.buffers)}] = {{{', '.join(str(b.count) for b in plan.buffers)}}};",
        f"static std::vector<storage_t> buf[{len(plan.buffers)}];",
        "",
        "static void load(const std::string &path, int b) {",
        '    FILE *f = std::fopen(path.c_str(), "rb");',
        '    if (!f) { std::fprintf(stderr, "cannot open %s\\n", path.c_str()); std::exit(2); }',
        "    std::vector<float> tmp(COUNTS[b]);",
        "    if (std::fread(tmp.data(), sizeof(float), COUNTS[b], f) != COUNTS[b]) {",
        '        std::fprintf(stderr, "%s: short read\\n", path.c_str()); std::exit(2); }',
        "    std::fclose(f);",
        "    for (size_t i = 0; i < COUNTS[b]; ++i) buf[b][i] = storage_t(tmp[i]);",
        "}",
        "",
        "static void save(const std::string &path, int b) {",
        "    std::vector<float> tmp(COUNTS[b]);",
        "    for (size_t i = 0; i < COUNTS[b]; ++i) tmp[i] = float(buf[b][i]);",
        '    FILE *f = std::fopen(path.c_str(), "wb");',
        "    if (!f || std::fwrite(tmp.data(), sizeof(float), COUNTS[b], f) != COUNTS[b]) {",
        '        std::fprintf(stderr, "cannot write %s\\n", path.c_str()); std::exit(3); }',
        "    std::fclose(f);",
        "}",
        "",
        "static void encode() {",
    ]
    for layer in plan.layers:
        gx, gy, gz = layer.grid
        args = ", ".join(f"buf[{b}].data()" for b in layer.bindings)
        lines += [
            f"    // {layer.kernel}: {comment_text(layer.op)}, bindings {comment_text(', '.join(layer.binding_names))}",
            f"    for (uint z = 0; z < {gz}u; ++z) for (uint y = 0; y < {gy}u; ++y) for (uint x = 0; x < {gx}u; ++x)",
            f"        {layer.kernel}({args}, uint3{{x, y, z}});",
        ]
    lines += [
        "}",
        "",
        "// usage: runner WEIGHTS_DIR IO_DIR SAMPLES",
        "int main(int argc, char **argv) {",
        '    if (argc != 4) { std::fprintf(stderr, "usage: runner WEIGHTS_DIR IO_DIR SAMPLES\\n"); return 2; }',
        "    const std::string wdir = argv[1], io = argv[2];",
        "    const int samples = std::atoi(argv[3]);",
        f"    for (int b = 0; b < {len(plan.buffers)}; ++b) buf[b].assign(COUNTS[b], storage_t(0));",
    ]
    for b in plan.weight_buffers():
        lines.append(f'    load(wdir + "/b{b.index}.f32", {b.index});')
    lines.append("    for (int s = 0; s < samples; ++s) {")
    lines.append("        const std::string tag = std::to_string(s);")
    for inp in plan.inputs:
        lines.append(f'        load(io + "/in" + tag + "_b{inp["buffer"]}.f32", {inp["buffer"]});')
    lines.append("        encode();")
    for out in plan.outputs:
        lines.append(f'        save(io + "/out" + tag + "_b{out["buffer"]}.f32", {out["buffer"]});')
    lines += ["    }", "    return 0;", "}", ""]
    return "\n".join(lines)


def _private_cache() -> Path | None:
    """This user's cache folder (see the module doc), or None where it cannot be trusted."""
    root = Path(tempfile.gettempdir()) / f"mconv-metal-harness-{os.getuid()}"
    try:
        os.mkdir(root, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        st = os.lstat(root)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return root


def _private_dir(parent: Path | None) -> Path:
    """A fresh folder only this user can enter (mkdtemp makes it 0700)."""
    return Path(tempfile.mkdtemp(prefix="mconv-metal-build.", dir=parent))


def compile_harness(plan: GpuPlan, kernels: str, label: str = "bundle", threads_per_element: int = 1) -> Path:
    """Compile (or find cached) the harness binary for ``plan`` + ``kernels`` (text mconv
    generated: see the module doc); return its path."""
    cxx = find_compiler()
    if cxx is None:
        raise InputError(
            "running metal kernels on this machine needs a C++ compiler (g++ or clang++), none found",
            path=label,
            hint="install g++ (apt-get install g++) or set MCONV_CXX; on a Mac run the Swift package",
        )
    check_directives(kernels, label)
    check_plan(plan, kernels, label, threads_per_element)
    runner = runner_source(plan)
    shim = SHIM.read_text()
    key = hashlib.sha256("\0".join([kernels, runner, shim, cxx, repr(FLAG_SETS)]).encode()).hexdigest()
    cache = _private_cache()
    exe = cache / key[:32] / "harness" if cache is not None else None
    if exe is not None and exe.is_file():
        return exe
    work = _private_dir(cache)
    try:
        (work / "metal_shim.h").write_text(shim)
        (work / "metal_stdlib").write_text('#include "metal_shim.h"\n')
        (work / "kernels.metal").write_text(kernels)
        (work / "runner.cpp").write_text(runner)
        errors = ""
        for flags in FLAG_SETS:
            cmd = [cxx, "-std=c++17", *flags, "-I", ".", "-o", "harness", "runner.cpp"]
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=work)
            if proc.returncode == 0:
                if exe is None:  # no trusted cache: the binary stays in its private folder
                    kept = _private_dir(None)
                    os.replace(work / "harness", kept / "harness")
                    atexit.register(shutil.rmtree, kept, True)
                    return kept / "harness"
                exe.parent.mkdir(mode=0o700, exist_ok=True)
                os.replace(work / "harness", exe)  # atomic: a concurrent build gives the same binary
                return exe
            errors = proc.stderr
        first = next((ln for ln in errors.splitlines() if "error" in ln), errors.strip()[:200])
        raise InputError(
            f"the kernels do not compile as C++ against metal_shim.h ({comment_text(first, 300)})",
            path=label,
            where="kernels.metal",
            hint="re-export the bundle; report the error if it persists",
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


@dataclass
class HarnessRunner:
    """Runs a plan's kernels on the CPU through the compiled harness (the Runner API).

    Feeds whose batch is a multiple of the plan's baked batch (inputs with a symbolic batch
    dimension) are run as consecutive samples and the outputs concatenated along axis 0.
    """

    plan: GpuPlan
    exe: Path
    weights: Mapping[str, np.ndarray]
    inputs: list  # mconv.bundle.TensorSpec
    outputs: list[str]
    label: str = "bundle"
    # output name -> numpy dtype name: integer and bool outputs (held as floats) come back typed
    output_dtypes: Mapping[str, str] = field(default_factory=dict)
    _wdir: tempfile.TemporaryDirectory | None = field(default=None, repr=False)

    def _weights_dir(self) -> str:
        if self._wdir is None:
            self._wdir = tempfile.TemporaryDirectory(prefix="mconv-metal-weights.")
            for b in self.plan.weight_buffers():
                arr = np.ascontiguousarray(np.asarray(self.weights[b.name], dtype=np.float32).ravel())
                if arr.size != b.count:
                    raise IntegrityError(
                        f"weight {b.name} has {arr.size} elements, the plan says {b.count}",
                        path=self.label,
                        hint="re-export the bundle",
                    )
                arr.tofile(os.path.join(self._wdir.name, f"b{b.index}.f32"))
        return self._wdir.name

    def _split(self, feeds: Mapping[str, np.ndarray]) -> int:
        """How many plan-sized samples the feeds hold (checks names and shapes)."""
        samples = None
        for spec in self.plan.inputs:
            name = spec["name"]
            if name not in feeds:
                raise InputError(f"missing input '{name}'", path=self.label, hint="feed every model input")
            arr = np.asarray(feeds[name])
            want = list(spec["shape"])
            got = list(arr.shape)
            ok = len(got) == len(want) and got[1:] == want[1:] and want and got[0] % want[0] == 0
            if not ok and got != want:
                raise InputError(
                    f"shape {got}, the bundle was exported for {want}",
                    path=self.label,
                    where=f"input '{name}'",
                    hint="feed that shape (a batch that is a multiple of the exported batch works too)",
                )
            n = got[0] // want[0] if want else 1
            if samples is not None and n != samples:
                raise InputError("inputs disagree on the batch", path=self.label, hint="feed equal batches")
            samples = n
        return samples or 1

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        unknown = sorted(set(feeds) - {s["name"] for s in self.plan.inputs})
        if unknown:
            raise InputError(
                f"unknown input(s) {', '.join(unknown)}", path=self.label, hint="check input names"
            )
        samples = self._split(feeds)
        wdir = self._weights_dir()
        with tempfile.TemporaryDirectory(prefix="mconv-metal-io.") as io:
            for spec in self.plan.inputs:
                arr = np.asarray(feeds[spec["name"]], dtype=np.float32)
                chunks = arr.reshape(samples, -1)
                for s in range(samples):
                    np.ascontiguousarray(chunks[s]).tofile(os.path.join(io, f"in{s}_b{spec['buffer']}.f32"))
            proc = subprocess.run([str(self.exe), wdir, io, str(samples)], capture_output=True, text=True)
            if proc.returncode != 0:
                raise InputError(
                    f"the metal harness failed (exit {proc.returncode}: {proc.stderr.strip()[:200]})",
                    path=self.label,
                    hint="re-export the bundle",
                )
            results = {}
            for spec in self.plan.outputs:
                parts = [
                    np.fromfile(os.path.join(io, f"out{s}_b{spec['buffer']}.f32"), dtype=np.float32).reshape(
                        spec["shape"]
                    )
                    for s in range(samples)
                ]
                results[spec["name"]] = parts[0] if samples == 1 else np.concatenate(parts, axis=0)
        return {name: typed_output(results[name], self.output_dtypes.get(name)) for name in self.outputs}

    def close(self) -> None:
        if self._wdir is not None:
            self._wdir.cleanup()
            self._wdir = None
