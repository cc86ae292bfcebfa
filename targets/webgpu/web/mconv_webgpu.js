// Run an mconv webgpu bundle with the browser's WebGPU: the page's module (index.html imports it).
//
// It loads manifest.json, webgpu_plan.json, kernels/<kernel>.wgsl and weights.mcw (decoded by
// mcw.js), opens a device (shader-f16 where the adapter has it and the plan stores half; f32
// storage otherwise, as the Python runner does), makes every buffer, pipeline and bind group once,
// and runs one inference as ONE command buffer: the inputs written, one compute pass dispatching
// every layer in the plan's order, the outputs copied to mappable buffers, submitted, read back.
//
// Inputs: ?feed=URL names a weights.mcw-format container holding one tensor per model input
// (any dtype the container decodes, converted to the float values the plan holds; batch = the
// exported batch); without it the inputs come from the seeded generator below (?seed=N,
// default 0): float inputs uniform in [-1, 1), integer inputs floor((u + 1) * 4), in 0..7 (valid
// indices and token ids for any table of 8 or more), bool inputs u > 0. Integer and bool
// outputs (held as floats, as the plan holds every value) come back as the manifest's type:
// integers rounded half to even and saturated to the type's range, bool as 0/1 (the Python
// runner's rule). ?runs=N timed inferences after one warm-up.
// The result (outputs as number lists, timing, adapter) is shown on the page and left as
// window.mconvResult; window.mconvDone is a promise of it. A page without a WebGPU adapter says
// so and resolves with {error: "no WebGPU adapter ..."}.

import { floatToHalfBits, halfToFloatBits, readContainer } from "./mcw.js";

const WORKGROUP = 64;
const MAX_WORKGROUPS = 65535;
const HEADER_F32 = "alias T = f32;\n";
const HEADER_F16 = "enable f16;\nalias T = f16;\n";

export function dispatchSize(grid) {
  const total = grid[0] * grid[1] * grid[2];
  const groups = Math.max(1, Math.ceil(total / WORKGROUP));
  if (groups <= MAX_WORKGROUPS) return [groups, 1, 1];
  return [MAX_WORKGROUPS, Math.ceil(groups / MAX_WORKGROUPS), 1];
}

// mulberry32: the page's default inputs, reproducible from the seed.
export function uniformInputs(seed, n) {
  let a = seed >>> 0;
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    out[i] = (((t ^ (t >>> 14)) >>> 0) / 4294967296) * 2 - 1;
  }
  return out;
}

async function fetchOk(url, kind) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return kind === "json" ? r.json() : kind === "text" ? r.text() : r.arrayBuffer();
}

function toStorage(f32, f16) {
  if (!f16) return new Uint8Array(f32.buffer, f32.byteOffset, f32.byteLength);
  const bits = new Uint32Array(f32.buffer, f32.byteOffset, f32.length);
  const half = new Uint16Array(f32.length + (f32.length & 1));
  for (let i = 0; i < f32.length; i++) half[i] = floatToHalfBits(bits[i]);
  return new Uint8Array(half.buffer);
}

function fromStorage(buffer, n, f16) {
  if (!f16) return new Float32Array(buffer.slice(0, 4 * n));
  const half = new Uint16Array(buffer, 0, n);
  const out = new Uint32Array(n);
  for (let i = 0; i < n; i++) out[i] = halfToFloatBits(half[i]);
  return new Float32Array(out.buffer);
}

// requestDevice can fail transiently (Dawn: "A valid external Instance reference no longer
// exists" when the GPU process restarts its instance). An adapter is spent once it has handed out
// a device or failed to, so each try asks for a fresh adapter; the third failure is reported.
const DEVICE_TRIES = 3;

async function acquireDevice(plan) {
  let last = null;
  for (let attempt = 0; attempt < DEVICE_TRIES; attempt++) {
    const adapter = await navigator.gpu.requestAdapter({ powerPreference: "high-performance" });
    if (!adapter) return { error: "no WebGPU adapter (requestAdapter returned null)" };
    const f16 = plan.dtype === "half" && adapter.features.has("shader-f16");
    const keys = ["maxStorageBufferBindingSize", "maxBufferSize", "maxStorageBuffersPerShaderStage"];
    const requiredLimits = Object.fromEntries(keys.map((k) => [k, adapter.limits[k]]));
    try {
      const device = await adapter.requestDevice({ requiredFeatures: f16 ? ["shader-f16"] : [], requiredLimits });
      return { adapter, device, f16, attempts: attempt + 1 };
    } catch (err) {
      last = err;
      await new Promise((r) => setTimeout(r, 200 * (attempt + 1)));
    }
  }
  return { error: `requestDevice failed ${DEVICE_TRIES} times: ${last.name}: ${last.message}` };
}

export async function loadBundle(base = ".") {
  const status = (m) => setStatus(m);
  status("loading manifest and plan");
  const manifest = await fetchOk(`${base}/manifest.json`, "json");
  const plan = await fetchOk(`${base}/webgpu_plan.json`, "json");
  if (!navigator.gpu) return { error: "no WebGPU adapter (navigator.gpu is undefined: this browser has WebGPU off)" };
  const got = await acquireDevice(plan);
  if (got.error) return got;
  const { adapter, device, f16, attempts } = got;
  const info = adapter.info || {};
  const size = f16 ? 2 : 4;
  status("decoding weights.mcw");
  const t0 = performance.now();
  const weightBuffers = plan.buffers.filter((b) => b.kind === "weight");
  let container = null;
  if (weightBuffers.length) container = readContainer(await fetchOk(`${base}/weights.mcw`, "bytes"));
  const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;
  const buffers = plan.buffers.map((b) =>
    device.createBuffer({ size: Math.max(4, Math.ceil((b.count * size) / 4) * 4), usage, label: `b${b.index}` }),
  );
  let shaChecked = 0;
  for (const b of weightBuffers) {
    if (await container.checkSha256(b.name)) shaChecked++;
    const arr = container.float32(b.name);
    if (arr.length !== b.count) throw new Error(`weight ${b.name} has ${arr.length} elements, the plan says ${b.count}`);
    device.queue.writeBuffer(buffers[b.index], 0, toStorage(arr, f16));
  }
  const decodeMs = performance.now() - t0;
  status("compiling kernels");
  const t1 = performance.now();
  const pipelines = [];
  const groups = [];
  // tiled kernels' rule 6 (mconv.targets.webgpu.tiled): no workgroup memory on a software adapter
  const named = `${info.vendor || ""} ${info.architecture || ""} ${info.device || ""} ${info.description || ""}`.toLowerCase();
  const shared = !(info.isFallbackAdapter || adapter.isFallbackAdapter || ["llvmpipe", "lavapipe", "swiftshader"].some((n) => named.includes(n)));
  for (const [i, layer] of plan.layers.entries()) {
    let code = await fetchOk(`${base}/kernels/${layer.kernel}.wgsl`, "text");
    if (!f16 && code.startsWith(HEADER_F16)) code = HEADER_F32 + code.slice(HEADER_F16.length);
    const module = device.createShaderModule({ code, label: layer.kernel });
    const messages = (await module.getCompilationInfo()).messages.filter((m) => m.type === "error");
    if (messages.length) throw new Error(`layer ${i} (${layer.kernel}): ${messages[0].message}`);
    const direct = `${layer.kernel}_direct`;
    const compute = { module, entryPoint: !shared && code.includes(`fn ${direct}(`) ? direct : layer.kernel };
    const pipe = await device.createComputePipelineAsync({ layout: "auto", compute, label: layer.kernel });
    groups.push(
      device.createBindGroup({
        layout: pipe.getBindGroupLayout(0),
        entries: layer.bindings.map((b, j) => ({ binding: j, resource: { buffer: buffers[b] } })),
      }),
    );
    pipelines.push(pipe);
  }
  const compileMs = performance.now() - t1;
  const staging = new Map(
    plan.outputs.map((o) => [o.buffer, device.createBuffer({ size: buffers[o.buffer].size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST })]),
  );
  return {
    manifest, plan, device, buffers, pipelines, groups, staging, f16,
    adapter: { vendor: info.vendor || "", architecture: info.architecture || "", device: info.device || "", description: info.description || "" },
    decodeMs, compileMs, shaChecked, deviceAttempts: attempts, sharedMemory: shared,
  };
}

// One inference: one command buffer, every layer dispatched in the plan's order.
export async function infer(b, inputs) {
  const { device, buffers, plan } = b;
  for (const spec of plan.inputs) device.queue.writeBuffer(buffers[spec.buffer], 0, toStorage(inputs[spec.name], b.f16));
  const encoder = device.createCommandEncoder();
  const pass = encoder.beginComputePass();
  plan.layers.forEach((layer, i) => {
    pass.setPipeline(b.pipelines[i]);
    pass.setBindGroup(0, b.groups[i]);
    pass.dispatchWorkgroups(...dispatchSize(layer.grid));
  });
  pass.end();
  for (const [buf, stage] of b.staging) encoder.copyBufferToBuffer(buffers[buf], 0, stage, 0, stage.size);
  device.queue.submit([encoder.finish()]);
  const out = {};
  for (const o of plan.outputs) {
    const stage = b.staging.get(o.buffer);
    await stage.mapAsync(GPUMapMode.READ);
    out[o.name] = fromStorage(stage.getMappedRange().slice(0), plan.buffers[o.buffer].count, b.f16);
    stage.unmap();
  }
  return out;
}

// Diagnostic (?profile=1): one inference with every layer in its own submit, each awaited with
// onSubmittedWorkDone; the wall time of each layer (ms, the plan's order). Not the timed path.
export async function profileLayers(b, inputs) {
  const { device, buffers, plan } = b;
  for (const spec of plan.inputs) device.queue.writeBuffer(buffers[spec.buffer], 0, toStorage(inputs[spec.name], b.f16));
  await device.queue.onSubmittedWorkDone();
  const times = [];
  for (const [i, layer] of plan.layers.entries()) {
    const t = performance.now();
    const encoder = device.createCommandEncoder();
    const pass = encoder.beginComputePass();
    pass.setPipeline(b.pipelines[i]);
    pass.setBindGroup(0, b.groups[i]);
    pass.dispatchWorkgroups(...dispatchSize(layer.grid));
    pass.end();
    device.queue.submit([encoder.finish()]);
    await device.queue.onSubmittedWorkDone();
    times.push(performance.now() - t);
  }
  return times;
}

const INT_RANGES = {
  int8: [-128, 127], uint8: [0, 255], int16: [-32768, 32767], uint16: [0, 65535],
  int32: [-2147483648, 2147483647], uint32: [0, 4294967295],
  int64: [-9223372036854775808, 9223372036854775807], uint64: [0, 18446744073709551615],
};

export function dtypesOf(specs) {
  return Object.fromEntries((specs || []).map((s) => [s.name, s.dtype]));
}

// The page's default values of one input: floats as drawn, integers 0..7, bool 0/1.
export function defaultInput(u, dtype) {
  if (dtype === "bool") return u.map((v) => (v > 0 ? 1 : 0));
  if (dtype in INT_RANGES) return u.map((v) => Math.floor((v + 1) * 4));
  return u;
}

function roundHalfEven(v) {
  const r = Math.round(v);
  return Math.abs(v % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

// An output held as floats, as the model's type (the Python runner's _typed).
export function typedOutput(values, dtype) {
  if (dtype === "bool") return Array.from(values, (v) => (v !== 0 ? 1 : 0));
  const range = INT_RANGES[dtype];
  if (!range) return Array.from(values);
  return Array.from(values, (v) => Math.min(range[1], Math.max(range[0], roundHalfEven(v))));
}

async function feedInputs(plan, params, dtypes = {}) {
  const inputs = {};
  const feed = params.get("feed");
  const container = feed ? readContainer(await fetchOk(feed, "bytes"), feed) : null;
  const seed = Number(params.get("seed") || 0);
  plan.inputs.forEach((spec, i) => {
    const n = spec.shape.reduce((a, d) => a * d, 1);
    const arr = container ? container.float32(spec.name) : defaultInput(uniformInputs(seed + i, n), dtypes[spec.name]);
    if (arr.length !== n) throw new Error(`feed input '${spec.name}' has ${arr.length} elements, the bundle takes ${n} (${JSON.stringify(spec.shape)})`);
    inputs[spec.name] = arr;
  });
  return inputs;
}

function setStatus(text) {
  const el = typeof document !== "undefined" && document.getElementById("status");
  if (el) el.textContent = text;
}

function show(result) {
  if (typeof document === "undefined") return;
  setStatus(result.error ? result.error : "done");
  document.getElementById("result").textContent = JSON.stringify(result.summary || result, null, 1);
  const table = document.getElementById("outputs");
  if (!table || result.error) return;
  for (const [name, values] of Object.entries(result.outputs)) {
    const row = table.insertRow();
    let best = 0;
    values.forEach((v, i) => {
      if (v > values[best]) best = i;
    });
    const integral = (result.dtypes || {})[name] in INT_RANGES || (result.dtypes || {})[name] === "bool";
    const head = values.slice(0, 6).map((v) => (integral ? String(v) : v.toPrecision(5))).join(", ");
    for (const text of [name, JSON.stringify(result.shapes[name]), `${head}${values.length > 6 ? ", ..." : ""}`, String(best)]) {
      row.insertCell().textContent = text;
    }
  }
}

export async function main(params = new URLSearchParams(location.search)) {
  let result;
  try {
    const b = await loadBundle(params.get("base") || ".");
    if (b.error) {
      result = { error: b.error };
    } else {
      setStatus("running");
      const inputs = await feedInputs(b.plan, params, dtypesOf(b.manifest.inputs));
      let outputs = await infer(b, inputs); // warm-up: the first submit pays pipeline creation
      const runs = Math.max(1, Number(params.get("runs") || 5));
      const times = [];
      for (let r = 0; r < runs; r++) {
        const t = performance.now();
        outputs = await infer(b, inputs);
        times.push(performance.now() - t);
      }
      times.sort((x, y) => x - y);
      const layerMs = params.get("profile") ? await profileLayers(b, inputs) : null;
      const shapes = Object.fromEntries(b.plan.outputs.map((o) => [o.name, o.shape]));
      const dtypes = dtypesOf(b.manifest.outputs);
      result = {
        model: b.plan.model_name,
        layers: b.plan.layers.length,
        storage: b.f16 ? "f16" : "f32",
        adapter: b.adapter,
        device_attempts: b.deviceAttempts,
        shared_memory: b.sharedMemory,
        decode_ms: b.decodeMs,
        compile_ms: b.compileMs,
        sha256_checked: b.shaChecked,
        runs,
        median_ms: times[Math.floor(times.length / 2)],
        min_ms: times[0],
        ...(layerMs ? { layer_ms: layerMs } : {}),
        shapes,
        dtypes: Object.fromEntries(b.plan.outputs.map((o) => [o.name, dtypes[o.name] || "float32"])),
        outputs: Object.fromEntries(Object.entries(outputs).map(([k, v]) => [k, typedOutput(v, dtypes[k])])),
      };
      result.summary = Object.fromEntries(Object.entries(result).filter(([k]) => k !== "outputs"));
    }
  } catch (err) {
    result = { error: `${err.name}: ${err.message}` };
  }
  show(result);
  return result;
}
