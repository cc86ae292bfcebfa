/* Portable C99 decoder for mconv weight blobs; see decoder.h and the codec modules beside it. */
#include "decoder.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LEN 16

typedef struct {
    const unsigned char *p;
    size_t n, off;
    char *err;
    size_t errlen;
} reader;

static int fail(reader *r, const char *fmt, ...) {
    va_list ap;
    int k;
    if (r->err && r->errlen) {
        k = snprintf(r->err, r->errlen, "byte offset %lu: ", (unsigned long)r->off);
        if (k >= 0 && (size_t)k < r->errlen) {
            va_start(ap, fmt);
            vsnprintf(r->err + k, r->errlen - (size_t)k, fmt, ap);
            va_end(ap);
        }
    }
    return -1;
}

/* Hand out the next `len` bytes, or fail when the blob is shorter (never read past it). */
static const unsigned char *take(reader *r, uint64_t len, const char *what) {
    const unsigned char *at;
    if (len > r->n - r->off) {
        fail(r, "blob truncated: %s needs %llu bytes, %lu left", what, (unsigned long long)len,
             (unsigned long)(r->n - r->off));
        return NULL;
    }
    at = r->p + r->off;
    r->off += (size_t)len;
    return at;
}

static uint32_t le32(const unsigned char *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float mcw_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
    if (exp == 0x1F) return f32_from_bits(sign | 0x7F800000u | man << 13); /* inf / NaN */
    if (exp == 0) {
        if (man == 0) return f32_from_bits(sign);
        exp = 127 - 15 + 1; /* normalise the subnormal */
        while (!(man & 0x400u)) { man <<= 1; exp--; }
        return f32_from_bits(sign | exp << 23 | (man & 0x3FFu) << 13);
    }
    return f32_from_bits(sign | (exp + 127 - 15) << 23 | man << 13);
}

/* Read `count` elements stored as dtype `dt` (f32, f16 or bf16, little-endian) into out;
   bfloat16 is the top half of a float32, so it widens exactly. */
static int read_floats(reader *r, int dt, uint64_t count, float *out, const char *what) {
    uint64_t i, size = dt == MCW_F32 ? 4 : 2;
    const unsigned char *b;
    if (dt != MCW_F32 && dt != MCW_F16 && dt != MCW_BF16) return fail(r, "%s: unsupported dtype", what);
    if (count > (uint64_t)-1 / size) return fail(r, "%s: count overflows", what);
    if (!(b = take(r, count * size, what))) return -1;
    for (i = 0; i < count; i++) {
        uint32_t h = (uint32_t)b[size * i] | (uint32_t)b[size * i + 1] << 8;
        out[i] = dt == MCW_F16 ? mcw_half_to_float((uint16_t)h)
                 : dt == MCW_BF16 ? f32_from_bits(h << 16)
                                  : f32_from_bits(le32(b + 4 * i));
    }
    return 0;
}

/* Fixed-width, LSB-first packed stream: value i is bits i*bits .. i*bits+bits-1. */
static int read_packed(reader *r, uint64_t count, int bits, unsigned char *out, const char *what) {
    uint64_t i, bit;
    const unsigned char *b;
    if (!(b = take(r, (count * (uint64_t)bits + 7) / 8, what))) return -1;
    for (i = 0, bit = 0; i < count; i++) {
        unsigned v = 0;
        int k;
        for (k = 0; k < bits; k++, bit++) v |= (unsigned)(b[bit >> 3] >> (bit & 7) & 1u) << k;
        out[i] = (unsigned char)v;
    }
    return 0;
}

/* Canonical Huffman stream (layout in huffman.py): exactly `count` symbols < `alphabet`. */
static int read_huffman(reader *r, uint64_t count, unsigned alphabet, unsigned char *out, const char *what) {
    const unsigned char *h, *lengths, *sync, *pay;
    uint32_t n, chunk, nbits, nsync, s, code, kraft = 0;
    unsigned alpha, max_len, len, used = 0, only = 0;
    uint16_t next_code[MAX_LEN + 2], bl_count[MAX_LEN + 2];
    unsigned char *sym_tab, *len_tab;
    uint64_t i, pos = 0, payload_bytes;
    size_t at = r->off;
    if (!(h = take(r, 16, what))) return -1;
    n = le32(h), chunk = le32(h + 4), nbits = le32(h + 8);
    alpha = (unsigned)(h[12] | h[13] << 8), max_len = h[14];
    if (n != count || alpha != alphabet || chunk == 0 || max_len > MAX_LEN) {
        r->off = at;
        return fail(r, "corrupt %s Huffman header (%lu symbols of %u, record says %llu of %u)", what,
                    (unsigned long)n, alpha, (unsigned long long)count, alphabet);
    }
    if (!(lengths = take(r, alpha, what))) return -1;
    nsync = n / chunk + (n % chunk != 0);
    if (!(sync = take(r, (uint64_t)nsync * 4, what))) return -1;
    payload_bytes = ((uint64_t)nbits + 7) / 8;
    if (!(pay = take(r, payload_bytes, what))) return -1;
    if (n == 0) return 0;
    memset(bl_count, 0, sizeof bl_count);
    for (s = 0; s < alpha; s++) {
        if (lengths[s] > max_len) return fail(r, "%s: code length above the header's maximum", what);
        if (lengths[s]) { used++; only = s; bl_count[lengths[s]]++; kraft += 1u << (MAX_LEN - lengths[s]); }
    }
    if (used == 1) { /* one symbol: no payload bits at all */
        if (nbits != 0 || lengths[only] != 1) return fail(r, "%s: one-symbol stream with a payload", what);
        memset(out, (int)only, (size_t)n);
        return 0;
    }
    if (used == 0 || kraft != 1u << MAX_LEN) return fail(r, "%s: code lengths are not a complete prefix code", what);
    sym_tab = malloc(1u << MAX_LEN);
    len_tab = malloc(1u << MAX_LEN);
    if (!sym_tab || !len_tab) { free(sym_tab); free(len_tab); return fail(r, "out of memory"); }
    /* Canonical codes (DEFLATE order), spread over a table indexed by the next 16 bits. */
    code = 0, bl_count[0] = 0;
    for (len = 1; len <= MAX_LEN; len++) { code = (code + bl_count[len - 1]) << 1; next_code[len] = (uint16_t)code; }
    for (s = 0; s < alpha; s++) {
        uint32_t lo, span, k;
        if (!(len = lengths[s])) continue;
        lo = (uint32_t)next_code[len]++ << (MAX_LEN - len), span = 1u << (MAX_LEN - len);
        for (k = 0; k < span; k++) sym_tab[lo + k] = (unsigned char)s, len_tab[lo + k] = (unsigned char)len;
    }
    for (i = 0; i < n; i++) {
        uint32_t w = 0;
        uint64_t byte = pos >> 3;
        int k;
        if (i % chunk == 0 && le32(sync + 4 * (i / chunk)) != pos) {
            free(sym_tab), free(len_tab);
            return fail(r, "%s: symbol %llu is not at its sync offset", what, (unsigned long long)i);
        }
        for (k = 0; k < 3; k++) w = w << 8 | (byte + (uint64_t)k < payload_bytes ? pay[byte + (uint64_t)k] : 0u);
        w = (w >> (8 - (pos & 7))) & 0xFFFFu;
        out[i] = sym_tab[w];
        pos += len_tab[w];
        if (pos > nbits) {
            free(sym_tab), free(len_tab);
            return fail(r, "%s: payload ends inside symbol %llu", what, (unsigned long long)i);
        }
    }
    free(sym_tab), free(len_tab);
    if (pos != nbits) return fail(r, "%s: %llu payload bits left over", what, (unsigned long long)(nbits - pos));
    return 0;
}

/* Interleaved rANS stream (layout and byte order in rans.py): exactly `count` symbols < `alphabet`. */
#define RANS_LOW (1u << 23)
#define RANS_LANE_SYMBOLS 8192u
static int read_rans(reader *r, uint64_t count, unsigned alphabet, unsigned char *out, const char *what) {
    const unsigned char *h, *st, *pay;
    uint32_t n, lanes, plen, total = 0, freq[256], cum[256], *x = NULL, *need = NULL;
    unsigned alpha, k, s;
    unsigned char *slot_sym = NULL;
    uint64_t t, steps, pos = 0, i;
    int rc = 0;
    size_t at = r->off;
    if (!(h = take(r, 16, what))) return -1;
    n = le32(h), lanes = le32(h + 4), plen = le32(h + 8);
    alpha = (unsigned)(h[12] | h[13] << 8), k = h[14];
    if (n != count || alpha != alphabet || alpha > 256) {
        r->off = at;
        return fail(r, "corrupt %s rANS header (%lu symbols of %u, record says %llu of %u)", what,
                    (unsigned long)n, alpha, (unsigned long long)count, alphabet);
    }
    if (lanes != n / RANS_LANE_SYMBOLS + (n % RANS_LANE_SYMBOLS != 0) || (n && (k < 10 || k > 15)) || (!n && k)) {
        r->off = at;
        return fail(r, "corrupt %s rANS header (%lu lanes, k=%u)", what, (unsigned long)lanes, k);
    }
    for (s = 0; s < alpha; s++) { /* LEB128 varints below 2**21 */
        uint32_t v = 0;
        int shift = 0;
        const unsigned char *b;
        do {
            if (shift > 14) return fail(r, "%s: a rANS frequency is not a varint below 2**21", what);
            if (!(b = take(r, 1, what))) return -1;
            v |= (uint32_t)(*b & 0x7Fu) << shift, shift += 7;
        } while (*b & 0x80u);
        freq[s] = v, cum[s] = total, total += v;
        if (total > (1u << 15)) return fail(r, "%s: rANS frequencies exceed 2**15", what);
    }
    if (!(st = take(r, (uint64_t)lanes * 4, what))) return -1;
    if (!(pay = take(r, plen, what))) return -1;
    if (n == 0) return total || plen ? fail(r, "%s: an empty rANS stream has frequencies or a payload", what) : 0;
    if (total != 1u << k) return fail(r, "%s: rANS frequencies sum to %lu, not 2**%u", what, (unsigned long)total, k);
    x = malloc((size_t)lanes * sizeof *x);
    need = malloc((size_t)lanes * sizeof *need);
    slot_sym = malloc((size_t)1 << k);
    if (!x || !need || !slot_sym) { free(x), free(need), free(slot_sym); return fail(r, "out of memory"); }
    for (s = 0; s < alpha; s++) memset(slot_sym + cum[s], (int)s, freq[s]);
    for (i = 0; i < lanes; i++) {
        x[i] = le32(st + 4 * i);
        if (x[i] < RANS_LOW || x[i] >= RANS_LOW << 8) { rc = fail(r, "%s: a rANS lane state is out of range", what); break; }
    }
    steps = ((uint64_t)n + lanes - 1) / lanes;
    for (t = 0; !rc && t < steps; t++) {
        uint32_t active = t + 1 < steps ? lanes : (uint32_t)(n - (steps - 1) * lanes), l, nn = 0, round;
        for (l = 0; l < active; l++) {
            uint32_t slot = x[l] & ((1u << k) - 1);
            unsigned sym = slot_sym[slot];
            out[t * lanes + l] = (unsigned char)sym;
            x[l] = freq[sym] * (x[l] >> k) + slot - cum[sym];
            if (x[l] < RANS_LOW) need[nn++] = l;
        }
        for (round = 0; round < 2 && nn; round++) { /* first bytes in lane order, then second bytes */
            uint32_t m = 0;
            if (nn > plen - pos) { rc = fail(r, "%s: rANS payload ends inside step %llu", what, (unsigned long long)t); break; }
            for (l = 0; l < nn; l++) {
                x[need[l]] = x[need[l]] << 8 | pay[pos++];
                if (x[need[l]] < RANS_LOW) need[m++] = need[l];
            }
            nn = m;
        }
    }
    for (i = 0; !rc && i < lanes; i++)
        if (x[i] != RANS_LOW) rc = fail(r, "%s: rANS lanes do not end at their initial state", what);
    for (; !rc && pos < plen; pos++)
        if (pay[pos]) rc = fail(r, "%s: rANS padding is not zero", what);
    free(x), free(need), free(slot_sym);
    return rc;
}

static int read_symbols(reader *r, uint64_t count, int bits, int huffman, int rans, unsigned char *out,
                        const char *what) {
    if (rans && huffman) return fail(r, "%s: both huffman and rans are set", what);
    if (rans) return read_rans(r, count, 1u << bits, out, what);
    return huffman ? read_huffman(r, count, 1u << bits, out, what) : read_packed(r, count, bits, out, what);
}

/* Groups along axis > 0 (palette.py rule 5): element (o, l, k) of the [outer, L, inner] layout,
 * at (o * L + l) * inner + k, takes its value from group g(l), the groups splitting the L
 * positions like np.array_split (the first L % G groups one position longer). */
static int gather_along_axis(reader *r, const mcw_record *rec, const float *book, const unsigned char *idx,
                             float *out) {
    uint64_t L = rec->axis_len, inner = rec->axis_inner, G = rec->groups, K = rec->codebook_size;
    uint64_t outer = rec->count / (L * inner), base = L / G, extra = L % G, o, l, k, g, end, i = 0;
    for (o = 0; o < outer; o++)
        for (l = 0, g = 0, end = base + (extra > 0); l < L; l++) {
            const float *b;
            if (l == end) g++, end += base + (g < extra);
            b = book + g * K;
            for (k = 0; k < inner; k++, i++) {
                if (idx[i] >= K) return fail(r, "palette index %u beyond the codebook", idx[i]);
                out[i] = b[idx[i]];
            }
        }
    return 0;
}

static int decode_palette(reader *r, const mcw_record *rec, float *out) {
    uint64_t G, K = rec->codebook_size, i, g, base = 0, extra = 0, inner = 0, at = 0, csize;
    float *book;
    unsigned char *idx;
    int rc;
    if (rec->bits < 1 || rec->bits > 8) return fail(r, "palette bits %d out of range", rec->bits);
    if (K > (1u << rec->bits) || (K == 0 && rec->count)) return fail(r, "palette codebook size %llu", (unsigned long long)K);
    if (rec->axis < 0) return fail(r, "palette axis is not an axis of the shape");
    if (rec->axis > 0) { /* groups split axis `axis` (palette.py rule 5) */
        uint64_t L = rec->axis_len;
        if (rec->block) return fail(r, "palette record has both block and axis %d", rec->axis);
        if (rec->groups < 1 || rec->groups > (L ? L : 1))
            return fail(r, "palette groups %llu out of range 1 .. %llu along axis %d", (unsigned long long)rec->groups,
                        (unsigned long long)(L ? L : 1), rec->axis);
        if (rec->count && (!L || !rec->axis_inner || rec->axis_inner > rec->count / L ||
                           rec->count % (L * rec->axis_inner)))
            return fail(r, "palette axis %d does not fit the tensor", rec->axis);
        G = rec->groups;
    } else if (rec->block) { /* one codebook per block of `block` values (palette.py rule 7) */
        if (rec->block > (rec->count ? rec->count : 1))
            return fail(r, "palette block %llu out of range 1 .. %llu", (unsigned long long)rec->block,
                        (unsigned long long)(rec->count ? rec->count : 1));
        G = rec->count / rec->block + (rec->count % rec->block != 0);
        if (rec->groups != G)
            return fail(r, "palette groups %llu is not the %llu blocks of %llu values", (unsigned long long)rec->groups,
                        (unsigned long long)G, (unsigned long long)rec->block);
    } else {
        G = rec->groups ? rec->groups : 1;
        if (G > (rec->rows ? rec->rows : 1)) return fail(r, "palette groups exceed rows");
        base = rec->rows / G, extra = rec->rows % G, inner = rec->rows ? rec->count / rec->rows : 0;
    }
    csize = rec->codebook_dtype == MCW_F32 ? 4 : 2;
    if (K && G > (uint64_t)(r->n - r->off) / K / csize) /* before allocating: the blob must hold it */
        return fail(r, "blob truncated: codebook needs %llu x %llu entries, %lu bytes left", (unsigned long long)G,
                    (unsigned long long)K, (unsigned long)(r->n - r->off));
    book = malloc((size_t)(G * K + 1) * sizeof *book);
    idx = malloc((size_t)rec->count + 1);
    if (!book || !idx) { free(book); free(idx); return fail(r, "out of memory"); }
    rc = read_floats(r, rec->codebook_dtype, G * K, book, "codebook");
    if (!rc) rc = read_symbols(r, rec->count, rec->bits, rec->huffman, rec->rans, idx, "palette indices");
    if (!rc && rec->axis > 0 && rec->count) rc = gather_along_axis(r, rec, book, idx, out);
    for (g = 0; !rc && rec->axis == 0 && g < G; g++) { /* groups split axis 0 like np.array_split; blocks are runs of `block` */
        uint64_t end = at + (base + (g < extra)) * inner;
        if (rec->block) end = rec->count - at > rec->block ? at + rec->block : rec->count;
        else if (G == 1) end = rec->count;
        for (i = at; i < end; i++) {
            if (idx[i] >= K) { rc = fail(r, "palette index %u beyond the codebook", idx[i]); break; }
            out[i] = book[g * K + idx[i]];
        }
        at = end;
    }
    free(book), free(idx);
    return rc;
}

static int decode_sparse(reader *r, const mcw_record *rec, float *out) {
    uint64_t E = rec->entries, K = rec->codebook_size, i, pos;
    unsigned char *gaps, *idx = NULL;
    float *vals, *book = NULL;
    int rc;
    if (rec->index_bits < 1 || rec->index_bits > 8) return fail(r, "sparse index_bits %d out of range", rec->index_bits);
    if (E > rec->count) return fail(r, "sparse entries exceed the tensor");
    gaps = malloc((size_t)E + 1);
    vals = malloc(((size_t)E + 1) * sizeof *vals);
    if (!gaps || !vals) { free(gaps); free(vals); return fail(r, "out of memory"); }
    rc = read_symbols(r, E, rec->index_bits, rec->huffman, rec->rans, gaps, "sparse gaps");
    if (!rc && rec->values == MCW_VALUES_RAW) rc = read_floats(r, rec->dtype, E, vals, "values");
    else if (!rc && rec->values == MCW_VALUES_FP16) rc = read_floats(r, MCW_F16, E, vals, "values");
    else if (!rc && rec->values == MCW_VALUES_PALETTE) {
        if (rec->bits < 1 || rec->bits > 8 || K > (1u << rec->bits) || (K == 0 && E)) {
            rc = fail(r, "sparse palette bits/codebook out of range");
        } else {
            book = malloc((size_t)(K + 1) * sizeof *book);
            idx = malloc((size_t)E + 1);
            if (!book || !idx) rc = fail(r, "out of memory");
            if (!rc) rc = read_floats(r, rec->codebook_dtype, K, book, "codebook");
            if (!rc) rc = read_symbols(r, E, rec->bits, rec->huffman, rec->rans, idx, "sparse indices");
            for (i = 0; !rc && i < E; i++) {
                if (idx[i] >= K) rc = fail(r, "sparse palette index %u beyond the codebook", idx[i]);
                else vals[i] = book[idx[i]];
            }
        }
    } else if (!rc) rc = fail(r, "unknown sparse value codec %d", rec->values);
    if (!rc) {
        memset(out, 0, (size_t)rec->count * sizeof *out);
        for (i = 0, pos = 0; i < E; i++) { /* pos = one past the previous entry */
            pos += gaps[i];
            if (pos >= rec->count) { rc = fail(r, "sparse gaps run past the tensor"); break; }
            out[pos++] = vals[i];
        }
    }
    free(gaps), free(vals), free(book), free(idx);
    return rc;
}

int mcw_decode_tensor(const mcw_record *rec, const unsigned char *blob, size_t nbytes, float *out,
                      char *err, size_t errlen) {
    reader r;
    int rc;
    r.p = blob, r.n = nbytes, r.off = 0, r.err = err, r.errlen = errlen;
    if (err && errlen) err[0] = '\0';
    if (rec->dtype != MCW_F32 && rec->dtype != MCW_F16 && rec->dtype != MCW_BF16)
        return fail(&r, "unsupported tensor dtype");
    switch (rec->codec) {
    case MCW_RAW: rc = read_floats(&r, rec->dtype, rec->count, out, "raw values"); break;
    case MCW_FP16: rc = read_floats(&r, MCW_F16, rec->count, out, "fp16 values"); break;
    case MCW_PALETTE: rc = decode_palette(&r, rec, out); break;
    case MCW_SPARSE: rc = decode_sparse(&r, rec, out); break;
    default: return fail(&r, "unknown codec %d", rec->codec);
    }
    if (!rc && r.off != r.n) return fail(&r, "%lu unexpected trailing bytes", (unsigned long)(r.n - r.off));
    return rc;
}
