"""Run a webgpu bundle through ``wgpu`` (wgpu-native: Vulkan, Metal or D3D12; lavapipe on a CPU).

Rules:

1. Device: the adapter ``wgpu`` picks with ``power_preference="high-performance"``; none (no
   driver, or ``wgpu`` not installed) is one :class:`~mconv.errors.InputError` line (exit 2)
   saying so. One device per process, opened with the adapter's storage-buffer limits and
   ``shader-f16`` where the adapter has it; a plan that stores half runs with f16 storage
   there, with f32 storage elsewhere (:func:`~mconv.targets.webgpu.wgsl.storage_header`).
2. Before anything is compiled the plan is checked against the kernels (:func:`check_plan`):
   each layer's module exists, declares its entry point, binds 0..n-1 with only the last
   writable, every binding names a buffer, and the grid covers no more threads than one
   workgroup per output element (a split-K kernel runs a workgroup per few outputs). A kernel the device refuses is an IntegrityError naming it.
3. Buffers (one per plan buffer, sizes rounded up to 4 bytes), pipelines and bind groups are
   made once; the weights, decoded from ``weights.mcw``, are uploaded once.
4. One inference is one command buffer: the inputs are written to their buffers, one compute
   pass dispatches every layer in the plan's order (WebGPU orders dispatches of a pass that
   share a buffer), the output buffers are copied to mappable buffers in the same encoder,
   the buffer is submitted and the outputs read back as float32. Feeds whose batch is a
   multiple of the exported batch run as consecutive inferences, outputs concatenated.
5. Integer and bool values are held as floats (the plan's rule 2): an integer or bool input is
   written as its values (exact within the storage's exact range, which int8/uint8 codes are
   in), and an output whose model type is an integer or bool comes back as that type
   (``output_dtypes``): integers rounded and saturated to the type, bool as nonzero
   (:func:`~mconv.targets.gpu.values.typed_output`).
6. The device also asks for ``timestamp-query`` where the adapter has it, for
   :meth:`WebGPURunner.profile` alone.
7. Profiling (:meth:`WebGPURunner.profile`, ``bench/webgpu.py --profile``) runs each layer in
   a compute pass of its own with timestamps at its start and end; inference (rule 4) never
   does, so profiling costs nothing when it is not asked for.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mconv.errors import InputError, IntegrityError
from mconv.targets.gpu.plan import GpuPlan
from mconv.targets.gpu.values import typed_output
from mconv.targets.webgpu.tiled import entry_point, uses_shared_memory
from mconv.targets.webgpu.wgsl import WORKGROUP, dispatch_size, storage_header

_BINDING_RE = re.compile(r"@group\(0\)\s*@binding\((\d+)\)\s*var<storage,\s*(read|read_write)>")


def check_plan(plan: GpuPlan, sources: Mapping[str, str], label: str = "bundle") -> None:
    """Rule 2: the plan and the kernels agree; IntegrityError names the layer."""
    for i, layer in enumerate(plan.layers):
        where = f"webgpu_plan.json layer {i} ({layer.kernel})"

        def bad(msg: str, where: str = where) -> IntegrityError:
            return IntegrityError(
                msg, path=label, where=where, hint="the plan and the kernels disagree; re-export"
            )

        src = sources.get(layer.kernel)
        if src is None:
            raise bad("kernel module not found")
        if not re.search(rf"\bfn\s+{re.escape(layer.kernel)}\s*\(", src):
            raise bad("the module has no entry point of the kernel's name")
        binds = [(int(m.group(1)), m.group(2)) for m in _BINDING_RE.finditer(src)]
        if [b for b, _ in binds] != list(range(len(binds))):
            raise bad(f"bindings {[b for b, _ in binds]} are not 0..{len(binds) - 1}")
        if len(binds) != len(layer.bindings):
            raise bad(f"{len(layer.bindings)} bindings for {len(binds)} buffers in the module")
        if [m for _, m in binds] != ["read"] * (len(binds) - 1) + ["read_write"]:
            raise bad("only the last binding may be writable")
        if any(not 0 <= b < len(plan.buffers) for b in layer.bindings):
            raise bad("a binding names no buffer")
        if len(layer.grid) != 3 or min(layer.grid) < 1:
            raise bad(f"grid {layer.grid} is empty")
        out = plan.buffers[layer.bindings[-1]]
        if int(np.prod(layer.grid)) > out.count * WORKGROUP:
            raise bad(
                f"grid {layer.grid} has more threads than {WORKGROUP} per element of output {out.name} ({out.count})"
            )


def _no_adapter(label: str, why: str) -> InputError:
    return InputError(
        f"no WebGPU adapter on this machine ({why})",
        path=label,
        hint="install a Vulkan driver (apt-get install mesa-vulkan-drivers gives lavapipe on the CPU) "
        "or run on a machine with a GPU",
    )


def _quiet_wsi() -> None:
    """The window-system probe at adapter creation (libwayland-client, loaded by the drivers)
    prints ``error: XDG_RUNTIME_DIR is invalid or not set in the environment.`` on stderr when
    the variable is unset, empty or not an absolute path; compute needs no window system, so
    unless it names an existing folder by an absolute path, this process points it at a private
    empty folder (removed at exit) before wgpu opens an adapter."""
    current = os.environ.get("XDG_RUNTIME_DIR") or ""
    if os.path.isabs(current) and os.path.isdir(current):
        return
    folder = tempfile.mkdtemp(prefix="mconv-xdg.")
    atexit.register(shutil.rmtree, folder, True)
    os.environ["XDG_RUNTIME_DIR"] = folder


_DEVICE: list = []  # one (adapter, device, has_f16) per process: adapters take seconds to open


def request_device(label: str, want_f16: bool, max_buffer_bytes: int) -> tuple[Any, Any, bool]:
    """(adapter, device, f16) per rule 1; the device is opened once per process with the
    adapter's storage limits and ``shader-f16`` where it has it."""
    try:
        import wgpu  # type: ignore[import-untyped, import-not-found]
    except ImportError:
        raise _no_adapter(label, "the wgpu package is not installed: pip install wgpu") from None
    if not _DEVICE:
        _quiet_wsi()
        try:
            adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        except Exception as exc:  # noqa: BLE001 - wgpu-native reports a missing driver in many ways
            first = str(exc).splitlines()[0][:120] if str(exc) else ""
            raise _no_adapter(label, f"{type(exc).__name__}: {first}") from None
        if adapter is None:
            raise _no_adapter(label, "wgpu found no Vulkan, Metal or D3D12 device")
        has_f16 = "shader-f16" in adapter.features
        keys = ("max-storage-buffer-binding-size", "max-buffer-size", "max-storage-buffers-per-shader-stage")
        # timestamp queries serve WebGPURunner.profile only; nothing else depends on them
        wanted = [f for f in ("shader-f16", "timestamp-query") if f in adapter.features]
        device = adapter.request_device_sync(
            required_features=wanted,
            required_limits={k: int(adapter.limits[k]) for k in keys},
            label="mconv",
        )
        _DEVICE.append((adapter, device, has_f16))
    adapter, device, has_f16 = _DEVICE[0]
    for key in ("max-storage-buffer-binding-size", "max-buffer-size"):
        if max_buffer_bytes > int(device.limits[key]):
            raise InputError(
                f"a buffer of {max_buffer_bytes} bytes exceeds the adapter's {key} ({int(device.limits[key])})",
                path=label,
                hint="export with a smaller batch, or run on a larger GPU",
            )
    return adapter, device, want_f16 and has_f16


@dataclass
class WebGPURunner:
    """The Runner API over a webgpu bundle (see the module rules)."""

    plan: GpuPlan
    sources: Mapping[str, str]
    weights: Mapping[str, np.ndarray]
    inputs: list  # mconv.bundle.TensorSpec
    outputs: list[str]
    label: str = "bundle"
    # output name -> numpy dtype name: integer and bool outputs (held as floats) come back typed
    output_dtypes: Mapping[str, str] = field(default_factory=dict)
    f16: bool = field(default=False, init=False)
    adapter_info: dict = field(default_factory=dict, init=False)
    last_latency_s: float = field(default=0.0, init=False)
    _gpu: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        check_plan(self.plan, self.sources, self.label)
        import wgpu  # type: ignore[import-untyped, import-not-found]  # request_device has checked that it imports

        item = 2 if self.plan.dtype == "half" else 4
        largest = max((b.count * item for b in self.plan.buffers), default=4)
        adapter, device, self.f16 = request_device(self.label, self.plan.dtype == "half", largest + 4)
        info = adapter.info
        self.adapter_info = {k: info.get(k) for k in ("vendor", "device", "backend_type", "adapter_type")}
        self._dtype = np.float16 if self.f16 else np.float32
        size = np.dtype(self._dtype).itemsize
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
        buffers = [
            device.create_buffer(size=max(4, -(-b.count * size // 4) * 4), usage=usage, label=f"b{b.index}")
            for b in self.plan.buffers
        ]
        for b in self.plan.weight_buffers():
            arr = np.asarray(self.weights[b.name], dtype=np.float32).ravel()
            if arr.size != b.count:
                raise IntegrityError(
                    f"weight {b.name} has {arr.size} elements, the plan says {b.count}",
                    path=self.label,
                    hint="re-export the bundle",
                )
            device.queue.write_buffer(buffers[b.index], 0, self._padded(arr))
        pipelines, groups = [], []
        shared = uses_shared_memory(dict(info))  # tiled kernels' rule 6
        for i, layer in enumerate(self.plan.layers):
            code = storage_header(self.sources[layer.kernel], self.f16)
            try:
                shader = device.create_shader_module(code=code, label=layer.kernel)
                stage = {"module": shader, "entry_point": entry_point(layer.kernel, code, shared)}
                pipe = device.create_compute_pipeline(layout="auto", compute=stage, label=layer.kernel)
                group = device.create_bind_group(
                    layout=pipe.get_bind_group_layout(0),
                    entries=[
                        {
                            "binding": j,
                            "resource": {"buffer": buffers[b], "offset": 0, "size": buffers[b].size},
                        }
                        for j, b in enumerate(layer.bindings)
                    ],
                )
            except Exception as exc:  # noqa: BLE001 - wgpu's validation errors carry the compiler's text
                first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
                raise IntegrityError(
                    f"the device refused kernel {layer.kernel} ({first[:200]})",
                    path=self.label,
                    where=f"webgpu_plan.json layer {i}",
                    hint="re-export the bundle; report the error if it persists",
                ) from None
            pipelines.append(pipe)
            groups.append(group)
        staging = {
            o["buffer"]: device.create_buffer(
                size=buffers[o["buffer"]].size, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
            )
            for o in self.plan.outputs
        }
        # every layer's (pipeline, bind group, workgroups), so an inference only encodes (rule 4)
        steps = [(p, g, dispatch_size(la.grid)) for p, g, la in zip(pipelines, groups, self.plan.layers)]
        self._gpu = dict(
            wgpu=wgpu,
            device=device,
            buffers=buffers,
            pipelines=pipelines,
            groups=groups,
            staging=staging,
            steps=steps,
        )

    def _padded(self, arr: np.ndarray) -> np.ndarray | bytes:
        data = np.ascontiguousarray(arr, dtype=self._dtype)
        if data.nbytes % 4 == 0:
            return data  # written as it is: no copy beyond the dtype's
        raw = data.tobytes()
        return raw + b"\0" * (-len(raw) % 4)

    def _split(self, feeds: Mapping[str, np.ndarray]) -> int:
        samples = None
        for spec in self.plan.inputs:
            name = spec["name"]
            if name not in feeds:
                raise InputError(f"missing input '{name}'", path=self.label, hint="feed every model input")
            got, want = list(np.shape(feeds[name])), list(spec["shape"])
            ok = len(got) == len(want) and got[1:] == want[1:] and bool(want) and got[0] % want[0] == 0
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

    def _samples(self, feeds: Mapping[str, np.ndarray]) -> dict[int, np.ndarray]:
        """Each input buffer's feed as ``[samples, exported size]`` float32 (rule 4)."""
        samples = self._split(feeds)
        return {
            s["buffer"]: np.asarray(feeds[s["name"]], dtype=np.float32).reshape(samples, -1)
            for s in self.plan.inputs
        }

    def _write(self, chunks: Mapping[int, np.ndarray]) -> None:
        g = self._gpu
        for b, arr in chunks.items():
            g["device"].queue.write_buffer(g["buffers"][b], 0, self._padded(arr))

    def _infer(self, chunks: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
        """One inference: one command buffer (rule 4)."""
        g = self._gpu
        device, buffers = g["device"], g["buffers"]
        self._write(chunks)
        encoder = device.create_command_encoder()
        cpass = encoder.begin_compute_pass()
        for pipe, group, size in g["steps"]:
            cpass.set_pipeline(pipe)
            cpass.set_bind_group(0, group)
            cpass.dispatch_workgroups(*size)
        cpass.end()
        for b, stage in g["staging"].items():
            encoder.copy_buffer_to_buffer(buffers[b], 0, stage, 0, stage.size)
        device.queue.submit([encoder.finish()])
        out = {}
        for b, stage in g["staging"].items():
            stage.map_sync(g["wgpu"].MapMode.READ)
            try:
                raw = bytes(stage.read_mapped())
            finally:
                stage.unmap()
            count = self.plan.buffers[b].count
            out[b] = np.frombuffer(raw, dtype=self._dtype, count=count).astype(np.float32)
        return out

    def profile(self, feeds: Mapping[str, np.ndarray], runs: int = 5) -> list[dict]:
        """Each layer's GPU time (rule 7): ``[{"layer", "kernel", "grid", "ms"}]`` in plan order,
        ``ms`` the median over ``runs`` inferences of the first sample, from timestamps written
        at the start and end of a compute pass per layer (one pass a layer, so the sums include
        each pass's own start-up). Empty where the adapter has no ``timestamp-query``."""
        g = self._gpu
        wgpu, device = g["wgpu"], g["device"]
        if "timestamp-query" not in device.features:
            return []
        self._write({b: a[0] for b, a in self._samples(feeds).items()})
        n = len(self.plan.layers)
        qs = device.create_query_set(type="timestamp", count=2 * n)
        resolve = device.create_buffer(
            size=16 * n, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC
        )
        times = []
        for _ in range(max(runs, 1)):
            encoder = device.create_command_encoder()
            for i, (layer, pipe, group) in enumerate(zip(self.plan.layers, g["pipelines"], g["groups"])):
                cpass = encoder.begin_compute_pass(
                    timestamp_writes={
                        "query_set": qs,
                        "beginning_of_pass_write_index": 2 * i,
                        "end_of_pass_write_index": 2 * i + 1,
                    }
                )
                cpass.set_pipeline(pipe)
                cpass.set_bind_group(0, group)
                cpass.dispatch_workgroups(*dispatch_size(layer.grid))
                cpass.end()
            encoder.resolve_query_set(qs, 0, 2 * n, resolve, 0)
            device.queue.submit([encoder.finish()])
            ticks = np.frombuffer(device.queue.read_buffer(resolve), dtype=np.uint64).astype(np.float64)
            times.append((ticks[1::2] - ticks[0::2]) / 1e6)  # WebGPU timestamps are nanoseconds
        ms = np.median(np.stack(times), axis=0)
        return [
            {"layer": i, "kernel": layer.kernel, "grid": list(layer.grid), "ms": float(ms[i])}
            for i, layer in enumerate(self.plan.layers)
        ]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        unknown = sorted(set(feeds) - {s["name"] for s in self.plan.inputs})
        if unknown:
            raise InputError(
                f"unknown input(s) {', '.join(unknown)}", path=self.label, hint="check input names"
            )
        arrays = self._samples(feeds)
        samples = next(iter(arrays.values())).shape[0] if arrays else 1
        parts: dict[str, list[np.ndarray]] = {o["name"]: [] for o in self.plan.outputs}
        start = time.perf_counter()
        for s in range(samples):
            got = self._infer({b: a[s] for b, a in arrays.items()})
            for o in self.plan.outputs:
                parts[o["name"]].append(got[o["buffer"]].reshape(o["shape"]))
        self.last_latency_s = (time.perf_counter() - start) / samples
        results = {k: v[0] if samples == 1 else np.concatenate(v, axis=0) for k, v in parts.items()}
        return {name: typed_output(results[name], self.output_dtypes.get(name)) for name in self.outputs}

    def close(self) -> None:
        self._gpu = {}
