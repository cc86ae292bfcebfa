// weights.mcw in JavaScript: the container of mconv.container and the codecs of mconv.codecs
// (raw, fp16, palette with groups along any axis or per-block codebooks, sparse; packed, canonical-Huffman or rANS
// index streams), decoded bit for bit as the Python and C99 decoders do. An ES module: the
// bundle's page imports it, and the tests run it under node against the Python decoder.
//
// readContainer(arrayBuffer) -> {entries: Map(name -> entry), tensorBytes(name), float32(name)}
//   tensorBytes: the tensor's elements in its own dtype, little-endian (Uint8Array);
//   float32: the tensor as a Float32Array (float32 and float16 tensors).
// Every count, length and offset is checked against the buffer before it is used; a damaged
// file throws McwError naming the tensor and the byte offset.

export class McwError extends Error {}

const MAGIC = [0x4d, 0x43, 0x57, 0x31]; // "MCW1"
const HUFFMAN_MAX_LEN = 16;
const ITEMSIZE = { float32: 4, float16: 2, float64: 8, int8: 1, uint8: 1, int16: 2, uint16: 2, int32: 4, uint32: 4, uint64: 8, int64: 8, bool: 1 };

function fail(msg) {
  throw new McwError(msg);
}

function itemsize(dtype) {
  const n = ITEMSIZE[dtype];
  if (!n) fail(`dtype '${String(dtype).slice(0, 32)}' is not supported by the JavaScript decoder`);
  return n;
}

function count(shape) {
  let n = 1;
  for (const d of shape) n *= d;
  if (!Number.isSafeInteger(n)) fail(`shape ${JSON.stringify(shape)} is too large`);
  return n;
}

function recordInt(record, key, lo, hi) {
  const v = record[key];
  if (!Number.isInteger(v) || v < lo || v > hi) fail(`record field ${key}=${JSON.stringify(v)} is out of range ${lo} .. ${hi}`);
  return v;
}

// Consecutive, bounds-checked sections of one blob (mconv.codecs.bitstream.BlobReader).
class Reader {
  constructor(bytes, codec) {
    this.bytes = bytes;
    this.codec = codec;
    this.offset = 0;
  }
  take(n, what) {
    if (n < 0 || this.offset + n > this.bytes.length) {
      fail(`${this.codec} blob truncated at byte offset ${this.offset}: ${what} needs ${n} bytes, ${this.bytes.length - this.offset} left`);
    }
    const part = this.bytes.subarray(this.offset, this.offset + n);
    this.offset += n;
    return part;
  }
  finish() {
    if (this.offset !== this.bytes.length) fail(`${this.codec} blob has ${this.bytes.length - this.offset} unexpected trailing bytes at byte offset ${this.offset}`);
  }
}

// -- half <-> single, bit exact (numpy's conversions: NaN payloads kept, round to nearest even)

export function halfToFloatBits(h) {
  const sign = (h & 0x8000) << 16;
  const exp = (h >> 10) & 0x1f;
  let man = h & 0x3ff;
  if (exp === 0x1f) return (sign | 0x7f800000 | (man << 13)) >>> 0;
  if (exp === 0) {
    if (man === 0) return sign >>> 0;
    let e = -1;
    do {
      man <<= 1;
      e++;
    } while ((man & 0x400) === 0);
    return (sign | ((127 - 15 - e) << 23) | ((man & 0x3ff) << 13)) >>> 0;
  }
  return (sign | ((exp - 15 + 127) << 23) | (man << 13)) >>> 0;
}

export function floatToHalfBits(f) {
  const sign = (f >>> 16) & 0x8000;
  const exp = (f >>> 23) & 0xff;
  const man = f & 0x7fffff;
  if (exp === 0xff) return man ? sign | 0x7c00 | Math.max(1, man >>> 13) : sign | 0x7c00;
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    const m = man | 0x800000;
    const shift = 14 - e;
    let half = m >>> shift;
    const rem = m & ((1 << shift) - 1);
    const mid = 1 << (shift - 1);
    if (rem > mid || (rem === mid && (half & 1))) half++;
    return sign | half;
  }
  let half = (e << 10) | (man >>> 13);
  const rem = man & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && (half & 1))) half++;
  return sign | half;
}

// -- index streams -----------------------------------------------------------------------

function unpackBits(bytes, bits, n) {
  const need = Math.floor((n * bits + 7) / 8);
  if (bytes.length !== need) fail(`packed ${bits}-bit stream holds ${bytes.length} bytes, expected ${need}`);
  const out = new Uint8Array(n);
  if (bits === 8) {
    out.set(bytes);
    return out;
  }
  let k = 0;
  for (let i = 0; i < n; i++) {
    let v = 0;
    for (let b = 0; b < bits; b++, k++) v |= ((bytes[k >> 3] >> (k & 7)) & 1) << b;
    out[i] = v;
  }
  return out;
}

function canonicalCodes(lengths) {
  const syms = [];
  for (let s = 0; s < lengths.length; s++) if (lengths[s]) syms.push(s);
  syms.sort((a, b) => lengths[a] - lengths[b] || a - b);
  const codes = new Int32Array(lengths.length);
  let code = 0;
  let prev = 0;
  for (const s of syms) {
    code <<= lengths[s] - prev;
    codes[s] = code;
    code++;
    prev = lengths[s];
  }
  return codes;
}

function huffmanSymbols(reader, n, alphabet, what) {
  const at = reader.offset;
  const bad = (m) => fail(`corrupt ${what} Huffman stream at byte offset ${at}: ${m}`);
  const head = reader.take(16, `${what} Huffman header`);
  const dv = new DataView(head.buffer, head.byteOffset, 16);
  const got = dv.getUint32(0, true);
  const chunk = dv.getUint32(4, true);
  const nbits = dv.getUint32(8, true);
  const alpha = dv.getUint16(12, true);
  const maxLen = head[14];
  if (got !== n || alpha !== alphabet || chunk === 0 || maxLen > HUFFMAN_MAX_LEN) {
    bad(`header says ${got} symbols of ${alpha} (chunk ${chunk}, max length ${maxLen}), record says ${n} of ${alphabet}`);
  }
  const lengths = reader.take(alpha, `${what} Huffman code lengths`);
  const nSync = Math.ceil(n / chunk);
  const syncBytes = reader.take(4 * nSync, `${what} Huffman sync table`);
  const payload = reader.take(Math.floor((nbits + 7) / 8), `${what} Huffman payload`);
  if (n === 0) return new Uint8Array(0);
  let top = 0;
  const used = [];
  for (let s = 0; s < alpha; s++) {
    if (lengths[s]) used.push(s);
    top = Math.max(top, lengths[s]);
  }
  if (top !== maxLen) bad("code lengths disagree with the header");
  if (used.length === 1) {
    if (nbits !== 0 || lengths[used[0]] !== 1) bad("a one-symbol stream must have no payload");
    return new Uint8Array(n).fill(used[0]);
  }
  let kraft = 0;
  for (const s of used) kraft += 2 ** (HUFFMAN_MAX_LEN - lengths[s]);
  if (used.length === 0 || kraft !== 2 ** HUFFMAN_MAX_LEN) bad("code lengths do not form a complete prefix code");
  const sdv = new DataView(syncBytes.buffer, syncBytes.byteOffset, syncBytes.length);
  const sync = new Array(nSync);
  for (let i = 0; i < nSync; i++) sync[i] = sdv.getUint32(4 * i, true);
  for (let i = 1; i < nSync; i++) if (sync[i] < sync[i - 1]) bad("sync table is not increasing within the payload");
  if (sync[0] !== 0 || sync[nSync - 1] > nbits) bad("sync table is not increasing within the payload");
  // window -> (symbol, length) over MAX_LEN-bit windows, MSB of a code first
  const codes = canonicalCodes(lengths);
  const symTab = new Uint8Array(1 << HUFFMAN_MAX_LEN);
  const lenTab = new Uint8Array(1 << HUFFMAN_MAX_LEN);
  for (const s of used) {
    const lo = codes[s] << (HUFFMAN_MAX_LEN - lengths[s]);
    const hi = lo + (1 << (HUFFMAN_MAX_LEN - lengths[s]));
    symTab.fill(s, lo, hi);
    lenTab.fill(lengths[s], lo, hi);
  }
  const step = Math.min(chunk, n);
  const buf = new Uint8Array(payload.length + 2 * step + 4);
  buf.set(payload);
  const out = new Uint8Array(n);
  for (let c = 0; c < nSync; c++) {
    let pos = sync[c];
    const first = c * chunk;
    const last = Math.min(n, first + chunk);
    for (let i = first; i < last; i++) {
      const byte = pos >>> 3;
      const w24 = (buf[byte] << 16) | (buf[byte + 1] << 8) | buf[byte + 2];
      const w = (w24 >>> (8 - (pos & 7))) & 0xffff;
      out[i] = symTab[w];
      pos += lenTab[w];
    }
    const end = c + 1 < nSync ? sync[c + 1] : nbits;
    if (pos !== end) bad(c + 1 < nSync ? "chunks do not end at their sync offsets" : `payload decodes to ${pos} bits, header says ${nbits}`);
  }
  return out;
}

// Interleaved rANS (layout and byte order in core/codecs/rans.py): exactly n symbols < alphabet.
const RANS_LOW = 2 ** 23;
const RANS_LANE_SYMBOLS = 8192;

function ransSymbols(reader, n, alphabet, what) {
  const at = reader.offset;
  const bad = (m) => fail(`corrupt ${what} rANS stream at byte offset ${at}: ${m}`);
  const head = reader.take(16, `${what} rANS header`);
  const dv = new DataView(head.buffer, head.byteOffset, 16);
  const got = dv.getUint32(0, true);
  const lanes = dv.getUint32(4, true);
  const plen = dv.getUint32(8, true);
  const alpha = dv.getUint16(12, true);
  const k = head[14];
  if (got !== n || alpha !== alphabet) bad(`header says ${got} symbols of ${alpha}, record says ${n} of ${alphabet}`);
  if (lanes !== Math.ceil(n / RANS_LANE_SYMBOLS) || (n && (k < 10 || k > 15)) || (!n && k)) {
    bad(`header has ${lanes} lanes and k=${k} for ${n} symbols`);
  }
  const freq = new Array(alpha);
  const cum = new Array(alpha);
  let total = 0;
  for (let s = 0; s < alpha; s++) {
    let v = 0;
    let shift = 0;
    let byte;
    do {
      if (shift > 14) bad("a frequency is not a varint below 2**21");
      byte = reader.take(1, `${what} rANS frequency table`)[0];
      v += (byte & 0x7f) * 2 ** shift;
      shift += 7;
    } while (byte & 0x80);
    freq[s] = v;
    cum[s] = total;
    total += v;
  }
  const states = reader.take(4 * lanes, `${what} rANS states`);
  const payload = reader.take(plen, `${what} rANS payload`);
  if (n === 0) {
    if (total || plen) bad("an empty stream has frequencies or a payload");
    return new Uint8Array(0);
  }
  if (total !== 2 ** k) bad(`frequencies sum to ${total}, not 2**${k}`);
  const slotSym = new Uint8Array(2 ** k);
  for (let s = 0; s < alpha; s++) slotSym.fill(s, cum[s], cum[s] + freq[s]);
  const sdv = new DataView(states.buffer, states.byteOffset, states.length);
  const x = new Array(lanes);
  for (let l = 0; l < lanes; l++) {
    x[l] = sdv.getUint32(4 * l, true);
    if (x[l] < RANS_LOW || x[l] >= RANS_LOW * 256) bad("a lane state lies outside [2**23, 2**31)");
  }
  const mask = 2 ** k - 1;
  const steps = Math.ceil(n / lanes);
  const out = new Uint8Array(n);
  const need = new Array(lanes);
  let pos = 0;
  for (let t = 0; t < steps; t++) {
    const active = t + 1 < steps ? lanes : n - (steps - 1) * lanes;
    let nn = 0;
    for (let l = 0; l < active; l++) {
      const slot = x[l] & mask;
      const s = slotSym[slot];
      out[t * lanes + l] = s;
      x[l] = freq[s] * Math.floor(x[l] / 2 ** k) + slot - cum[s];
      if (x[l] < RANS_LOW) need[nn++] = l;
    }
    for (let round = 0; round < 2 && nn; round++) {
      // first bytes in lane order, then second bytes
      if (nn > plen - pos) bad(`payload ends inside step ${t}`);
      let m = 0;
      for (let i = 0; i < nn; i++) {
        const l = need[i];
        x[l] = x[l] * 256 + payload[pos++];
        if (x[l] < RANS_LOW) need[m++] = l;
      }
      nn = m;
    }
  }
  for (let l = 0; l < lanes; l++) if (x[l] !== RANS_LOW) bad("the lanes do not end at their initial state");
  for (; pos < plen; pos++) if (payload[pos]) bad("padding after the payload is not zero");
  return out;
}

function coder(record) {
  const huffman = record.huffman === undefined ? false : record.huffman;
  const rans = record.rans === undefined ? false : record.rans;
  if (typeof huffman !== "boolean" || typeof rans !== "boolean" || (huffman && rans)) {
    fail("record sets both huffman and rans (or not as booleans)");
  }
  return rans ? "rans" : huffman ? "huffman" : "packed";
}

function indexStream(reader, n, bits, huffman, what) {
  if (huffman === "rans") return ransSymbols(reader, n, 1 << bits, what);
  if (huffman === true || huffman === "huffman") return huffmanSymbols(reader, n, 1 << bits, what);
  return unpackBits(reader.take(Math.floor((n * bits + 7) / 8), `${what} stream`), bits, n);
}

// -- element conversion between dtypes (codebooks stored as float16 for float32 tensors) -----

function convertElements(bytes, from, to, n) {
  if (from === to) return bytes.slice();
  if (from === "float16" && to === "float32") {
    const src = new DataView(bytes.buffer, bytes.byteOffset, bytes.length);
    const out = new Uint8Array(4 * n);
    const dst = new DataView(out.buffer);
    for (let i = 0; i < n; i++) dst.setUint32(4 * i, halfToFloatBits(src.getUint16(2 * i, true)), true);
    return out;
  }
  const Ints = { bool: Uint8Array, int8: Int8Array, uint8: Uint8Array, int16: Int16Array, uint16: Uint16Array,
                 int32: Int32Array, uint32: Uint32Array, int64: BigInt64Array, uint64: BigUint64Array, float64: Float64Array };
  if (to === "float32" && from in Ints) {
    // integer and bool weights are held as floats by the kernels (the plan's rule 2), as the runner does
    const copy = bytes.slice();
    const src = new Ints[from](copy.buffer, 0, n);
    const out = new Float32Array(n);
    for (let i = 0; i < n; i++) out[i] = from === "bool" ? (src[i] ? 1 : 0) : Number(src[i]);
    return new Uint8Array(out.buffer);
  }
  return fail(`values stored as ${from} for a ${to} tensor are not supported by the JavaScript decoder`);
}

function gather(table, size, indices, tableOffsetOf) {
  const out = new Uint8Array(indices.length * size);
  for (let i = 0; i < indices.length; i++) {
    const at = (tableOffsetOf(i) + indices[i]) * size;
    out.set(table.subarray(at, at + size), i * size);
  }
  return out;
}

function readCodebook(reader, entries, storeDtype, dtype) {
  const raw = reader.take(entries * itemsize(storeDtype), "codebook");
  return convertElements(raw, storeDtype, dtype, entries);
}

// -- codecs: blob + record -> the tensor's elements in its dtype (little-endian bytes) --------

function decodeRaw(blob, record) {
  const n = count(record.shape) * itemsize(record.dtype);
  if (blob.length !== n) fail(`raw blob holds ${blob.length} bytes, its record needs ${n}`);
  return blob.slice();
}

function decodeFp16(blob, record) {
  const n = count(record.shape);
  if (blob.length !== 2 * n) fail(`fp16 blob holds ${blob.length} bytes, its record needs ${2 * n}`);
  return convertElements(blob, "float16", record.dtype, n);
}

function decodePalette(blob, record) {
  const shape = record.shape;
  const n = count(shape);
  const size = itemsize(record.dtype);
  const bits = recordInt(record, "bits", 1, 8);
  const cb = recordInt(record, "codebook_size", n === 0 ? 0 : 1, 1 << bits);
  // axis (palette.py rule 5): the groups split this axis; absent, axis 0
  const axis = record.axis === undefined ? 0 : recordInt(record, "axis", 0, shape.length - 1);
  const rows = shape.length ? shape[axis] : 1;
  // block (palette.py rule 7): one codebook per run of `block` values, groups = ceil(n / block)
  if (record.block !== undefined && axis !== 0) fail(`record has both block and axis=${axis}`);
  const block = record.block === undefined ? null : recordInt(record, "block", 1, Math.max(1, n));
  const groups = recordInt(record, "groups", block === null ? 1 : 0, block === null ? Math.max(1, rows) : Math.max(1, n));
  if (block !== null && groups !== Math.ceil(n / block)) {
    fail(`record field groups=${groups} is not the ${Math.ceil(n / block)} blocks of ${block} values in ${n}`);
  }
  const reader = new Reader(blob, "palette");
  const table = readCodebook(reader, groups * cb, record.codebook_dtype, record.dtype);
  const indices = indexStream(reader, n, bits, coder(record), "palette indices");
  reader.finish();
  for (let i = 0; i < n; i++) if (indices[i] >= cb) fail(`palette index ${indices[i]} beyond the ${cb}-entry codebook`);
  if (n === 0) return new Uint8Array(0);
  if (block !== null) return gather(table, size, indices, (i) => Math.floor(i / block) * cb);
  // groups split the axis's positions as np.array_split does; element i sits at position
  // floor(i / inner) % rows, inner = the product of the dimensions after the axis
  let inner = 1;
  for (let d = axis + 1; d < shape.length; d++) inner *= shape[d];
  const base = Math.floor(rows / groups);
  const extra = rows % groups;
  const groupAt = new Uint32Array(rows);
  for (let l = 0, g = 0, end = base + (extra > 0 ? 1 : 0); l < rows; l++) {
    if (l === end) end += base + (++g < extra ? 1 : 0);
    groupAt[l] = g * cb;
  }
  return gather(table, size, indices, (i) => groupAt[Math.floor(i / inner) % rows]);
}

function decodeSparse(blob, record) {
  const n = count(record.shape);
  const size = itemsize(record.dtype);
  const indexBits = recordInt(record, "index_bits", 1, 8);
  const entries = recordInt(record, "entries", 0, n);
  const huffman = coder(record);
  const reader = new Reader(blob, "sparse");
  const gaps = indexStream(reader, entries, indexBits, huffman, "sparse gaps");
  let values;
  if (record.values === "raw") {
    values = reader.take(entries * size, "values").slice();
  } else if (record.values === "fp16") {
    values = convertElements(reader.take(entries * 2, "values"), "float16", record.dtype, entries);
  } else if (record.values === "palette") {
    const bits = recordInt(record, "bits", 1, 8);
    const cb = recordInt(record, "codebook_size", entries === 0 ? 0 : 1, 1 << bits);
    const table = readCodebook(reader, cb, record.codebook_dtype, record.dtype);
    const indices = indexStream(reader, entries, bits, huffman, "sparse indices");
    for (let i = 0; i < entries; i++) if (indices[i] >= cb) fail(`sparse palette index ${indices[i]} beyond the ${cb}-entry codebook`);
    values = gather(table, size, indices, () => 0);
  } else {
    fail(`record field values=${JSON.stringify(record.values)} is unknown`);
  }
  reader.finish();
  const out = new Uint8Array(n * size);
  let pos = -1;
  for (let i = 0; i < entries; i++) {
    pos += gaps[i] + 1;
    if (pos >= n) fail(`sparse gaps run to element ${pos} of ${n}`);
    out.set(values.subarray(i * size, (i + 1) * size), pos * size);
  }
  return out;
}

const CODECS = { raw: decodeRaw, fp16: decodeFp16, palette: decodePalette, sparse: decodeSparse };

// -- the container ------------------------------------------------------------------------

export function readContainer(arrayBuffer, label = "weights.mcw") {
  const bytes = new Uint8Array(arrayBuffer);
  const where = (m) => `${label}: ${m}`;
  if (bytes.length < 16) fail(where(`file is ${bytes.length} bytes, shorter than the 16-byte header`));
  for (let i = 0; i < 4; i++) if (bytes[i] !== MAGIC[i]) fail(where("bad magic at byte offset 0 (not an mconv weights.mcw file)"));
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.length);
  const version = dv.getUint32(4, true);
  if (version !== 1) fail(where(`container version ${version} is not supported (this page reads 1)`));
  const indexLen = dv.getUint32(8, true) + dv.getUint32(12, true) * 2 ** 32;
  if (indexLen > bytes.length - 16) fail(where(`index length ${indexLen} runs past the end of the ${bytes.length}-byte file`));
  let index;
  try {
    index = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes.subarray(16, 16 + indexLen)));
  } catch (e) {
    fail(where(`the index at byte offset 16 is not JSON (${e.message.slice(0, 80)})`));
  }
  if (!index || !Array.isArray(index.tensors)) fail(where("index is not an object with a 'tensors' list"));
  const dataStart = 16 + indexLen;
  const entries = new Map();
  for (const t of index.tensors) {
    if (!t || typeof t.name !== "string") fail(where("an index entry has no name"));
    const tn = `tensor '${t.name.slice(0, 60)}'`;
    if (!Number.isSafeInteger(t.offset) || !Number.isSafeInteger(t.nbytes) || t.offset < dataStart || t.nbytes < 0 || t.offset + t.nbytes > bytes.length) {
      fail(where(`${tn} blob lies outside the data area [${dataStart}, ${bytes.length})`));
    }
    const r = t.record;
    if (!r || typeof r.codec !== "string" || !Array.isArray(r.shape) || !r.shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
      fail(where(`${tn}: the record has no valid codec and shape`));
    }
    if (entries.has(t.name)) fail(where(`${tn} listed twice`));
    entries.set(t.name, t);
  }
  function entry(name) {
    const e = entries.get(name);
    if (!e) fail(where(`no tensor named '${String(name).slice(0, 60)}' in the weights container`));
    return e;
  }
  function tensorBytes(name) {
    const e = entry(name);
    const codec = CODECS[e.record.codec];
    if (!codec) fail(where(`tensor '${name.slice(0, 60)}': codec '${String(e.record.codec).slice(0, 20)}' is not decoded by this page`));
    try {
      return codec(bytes.subarray(e.offset, e.offset + e.nbytes), e.record);
    } catch (err) {
      if (err instanceof McwError) fail(where(`tensor '${name.slice(0, 60)}', blob at byte offset ${e.offset}: ${err.message}`));
      throw err;
    }
  }
  function float32(name) {
    const e = entry(name);
    const raw = tensorBytes(name);
    const n = count(e.record.shape);
    const f32 = convertElements(raw, e.record.dtype, "float32", n);
    return new Float32Array(f32.buffer, f32.byteOffset, n);
  }
  async function checkSha256(name) {
    const e = entry(name);
    const subtle = globalThis.crypto && globalThis.crypto.subtle;
    if (!subtle) return null; // not a secure context: the manifest's file hash is all there is
    const digest = new Uint8Array(await subtle.digest("SHA-256", bytes.slice(e.offset, e.offset + e.nbytes)));
    const hex = Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
    if (hex !== e.sha256) fail(where(`tensor '${name.slice(0, 60)}': sha256 mismatch at byte offset ${e.offset}`));
    return true;
  }
  return { entries, tensorBytes, float32, checkSha256 };
}
