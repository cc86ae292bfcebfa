/* Portable C99 decoder for mconv weight blobs (the codecs of mconv.codecs).
 *
 * One call decodes one tensor's blob, given the fields of its codec record, into float32.
 * No dependencies beyond libc; byte order independent (every multi-byte field is assembled
 * from little-endian bytes). Blob layouts are documented in core/codecs/{palette,sparse,
 * huffman}.py; this file must follow them bit for bit.
 *
 * Supported: codecs raw, fp16, palette (groups along any axis or per-block codebooks, float16/float32
 * codebooks, packed, Huffman or rANS indices), sparse (raw/fp16/palette values, packed, Huffman or rANS gaps and indices); dtypes
 * float32 and float16 (widened to float32, exactly).
 */
#ifndef MCW_DECODER_H
#define MCW_DECODER_H

#include <stddef.h>
#include <stdint.h>

enum { MCW_RAW = 0, MCW_FP16 = 1, MCW_PALETTE = 2, MCW_SPARSE = 3 };
enum { MCW_F32 = 0, MCW_F16 = 1, MCW_BF16 = 2 };
enum { MCW_VALUES_RAW = 0, MCW_VALUES_FP16 = 1, MCW_VALUES_PALETTE = 2 };

typedef struct {
    int codec;              /* MCW_RAW, MCW_FP16, MCW_PALETTE, MCW_SPARSE */
    int dtype;              /* tensor dtype: MCW_F32, MCW_F16 or MCW_BF16 */
    uint64_t count;         /* elements: product of the shape */
    uint64_t rows;          /* shape[0], or 1 for a 0-d tensor (palette groups split it) */
    int bits;               /* palette index bits, 1..8 */
    uint32_t codebook_size; /* palette entries per group */
    int codebook_dtype;     /* MCW_F32, MCW_F16 or MCW_BF16 */
    uint64_t groups;        /* palette groups along axis 0 (1 when absent); with block, the
                               number of blocks, ceil(count / block) (0 for an empty tensor) */
    uint64_t block;         /* palette values per block, 1..count (palette.py rule 7); 0 when
                               the record has none (groups then split axis 0) */
    int axis;               /* palette groups' axis (palette.py rule 5): 0 when the record has
                               none (groups split rows); -1 when its "axis" is not an axis of the
                               shape (or not an integer), which the decoder refuses */
    uint64_t axis_len;      /* with axis > 0: shape[axis], the positions the groups split */
    uint64_t axis_inner;    /* with axis > 0: the product of shape[axis+1:] (elements per position) */
    int huffman;            /* 1: gap and index streams are canonical-Huffman coded */
    int rans;               /* 1: gap and index streams are rANS coded (core/codecs/rans.py) */
    int index_bits;         /* sparse relative-index bits, 1..8 */
    uint64_t entries;       /* sparse entries, fillers included */
    int values;             /* sparse value codec: MCW_VALUES_* */
} mcw_record;

/* Decode `blob` (nbytes long) into out[0 .. rec->count-1].
 * Returns 0 on success; otherwise writes a one-line reason (with the byte offset) into err. */
int mcw_decode_tensor(const mcw_record *rec, const unsigned char *blob, size_t nbytes, float *out,
                      char *err, size_t errlen);

/* IEEE half -> float, exact (subnormals, infinities and NaN payloads included). */
float mcw_half_to_float(uint16_t h);

#endif
