/* mcw_decode: decode every tensor of a weights.mcw container to raw float32 little-endian.
 *
 *   mcw_decode FILE                 all tensors, concatenated in index order, to stdout
 *   mcw_decode FILE NAME            one tensor to stdout
 *   mcw_decode FILE -o DIR          one file per tensor: DIR/<name>.f32 (unsafe characters -> '_')
 *   mcw_decode FILE -l              list: name, codec, dtype, elements
 *
 * Container (core/container.py): "MCW1", u32 version, u64 index length, then the index.
 * Version 1: a JSON index {"tensors": [{"name", "offset", "nbytes", "record": {...}}, ...]},
 * 64-byte aligned blobs; the JSON parser is minimal: it reads exactly that shape and skips every
 * other key. Version 2: the binary index of container.py (varints, a word table, implied
 * offsets at 8-byte alignment); every length is checked against the index before it is used.
 * Versions 3, 4 and 5: see index_bin.
 * Exit status: 0 ok, 2 bad input (one line on stderr naming the file and tensor), 3 I/O error.
 *
 * Build: cc -std=c99 -O2 -o mcw_decode mcw_decode.c decoder.c
 */
#include "decoder.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME_MAX_LEN 1024
#define MAX_DIMS 16

typedef struct {
    const char *s, *end;
    int bad;
} json;

typedef struct {
    char name[NAME_MAX_LEN];
    uint64_t offset, nbytes, shape[MAX_DIMS];
    int ndim, have_offset, have_nbytes, have_codec, have_dtype, unsupported_dtype;
    int have_axis, bad_axis; /* the record's palette "axis", and whether it is not an integer */
    uint64_t axis;
    char codec[32], dtype[32], codebook_dtype[32], values[32];
    mcw_record rec;
} tensor;

static const char *prog_file = "";

static void ws(json *j) {
    while (j->s < j->end && (*j->s == ' ' || *j->s == '\n' || *j->s == '\r' || *j->s == '\t')) j->s++;
}

static int expect(json *j, char c) {
    ws(j);
    if (j->s < j->end && *j->s == c) { j->s++; return 1; }
    j->bad = 1;
    return 0;
}

static int peek(json *j, char c) {
    ws(j);
    return j->s < j->end && *j->s == c;
}

static void put_utf8(char *out, size_t cap, size_t *n, unsigned cp) {
    unsigned char b[4];
    int k = 0, i;
    if (cp < 0x80) b[k++] = (unsigned char)cp;
    else if (cp < 0x800) b[k++] = (unsigned char)(0xC0 | cp >> 6), b[k++] = (unsigned char)(0x80 | (cp & 0x3F));
    else b[k++] = (unsigned char)(0xE0 | cp >> 12), b[k++] = (unsigned char)(0x80 | (cp >> 6 & 0x3F)),
         b[k++] = (unsigned char)(0x80 | (cp & 0x3F));
    for (i = 0; i < k; i++) if (*n + 1 < cap) out[(*n)++] = (char)b[i];
}

/* A JSON string into out (truncated to cap-1 bytes; \u escapes to UTF-8, surrogates kept as-is). */
static void string(json *j, char *out, size_t cap) {
    size_t n = 0;
    if (!expect(j, '"')) return;
    while (j->s < j->end && *j->s != '"') {
        char c = *j->s++;
        if (c == '\\') {
            if (j->s >= j->end) break;
            c = *j->s++;
            if (c == 'u') {
                unsigned cp = 0;
                int k;
                for (k = 0; k < 4; k++, j->s++) {
                    char h = j->s < j->end ? *j->s : 'x';
                    cp = cp << 4 | (unsigned)(h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                              : h >= 'A' && h <= 'F' ? h - 'A' + 10 : (j->bad = 1, 0));
                }
                put_utf8(out, cap, &n, cp);
                continue;
            }
            c = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c == 'b' ? '\b' : c == 'f' ? '\f' : c;
        }
        if (n + 1 < cap) out[n++] = c;
    }
    if (cap) out[n] = '\0';
    if (!expect(j, '"')) j->bad = 1;
}

static uint64_t integer(json *j) {
    uint64_t v = 0;
    int digits = 0;
    ws(j);
    while (j->s < j->end && *j->s >= '0' && *j->s <= '9') {
        if (v > (UINT64_MAX - 9) / 10) j->bad = 1;
        v = v * 10 + (uint64_t)(*j->s++ - '0'), digits++;
    }
    if (!digits || (j->s < j->end && (*j->s == '.' || *j->s == 'e' || *j->s == 'E' || *j->s == '-'))) j->bad = 1;
    return v;
}

static void skip(json *j, int depth) {
    ws(j);
    if (depth > 64 || j->s >= j->end) { j->bad = 1; return; }
    if (*j->s == '"') { char tmp[2]; string(j, tmp, sizeof tmp); return; }
    if (*j->s == '{' || *j->s == '[') {
        char close = *j->s == '{' ? '}' : ']';
        int object = *j->s == '{';
        j->s++;
        if (peek(j, close)) { j->s++; return; }
        do {
            if (object) { char tmp[2]; string(j, tmp, sizeof tmp); expect(j, ':'); }
            skip(j, depth + 1);
        } while (!j->bad && peek(j, ',') && j->s++);
        expect(j, close);
        return;
    }
    while (j->s < j->end && strchr(",}] \n\r\t", *j->s) == NULL) j->s++; /* number, true, false, null */
}

static int boolean(json *j) {
    ws(j);
    if (j->end - j->s >= 4 && !strncmp(j->s, "true", 4)) { j->s += 4; return 1; }
    if (j->end - j->s >= 5 && !strncmp(j->s, "false", 5)) { j->s += 5; return 0; }
    j->bad = 1;
    return 0;
}

static int dtype_code(const char *name, int *unsupported) {
    if (!strcmp(name, "float32")) return MCW_F32;
    if (!strcmp(name, "float16")) return MCW_F16;
    if (!strcmp(name, "bfloat16")) return MCW_BF16;
    *unsupported = 1;
    return -1;
}

/* A record's palette block: 0 means "no block" to the decoder, so a recorded 0 (never valid)
 * becomes a length no tensor has, which the decoder refuses as Python does. */
static uint64_t present_block(uint64_t v) {
    return v ? v : UINT64_MAX;
}

static void record(json *j, tensor *t) {
    char key[64];
    mcw_record *r = &t->rec;
    r->groups = 1;
    if (!expect(j, '{')) return;
    if (peek(j, '}')) { j->s++; return; }
    do {
        string(j, key, sizeof key);
        expect(j, ':');
        if (!strcmp(key, "codec")) string(j, t->codec, sizeof t->codec), t->have_codec = 1;
        else if (!strcmp(key, "dtype")) string(j, t->dtype, sizeof t->dtype), t->have_dtype = 1;
        else if (!strcmp(key, "codebook_dtype")) string(j, t->codebook_dtype, sizeof t->codebook_dtype);
        else if (!strcmp(key, "values")) string(j, t->values, sizeof t->values);
        else if (!strcmp(key, "huffman")) r->huffman = boolean(j);
        else if (!strcmp(key, "rans")) r->rans = boolean(j);
        else if (!strcmp(key, "bits")) r->bits = (int)(integer(j) & 0xFF);
        else if (!strcmp(key, "index_bits")) r->index_bits = (int)(integer(j) & 0xFF);
        else if (!strcmp(key, "codebook_size")) r->codebook_size = (uint32_t)integer(j);
        else if (!strcmp(key, "groups")) r->groups = integer(j);
        else if (!strcmp(key, "block")) r->block = present_block(integer(j));
        else if (!strcmp(key, "axis")) t->axis = integer(j), t->have_axis = 1;
        else if (!strcmp(key, "entries")) r->entries = integer(j);
        else if (!strcmp(key, "shape")) {
            expect(j, '[');
            if (peek(j, ']')) j->s++;
            else {
                do {
                    if (t->ndim >= MAX_DIMS) { j->bad = 1; break; }
                    t->shape[t->ndim++] = integer(j);
                } while (!j->bad && peek(j, ',') && j->s++);
                expect(j, ']');
            }
        } else skip(j, 1);
    } while (!j->bad && peek(j, ',') && j->s++);
    expect(j, '}');
}

static void tensor_entry(json *j, tensor *t) {
    char key[64];
    memset(t, 0, sizeof *t);
    if (!expect(j, '{')) return;
    do {
        string(j, key, sizeof key);
        expect(j, ':');
        if (!strcmp(key, "name")) string(j, t->name, sizeof t->name);
        else if (!strcmp(key, "offset")) t->offset = integer(j), t->have_offset = 1;
        else if (!strcmp(key, "nbytes")) t->nbytes = integer(j), t->have_nbytes = 1;
        else if (!strcmp(key, "record")) record(j, t);
        else skip(j, 1);
    } while (!j->bad && peek(j, ',') && j->s++);
    expect(j, '}');
}

/* Fill the decoder's record from the parsed fields; returns a reason or NULL. */
static const char *finish(tensor *t) {
    mcw_record *r = &t->rec;
    uint64_t count = 1;
    int i;
    if (!t->have_offset || !t->have_nbytes || !t->have_codec || !t->have_dtype) return "index entry lacks a field";
    for (i = 0; i < t->ndim; i++) {
        if (t->shape[i] && count > UINT64_MAX / t->shape[i]) return "shape overflows";
        count *= t->shape[i];
    }
    r->count = count;
    r->rows = t->ndim ? t->shape[0] : 1;
    /* palette "axis" (palette.py rule 5): absent is axis 0; one that is not an axis of the shape
     * becomes -1, which the decoder refuses as Python does */
    r->axis = !t->have_axis ? 0 : t->bad_axis || t->axis >= (uint64_t)t->ndim ? -1 : (int)t->axis;
    if (r->axis > 0) {
        r->axis_len = t->shape[r->axis];
        for (r->axis_inner = 1, i = r->axis + 1; i < t->ndim; i++) /* saturates: only an empty tensor's can */
            r->axis_inner = t->shape[i] && r->axis_inner > UINT64_MAX / t->shape[i] ? UINT64_MAX
                                                                                    : r->axis_inner * t->shape[i];
    }
    r->dtype = dtype_code(t->dtype, &t->unsupported_dtype);
    r->codebook_dtype = t->codebook_dtype[0] ? dtype_code(t->codebook_dtype, &t->unsupported_dtype) : MCW_F32;
    if (t->unsupported_dtype) return "dtype not supported by the C decoder (float32, float16, bfloat16 only)";
    if (!strcmp(t->codec, "raw")) r->codec = MCW_RAW;
    else if (!strcmp(t->codec, "fp16")) r->codec = MCW_FP16;
    else if (!strcmp(t->codec, "palette")) r->codec = MCW_PALETTE;
    else if (!strcmp(t->codec, "sparse")) r->codec = MCW_SPARSE;
    else return "codec not supported by the C decoder";
    r->values = !strcmp(t->values, "fp16") ? MCW_VALUES_FP16 : !strcmp(t->values, "palette") ? MCW_VALUES_PALETTE
              : !strcmp(t->values, "raw") || !t->values[0] ? MCW_VALUES_RAW : -1;
    if (count > ((size_t)-1) / sizeof(float)) return "tensor too large for this machine";
    return NULL;
}

/* -- version 2: the binary index ------------------------------------------------------------ */

/* Must equal WORDS in core/container.py, in order. */
static const char *const WORDS[] = {
    "codec", "dtype", "shape", "streams", "bits", "codebook_size", "codebook_dtype", "groups",
    "huffman", "index_bits", "entries", "nonzeros", "values", "chunk", "raw", "fp16", "palette",
    "sparse", "float32", "float16", "float64", "bfloat16", "int8", "uint8", "int16", "uint16",
    "int32", "uint32", "int64", "uint64", "bool", "codebook", "indices", "gaps", "data", "symbols",
    "rans"};
#define NWORDS (sizeof WORDS / sizeof WORDS[0])

typedef struct {
    const unsigned char *p, *end;
    int bad;
} bin;

static uint64_t varint(bin *b) {
    uint64_t v = 0;
    int shift = 0;
    for (;;) {
        unsigned char c;
        if (b->p >= b->end || shift >= 63) { b->bad = 1; return 0; }
        c = *b->p++;
        v |= (uint64_t)(c & 0x7F) << shift;
        shift += 7;
        if (!(c & 0x80)) break;
    }
    if (v >> 63) b->bad = 1;
    return v;
}

/* A word into out (NUL-terminated, truncated to cap-1 bytes; a literal is skipped past). */
static void word(bin *b, char *out, size_t cap) {
    uint64_t k = varint(b), n;
    out[0] = '\0';
    if (b->bad) return;
    if (k < NWORDS) { snprintf(out, cap, "%s", WORDS[k]); return; }
    n = k - NWORDS;
    if (n > (uint64_t)(b->end - b->p)) { b->bad = 1; return; }
    snprintf(out, cap, "%.*s", (int)(n < cap - 1 ? n : cap - 1), (const char *)b->p);
    b->p += n;
}

/* One record value: the fields the decoder needs are kept, the others skipped. */
static void value_v2(bin *b, tensor *t, const char *key) {
    mcw_record *r = &t->rec;
    uint64_t n, i, v = 0;
    unsigned char tag;
    char text[32];
    if (b->p >= b->end) { b->bad = 1; return; }
    tag = *b->p++;
    if (tag != 0 && !strcmp(key, "axis")) t->have_axis = 1, t->bad_axis = 1; /* not an integer: refused */
    if (tag == 0) {
        v = varint(b);
        if (!strcmp(key, "bits")) r->bits = (int)(v & 0xFF);
        else if (!strcmp(key, "index_bits")) r->index_bits = (int)(v & 0xFF);
        else if (!strcmp(key, "codebook_size")) r->codebook_size = (uint32_t)v;
        else if (!strcmp(key, "groups")) r->groups = v;
        else if (!strcmp(key, "block")) r->block = present_block(v);
        else if (!strcmp(key, "axis")) t->axis = v, t->have_axis = 1;
        else if (!strcmp(key, "entries")) r->entries = v;
    } else if (tag == 1) {
        word(b, text, sizeof text);
        if (!strcmp(key, "codec")) snprintf(t->codec, sizeof t->codec, "%s", text), t->have_codec = 1;
        else if (!strcmp(key, "dtype")) snprintf(t->dtype, sizeof t->dtype, "%s", text), t->have_dtype = 1;
        else if (!strcmp(key, "codebook_dtype")) snprintf(t->codebook_dtype, sizeof t->codebook_dtype, "%s", text);
        else if (!strcmp(key, "values")) snprintf(t->values, sizeof t->values, "%s", text);
    } else if (tag == 2 || tag == 3) {
        if (!strcmp(key, "huffman")) r->huffman = tag == 3;
        else if (!strcmp(key, "rans")) r->rans = tag == 3;
    } else if (tag == 4 || tag == 5) {
        n = varint(b);
        if (b->bad || n > (uint64_t)(b->end - b->p)) { b->bad = 1; return; }
        if (tag == 4 && !strcmp(key, "shape")) {
            if (n > MAX_DIMS) { b->bad = 1; return; }
            t->ndim = (int)n;
        }
        for (i = 0; i < n && !b->bad; i++) {
            if (tag == 5) word(b, text, sizeof text);
            v = varint(b);
            if (tag == 4 && !strcmp(key, "shape")) t->shape[i] = v;
        }
    } else b->bad = 1;
}

static int die(const char *name, const char *why, int code);

/* Element size of a numeric dtype name (8 for names this decoder does not know). */
static uint64_t dtype_size(const char *d) {
    if (!strcmp(d, "int8") || !strcmp(d, "uint8") || !strcmp(d, "bool")) return 1;
    if (!strcmp(d, "float16") || !strcmp(d, "bfloat16") || !strcmp(d, "int16") || !strcmp(d, "uint16")) return 2;
    if (!strcmp(d, "float32") || !strcmp(d, "int32") || !strcmp(d, "uint32")) return 4;
    return 8;
}

#define RECORD_BACKREF 64
#define SMALL_BLOB 16      /* version 4: blobs shorter than this have no CRC of their own */
#define SMALL_BLOB_V5 1024 /* version 5: the same */
enum { HEAD_GENERIC, HEAD_PALETTE, HEAD_FP16, HEAD_RAW }; /* version 5 record heads; k + 3: k back */

/* Every tensor of a version 2 or 3 index, in order; calls visit for each (offsets implied).
 * Version 3 (container.py): names front-coded against the previous one, a CRC-32 instead of
 * the sha256, a record may repeat one of the last 64, and blobs aligned to their element size
 * (raw, fp16) or not at all (coded). Version 4: no CRC for blobs under SMALL_BLOB bytes (one
 * shared CRC ends the index), and a record's field count says whether it is slim. Version 5:
 * blobs under SMALL_BLOB_V5 share the CRC, and a record starts with a head: 0 a version 4
 * record, 1 a palette (shape, bits, codebook size, flags: bit 0 rans), 2 fp16 and 3 raw float32
 * (the shape alone), k + 3 the record of the tensor k back; short forms take every other field
 * from the version 4 derivations. */
static int index_bin(const unsigned char *data, uint64_t size, uint64_t index_len, int version,
                     int (*visit)(tensor *, void *), void *ctx) {
    bin b;
    uint64_t count, i, offset = 16 + index_len, prev_len = 0, nrecent = 0;
    char err[160];
    unsigned char *prev = malloc((size_t)index_len + 1); /* a name is never longer than the index */
    tensor *recent = version >= 3 ? malloc(RECORD_BACKREF * sizeof *recent) : NULL;
    int rc = 0, small = 0;
    if (!prev || (version >= 3 && !recent)) { free(prev), free(recent); return die(NULL, "out of memory", 3); }
    b.p = data + 16, b.end = b.p + index_len, b.bad = 0;
    count = varint(&b);
    if (count > index_len) b.bad = 1;
    for (i = 0; !b.bad && i < count; i++) {
        tensor t;
        uint64_t n, shared = 0, fields, f, back = 0, head = HEAD_GENERIC, align = 8, crc_len = 32;
        int slim = 0;
        const char *why;
        memset(&t, 0, sizeof t);
        t.rec.groups = 1;
        if (version >= 3) {
            shared = varint(&b);
            if (b.bad || shared > prev_len) { b.bad = 1; break; }
        }
        n = varint(&b);
        if (b.bad || n > (uint64_t)(b.end - b.p)) { b.bad = 1; break; }
        memcpy(prev + shared, b.p, (size_t)n);
        prev_len = shared + n;
        b.p += n;
        snprintf(t.name, sizeof t.name, "%.*s", (int)(prev_len < NAME_MAX_LEN - 1 ? prev_len : NAME_MAX_LEN - 1),
                 (const char *)prev);
        t.nbytes = varint(&b), t.have_nbytes = 1;
        if (version >= 3) crc_len = (version == 4 && t.nbytes < SMALL_BLOB) || (version == 5 && t.nbytes < SMALL_BLOB_V5) ? 0 : 4;
        small |= crc_len == 0;
        if (b.bad || (uint64_t)(b.end - b.p) < crc_len) { b.bad = 1; break; }
        b.p += crc_len; /* CRC-32 / sha256: checked by the Python loader; this tool trusts the manifest */
        if (version == 5) {
            head = varint(&b);
            back = head > HEAD_RAW ? head - HEAD_RAW : 0;
        } else if (version >= 3) back = varint(&b);
        if (b.bad || back > nrecent || back > RECORD_BACKREF) { b.bad = 1; break; }
        if (back) { /* the record of a recent tensor; name and sizes are this one's */
            char name[NAME_MAX_LEN];
            uint64_t nbytes = t.nbytes;
            memcpy(name, t.name, sizeof name);
            t = recent[(nrecent - back) % RECORD_BACKREF];
            memcpy(t.name, name, sizeof name);
            t.nbytes = nbytes;
        } else if (head != HEAD_GENERIC) { /* version 5's short forms */
            uint64_t d, flags;
            n = varint(&b);
            if (b.bad || n > MAX_DIMS) { b.bad = 1; break; }
            t.ndim = (int)n;
            for (d = 0; d < n && !b.bad; d++) t.shape[d] = varint(&b);
            snprintf(t.codec, sizeof t.codec, "%s", head == HEAD_PALETTE ? "palette" : head == HEAD_FP16 ? "fp16" : "raw");
            t.have_codec = 1;
            snprintf(t.dtype, sizeof t.dtype, "float32"), t.have_dtype = 1;
            if (head == HEAD_PALETTE) {
                t.rec.bits = (int)(varint(&b) & 0xFF);
                t.rec.codebook_size = (uint32_t)varint(&b);
                if (b.bad || b.p >= b.end) { b.bad = 1; break; }
                flags = *b.p++;
                if (flags & ~1u) { b.bad = 1; break; }
                t.rec.rans = (int)(flags & 1);
                snprintf(t.codebook_dtype, sizeof t.codebook_dtype, "float16");
            }
        } else {
            fields = varint(&b);
            if (version >= 4) slim = (int)(fields & 1), fields >>= 1;
            if (fields > (uint64_t)(b.end - b.p)) b.bad = 1;
            for (f = 0; !b.bad && f < fields; f++) {
                char key[64];
                word(&b, key, sizeof key);
                if (!b.bad) value_v2(&b, &t, key);
            }
            if (slim) { /* version 4: the fields a slim record leaves out (container.py's _derived) */
                if (!t.have_dtype) snprintf(t.dtype, sizeof t.dtype, "float32"), t.have_dtype = 1;
                if (!strcmp(t.codec, "palette") && !t.codebook_dtype[0])
                    snprintf(t.codebook_dtype, sizeof t.codebook_dtype, "float16");
            } /* groups 1 and huffman false are this decoder's defaults already */
        }
        if (b.bad) break;
        if (version >= 3) {
            recent[nrecent++ % RECORD_BACKREF] = t;
            align = !strcmp(t.codec, "raw") ? dtype_size(t.dtype) : !strcmp(t.codec, "fp16") ? 2 : 1;
        }
        offset += (align - offset % align) % align;
        t.offset = offset, t.have_offset = 1;
        if ((why = finish(&t))) { snprintf(err, sizeof err, ": %s", why); rc = die(t.name, err, 2); break; }
        if (t.nbytes > size - offset) { rc = die(t.name, ": blob runs past the end of the file", 2); break; }
        offset += t.nbytes;
        if ((rc = visit(&t, ctx))) break;
    }
    free(prev), free(recent);
    if (rc) return rc;
    if (!b.bad && small) { /* versions 4 and 5: the small blobs' one CRC-32 ends the index */
        if (b.end - b.p < 4) b.bad = 1;
        else b.p += 4;
    }
    if (b.bad || b.p != b.end) {
        snprintf(err, sizeof err, "byte offset %lu: binary index not understood", (unsigned long)(b.p - data));
        return die(NULL, err, 2);
    }
    return 0;
}

static int die(const char *name, const char *why, int code) {
    const unsigned char *c;
    fprintf(stderr, "mcw_decode: %s: %s", prog_file, name ? "tensor " : "");
    for (c = (const unsigned char *)(name ? name : ""); *c; c++) { /* names come from the file: one line */
        if (*c < 0x20 || *c == 0x7F) fprintf(stderr, "\\x%02x", *c);
        else fputc(*c, stderr);
    }
    fprintf(stderr, "%s\n", why);
    return code;
}

static int write_le_floats(FILE *f, const float *v, uint64_t n) {
    unsigned char buf[4096];
    uint64_t i;
    size_t k = 0;
    for (i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        buf[k++] = (unsigned char)u, buf[k++] = (unsigned char)(u >> 8);
        buf[k++] = (unsigned char)(u >> 16), buf[k++] = (unsigned char)(u >> 24);
        if (k == sizeof buf) { if (fwrite(buf, 1, k, f) != k) return -1; k = 0; }
    }
    return k && fwrite(buf, 1, k, f) != k ? -1 : 0;
}

typedef struct {
    const unsigned char *data;
    uint64_t size;
    const char *only, *out_dir;
    int list, found;
} job;

/* List, or decode and write, one tensor (offset and nbytes already checked against the file). */
static int emit(tensor *t, void *ctx) {
    job *jb = ctx;
    float *values;
    char err[512];
    if (jb->only && strcmp(jb->only, t->name)) return 0;
    jb->found++;
    if (jb->list) {
        printf("%s\t%s\t%s\t%llu\n", t->name, t->codec, t->dtype, (unsigned long long)t->rec.count);
        return 0;
    }
    values = malloc((size_t)t->rec.count * sizeof *values + 1);
    if (!values) return die(t->name, ": out of memory", 3);
    if (mcw_decode_tensor(&t->rec, jb->data + t->offset, (size_t)t->nbytes, values, err, sizeof err)) {
        char msg[600];
        snprintf(msg, sizeof msg, ": %s blob: %s", t->codec, err);
        free(values);
        return die(t->name, msg, 2);
    }
    if (jb->out_dir) {
        char path[4096], *c;
        FILE *o;
        snprintf(path, sizeof path, "%s/%s.f32", jb->out_dir, t->name);
        for (c = path + strlen(jb->out_dir) + 1; *c; c++)
            if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                  *c == '.' || *c == '-' || *c == '_')) *c = '_';
        if (!(o = fopen(path, "wb")) || write_le_floats(o, values, t->rec.count) || fclose(o)) {
            free(values);
            return die(t->name, ": cannot write output file", 3);
        }
    } else if (write_le_floats(stdout, values, t->rec.count)) {
        free(values);
        return die(t->name, ": cannot write to stdout", 3);
    }
    free(values);
    return 0;
}

int main(int argc, char **argv) {
    const char *out_dir = NULL, *only = NULL;
    int list = 0, i, rc = 0;
    FILE *f;
    unsigned char *data;
    long size;
    uint32_t version;
    uint64_t index_len;
    json j;
    job jb;
    char err[512];
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-o") && i + 1 < argc) out_dir = argv[++i];
        else if (!strcmp(argv[i], "-l")) list = 1;
        else if (!prog_file[0]) prog_file = argv[i];
        else only = argv[i];
    }
    if (!prog_file[0]) {
        fprintf(stderr, "usage: mcw_decode FILE [NAME] [-o DIR] [-l]\n");
        return 2;
    }
    if (!(f = fopen(prog_file, "rb"))) return die(NULL, "cannot open", 2);
    if (fseek(f, 0, SEEK_END) || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) return die(NULL, "cannot seek", 3);
    data = malloc((size_t)size + 1);
    if (!data || fread(data, 1, (size_t)size, f) != (size_t)size) return die(NULL, "cannot read", 3);
    fclose(f);
    if (size < 16 || memcmp(data, "MCW1", 4)) return die(NULL, "byte offset 0: not a weights.mcw file (magic)", 2);
    version = data[4] | data[5] << 8 | data[6] << 16 | (uint32_t)data[7] << 24;
    if (version < 1 || version > 5)
        return die(NULL, "byte offset 4: unsupported container version (this decoder reads 1 to 5)", 2);
    for (index_len = 0, i = 7; i >= 0; i--) index_len = index_len << 8 | data[8 + i];
    if (index_len > (uint64_t)size - 16) return die(NULL, "byte offset 8: index runs past the end of the file", 2);
    jb.data = data, jb.size = (uint64_t)size, jb.only = only, jb.out_dir = out_dir, jb.list = list, jb.found = 0;
    if (version >= 2) {
        if ((rc = index_bin(data, (uint64_t)size, index_len, (int)version, emit, &jb))) return rc;
        if (only && !jb.found) return die(only, ": no such tensor", 2);
        free(data);
        return 0;
    }
    j.s = (const char *)data + 16, j.end = j.s + index_len, j.bad = 0;
    expect(&j, '{');
    do {
        char key[64];
        string(&j, key, sizeof key);
        expect(&j, ':');
        if (j.bad || strcmp(key, "tensors")) { skip(&j, 1); continue; }
        expect(&j, '[');
        if (peek(&j, ']')) { j.s++; continue; }
        do {
            tensor t;
            const char *why;
            tensor_entry(&j, &t);
            if (j.bad) break;
            if ((why = finish(&t))) return die(t.name, why[0] ? (sprintf(err, ": %s", why), err) : why, 2);
            if (t.offset > (uint64_t)size || t.nbytes > (uint64_t)size - t.offset)
                return die(t.name, ": blob runs past the end of the file", 2);
            if ((rc = emit(&t, &jb))) return rc;
        } while (!j.bad && peek(&j, ',') && j.s++);
        expect(&j, ']');
    } while (!j.bad && peek(&j, ',') && j.s++);
    expect(&j, '}');
    if (j.bad) {
        sprintf(err, "byte offset %lu: JSON index not understood", (unsigned long)(j.s - (const char *)data));
        return die(NULL, err, 2);
    }
    if (only && !jb.found) return die(only, ": no such tensor", 2);
    free(data);
    return rc;
}
