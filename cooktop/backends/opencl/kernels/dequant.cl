// Dequantization of GGML weight rows, one "unit" of 32 values at a time.
//
// Block layouts and formulas: ggml-common.h (block_q4_0 ... block_q6_K) and
// ggml-quants.c dequantize_row_*; checked against gguf.quants.dequantize by
// tests/test_ops_parity.py. Exactly one W_<TYPE> macro is defined by the host
// (programs.py). Every type exposes:
//   ROW_BYTES(n)              bytes of a row of n values
//   deq_unit(row, u, &a, &b)  values 32u..32u+15 -> a, 32u+16..32u+31 -> b (float32)
// K-quants (256-value super-blocks) are split into their eight 32-value
// sub-blocks, so every kernel loops over n_in / 32 units whatever the type.
// F32/F16 rows may end in a partial unit: W_FLOAT is defined and deq_elem(row, i)
// reads one value for the tail.
//   QKV                       values per block (32, or 256 for K-quants)
//   dot_block(row, ib, x, acc)  acc + the products of block ib with x (matrix-vector)
// K-quants also have block_scales(row, ib) -> float16 and deq_sub(row, ib, s, scales, &a, &b)
// so mul_mm decodes a super-block's scales once for its eight units. Kernels address row r as
// ROW_PTR(w, r, n) and call DEQ_UNIT / DOT_BLOCK with ROW_LANE(r) (repacked Q4_0 interleaves rows).

// IEEE half -> float by bit manipulation: PoCL's vload_half is a slow library call
// (1.5x slower Q4_0 decode when used for the block scales). Exact for every input,
// subnormals, infinities and NaNs included.
inline float half_bits_to_float(uint h) {
    const uint s = (h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 0x3ffu;
    const uint normal = s | ((e + 112u) << 23) | (m << 13);
    const uint special = s | 0x7f800000u | (m << 13);
    const uint sub = as_uint((float)m * 0x1p-24f) | s;
    return as_float(e == 0u ? sub : (e == 31u ? special : normal));
}
inline float16 half16_bits_to_float16(ushort16 hv) {
    const uint16 h = convert_uint16(hv);
    const uint16 s = (h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 0x3ffu;
    const uint16 normal = s | ((e + 112u) << 23) | (m << 13);
    const uint16 special = s | 0x7f800000u | (m << 13);
    const uint16 sub = as_uint16(convert_float16(m) * 0x1p-24f) | s;
    return as_float16(select(select(normal, special, e == 31u), sub, e == 0u));
}
#if defined(__F16C__) && !defined(COOKTOP_PORTABLE)
// x86 with F16C (clang predefines __F16C__ for PoCL's host target): one vcvtph2ps
typedef short v8hi_f16c __attribute__((vector_size(16)));
inline float load_half_f16c(const global uchar *p) {
    const short8 h = (short8)((short)((uint)p[0] | ((uint)p[1] << 8)), 0, 0, 0, 0, 0, 0, 0);
    return __builtin_ia32_vcvtph2ps((v8hi_f16c)h)[0];
}
#define LOAD_HALF(p) load_half_f16c(p)
#else
#define LOAD_HALF(p) half_bits_to_float((uint)(p)[0] | ((uint)(p)[1] << 8))
#endif

#if defined(W_F32)
#define W_FLOAT 1
#define ROW_BYTES(n) ((size_t)(n) * 4)
inline void deq_unit(const global uchar *row, int u, float16 *a, float16 *b) {
    const global float *r = (const global float *)row;
    *a = vload16(2 * u, r);
    *b = vload16(2 * u + 1, r);
}
inline float deq_elem(const global uchar *row, int i) { return ((const global float *)row)[i]; }

#define QKV 32
inline float16 dot_block(const global uchar *row, int ib, const global float *x, float16 acc) {
    float16 a, b;
    deq_unit(row, ib, &a, &b);
    return fma(b, vload16(2 * ib + 1, x), fma(a, vload16(2 * ib, x), acc));
}

#elif defined(W_F16)
#define W_FLOAT 1
#define ROW_BYTES(n) ((size_t)(n) * 2)
inline void deq_unit(const global uchar *row, int u, float16 *a, float16 *b) {
    const global ushort *r = (const global ushort *)row;
    *a = half16_bits_to_float16(vload16(2 * u, r));
    *b = half16_bits_to_float16(vload16(2 * u + 1, r));
}
inline float deq_elem(const global uchar *row, int i) { return half_bits_to_float(((const global ushort *)row)[i]); }

#define QKV 32
inline float16 dot_block(const global uchar *row, int ib, const global float *x, float16 acc) {
    float16 a, b;
    deq_unit(row, ib, &a, &b);
    return fma(b, vload16(2 * ib + 1, x), fma(a, vload16(2 * ib, x), acc));
}

#elif defined(W_Q8_0)
// block_q8_0 {half d; int8 qs[32]} (34 bytes): y = d * qs
#define ROW_BYTES(n) ((size_t)(n) / 32 * 34)
inline void deq_unit(const global uchar *row, int u, float16 *a, float16 *b) {
    const global uchar *p = row + (size_t)u * 34;
    const float d = LOAD_HALF(p);
    const global char *q = (const global char *)(p + 2);
    *a = convert_float16(vload16(0, q)) * d;
    *b = convert_float16(vload16(1, q)) * d;
}
#define QKV 32
inline float16 dot_block(const global uchar *row, int ib, const global float *x, float16 acc) {
    const global uchar *p = row + (size_t)ib * 34;
    const global char *q = (const global char *)(p + 2);
    const float16 t = convert_float16(vload16(0, q)) * vload16(2 * ib, x)
                    + convert_float16(vload16(1, q)) * vload16(2 * ib + 1, x);
    return fma((float16)LOAD_HALF(p), t, acc);
}

#elif defined(W_Q4_0) && defined(REPACK_Q4_0)
// Q4_0 repacked at upload with 16 rows in the lanes, llama.cpp's block_q4_0x8 idea
// (ggml-cpu/repack.cpp: ggml_gemv/gemm_q4_0_8x8_q8_0) with its own layout, for matrices of
// n_out % 16 == 0 rows where dotq8.cl's 64-byte SIMD path runs (the host decides, KernelCache.repacks;
// kernel `repack` below makes it). Rows 16G..16G+15 (a row group, 16 * ROW_BYTES(n_in) bytes at
// row 16G's place) are n_in / 32 blocks of 288 bytes: half d[16] (lane l: row 16G + l), then four
// 64-byte vectors j = 0..3 whose bytes 4l..4l+3 are qs[4j..4j+3] of row 16G + l's block_q4_0, so
// the low nibbles of vector j hold each row's values 4j..4j+3 in its int32 lane l and the high
// nibbles its values 16+4j..16+4j+3. y = d * (q - 8) as in block_q4_0.
#define ROW_BYTES(n) ((size_t)(n) / 32 * 18)
#define Q4R_BLOCK 288
// row r: its group's start and its lane (what deq_unit / dot_block take for this layout)
#define ROW_PTR(w, r, n) ((w) + (size_t)((r) >> 4) * 16 * ROW_BYTES(n))
#define ROW_LANE(r) ((r) & 15)
inline void deq_unit_l(const global uchar *grp, int l, int u, float16 *a, float16 *b) {
    const global uchar *p = grp + (size_t)u * Q4R_BLOCK;
    const float d = LOAD_HALF(p + 2 * l);
    const global uchar *q = p + 32 + 4 * l;
    const uchar16 z = (uchar16)(vload4(0, q), vload4(0, q + 64), vload4(0, q + 128), vload4(0, q + 192));
    *a = (convert_float16(z & (uchar)15) - 8.0f) * d;
    *b = (convert_float16(z >> (uchar)4) - 8.0f) * d;
}
#define DEQ_UNIT(row, l, u, a, b) deq_unit_l(row, l, u, a, b)
#define QKV 32
inline float16 dot_block_l(const global uchar *grp, int l, int ib, const global float *x, float16 acc) {
    float16 a, b;
    deq_unit_l(grp, l, ib, &a, &b);
    return fma(b, vload16(2 * ib + 1, x), fma(a, vload16(2 * ib, x), acc));
}
#define DOT_BLOCK(row, l, ib, x, acc) dot_block_l(row, l, ib, x, acc)
// src: block_q4_0 rows; dst: the layout above. Global (n_in / 32, n_out / 16): one block of a row group each.
__kernel void repack(const global uchar *src, global uchar *dst, const int n_in) {
    const int b = get_global_id(0);
    const size_t g = get_global_id(1);
    global uchar *d = dst + g * 16 * ROW_BYTES(n_in) + (size_t)b * Q4R_BLOCK;
    for (int l = 0; l < 16; l++) {
        const global uchar *s = src + (16 * g + l) * ROW_BYTES(n_in) + (size_t)b * 18;
        d[2 * l] = s[0];
        d[2 * l + 1] = s[1];
        for (int j = 0; j < 4; j++)
            for (int i = 0; i < 4; i++) d[32 + 64 * j + 4 * l + i] = s[2 + 4 * j + i];
    }
}

#elif defined(W_Q4_0)
// block_q4_0 {half d; uint8 qs[16]} (18 bytes): y[j] = d*((qs[j]&15)-8), y[j+16] = d*((qs[j]>>4)-8)
#define ROW_BYTES(n) ((size_t)(n) / 32 * 18)
inline void deq_unit(const global uchar *row, int u, float16 *a, float16 *b) {
    const global uchar *p = row + (size_t)u * 18;
    const float d = LOAD_HALF(p);
    const uchar16 q = vload16(0, p + 2);
    *a = (convert_float16(q & (uchar)15) - 8.0f) * d;
    *b = (convert_float16(q >> (uchar)4) - 8.0f) * d;
}
#define QKV 32
// d * sum((q - 8) x) folded as d * (q.x - 8 sum(x))
inline float16 dot_block(const global uchar *row, int ib, const global float *x, float16 acc) {
    const global uchar *p = row + (size_t)ib * 18;
    const uchar16 q = vload16(0, p + 2);
    const float16 xa = vload16(2 * ib, x), xb = vload16(2 * ib + 1, x);
    const float16 t = convert_float16(q & (uchar)15) * xa + convert_float16(q >> (uchar)4) * xb - 8.0f * (xa + xb);
    return fma((float16)LOAD_HALF(p), t, acc);
}

#elif defined(W_Q4_1)
// block_q4_1 {half d; half m; uint8 qs[16]} (20 bytes): y = d*q + m
#define ROW_BYTES(n) ((size_t)(n) / 32 * 20)
inline void deq_unit(const global uchar *row, int u, float16 *a, float16 *b) {
    const global uchar *p = row + (size_t)u * 20;
    const float d = LOAD_HALF(p), m = LOAD_HALF(p + 2);
    const uchar16 q = vload16(0, p + 4);
    *a = convert_float16(q & (uchar)15) * d + m;
    *b = convert_float16(q >> (uchar)4) * d + m;
}
#define QKV 32
inline float16 dot_block(const global uchar *row, int ib, const global float *x, float16 acc) {
    const global uchar *p = row + (size_t)ib * 20;
    const uchar16 q = vload16(0, p + 4);
    const float16 xa = vload16(2 * ib, x), xb = vload16(2 * ib + 1, x);
    const float16 t = convert_float16(q & (uchar)15) * xa + convert_float16(q >> (uchar)4) * xb;
    return fma((float16)LOAD_HALF(p), t, fma((float16)LOAD_HALF(p + 2), xa + xb, acc));
}

#elif defined(W_Q5_0) || defined(W_Q5_1)
// block_q5_0 {half d; uint8 qh[4]; uint8 qs[16]} (22 bytes): y = d*(q - 16)
// block_q5_1 {half d; half m; uint8 qh[4]; uint8 qs[16]} (24 bytes): y = d*q + m
// q[j] = (qs[j]&15) | bit j of qh << 4; q[j+16] = (qs[j]>>4) | bit j+16 of qh << 4
#if defined(W_Q5_0)
#define Q5_BYTES 22
#define Q5_QH 2
#else
#define Q5_BYTES 24
#define Q5_QH 4
#endif
#define ROW_BYTES(n) ((size_t)(n) / 32 * Q5_BYTES)
// raw 5-bit quants of block u: values 0..15 -> fa, 16..31 -> fb
inline void q5_raw(const global uchar *p, float16 *fa, float16 *fb) {
    const uchar4 h = vload4(0, p + Q5_QH);
    const uint qh = (uint)h.s0 | ((uint)h.s1 << 8) | ((uint)h.s2 << 16) | ((uint)h.s3 << 24);
    const uint16 sh = (uint16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const uint16 hl = ((((uint16)qh) >> sh) & 1u) << 4;
    const uint16 hh = ((((uint16)qh) >> (sh + 16u)) & 1u) << 4;
    const uchar16 q = vload16(0, p + Q5_QH + 4);
    *fa = convert_float16(convert_uint16(q & (uchar)15) | hl);
    *fb = convert_float16(convert_uint16(q >> (uchar)4) | hh);
}
inline void deq_unit(const global uchar *row, int u, float16 *a, float16 *b) {
    const global uchar *p = row + (size_t)u * Q5_BYTES;
    const float d = LOAD_HALF(p);
    float16 fa, fb;
    q5_raw(p, &fa, &fb);
#if defined(W_Q5_0)
    *a = (fa - 16.0f) * d;
    *b = (fb - 16.0f) * d;
#else
    const float m = LOAD_HALF(p + 2);
    *a = fa * d + m;
    *b = fb * d + m;
#endif
}
#define QKV 32
inline float16 dot_block(const global uchar *row, int ib, const global float *x, float16 acc) {
    const global uchar *p = row + (size_t)ib * Q5_BYTES;
    float16 fa, fb;
    q5_raw(p, &fa, &fb);
    const float16 xa = vload16(2 * ib, x), xb = vload16(2 * ib + 1, x);
#if defined(W_Q5_0)
    return fma((float16)LOAD_HALF(p), fa * xa + fb * xb - 16.0f * (xa + xb), acc);
#else
    return fma((float16)LOAD_HALF(p), fa * xa + fb * xb, fma((float16)LOAD_HALF(p + 2), xa + xb, acc));
#endif
}

#elif defined(W_Q4_K) || defined(W_Q5_K)
// block_q4_K {half d; half dmin; uint8 scales[12]; uint8 qs[128]} (144 bytes)
// block_q5_K {half d; half dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128]} (176 bytes)
// Sub-block s (0..7) of 32 values: 6-bit scale/min from get_scale_min_k4(s);
// quants are the low (s even) or high (s odd) nibbles of qs[32*(s/2) .. +32];
// Q5_K adds bit s of qh[l] as bit 4. y = d*sc*q - dmin*m.
#if defined(W_Q4_K)
#define QK_BYTES 144
#define QK_QS 16
#else
#define QK_BYTES 176
#define QK_QS 48
#endif
#define ROW_BYTES(n) ((size_t)(n) / 256 * QK_BYTES)
inline void deq_unit(const global uchar *row, int u, float16 *a, float16 *b) {
    const int s = u & 7;
    const global uchar *p = row + (size_t)(u >> 3) * QK_BYTES;
    const float d = LOAD_HALF(p), dmin = LOAD_HALF(p + 2);
    const global uchar *sc = p + 4;
    // get_scale_min_k4 (ggml-quants.c), written with selects
    const int lo = s < 4;
    const uchar x0 = sc[lo ? s : s + 4];
    const uchar x1 = sc[lo ? s + 4 : s - 4];
    const uchar x2 = sc[s];
    const int scale = lo ? (x0 & 63) : ((x0 & 15) | ((x1 >> 6) << 4));
    const int mn = lo ? (x1 & 63) : ((x0 >> 4) | ((x2 >> 6) << 4));
    const float dl = d * (float)scale, ml = dmin * (float)mn;
    const global uchar *q = p + QK_QS + 32 * (s >> 1);
    const uchar sh = (uchar)(4 * (s & 1));
    uchar16 qa = (vload16(0, q) >> sh) & (uchar)15;
    uchar16 qb = (vload16(1, q) >> sh) & (uchar)15;
#if defined(W_Q5_K)
    const uchar hs = (uchar)s;
    qa |= ((vload16(0, p + 16) >> hs) & (uchar)1) << (uchar)4;
    qb |= ((vload16(1, p + 16) >> hs) & (uchar)1) << (uchar)4;
#endif
    *a = convert_float16(qa) * dl - ml;
    *b = convert_float16(qb) * dl - ml;
}
#define QKV 256
#define SB_UNITS 8
// A whole super-block: the eight 6-bit scales/mins decoded at once (get_scale_min_k4
// for j < 4 and j >= 4 as vectors), then 4 x 64 values: y = dl*q - ml per sub-block.
inline float16 dot_block(const global uchar *row, int ib, const global float *x, float16 acc) {
    const global uchar *p = row + (size_t)ib * QK_BYTES;
    const float d = LOAD_HALF(p), dmin = LOAD_HALF(p + 2);
    const uchar4 s0 = vload4(0, p + 4), s1 = vload4(1, p + 4), s2 = vload4(2, p + 4);
    const float4 sc_lo = convert_float4(s0 & (uchar)63), mn_lo = convert_float4(s1 & (uchar)63);
    const float4 sc_hi = convert_float4((s2 & (uchar)15) | ((s0 >> (uchar)6) << (uchar)4));
    const float4 mn_hi = convert_float4((s2 >> (uchar)4) | ((s1 >> (uchar)6) << (uchar)4));
    const float8 dl = d * (float8)(sc_lo, sc_hi), ml = dmin * (float8)(mn_lo, mn_hi);
    const global float *xb = x + (size_t)ib * 256;
    const global uchar *qs = p + QK_QS;
#if defined(W_Q5_K)
    const uchar16 ha = vload16(0, p + 16), hb = vload16(1, p + 16);
#endif
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const uchar16 qa = vload16(0, qs + 32 * j), qb = vload16(1, qs + 32 * j);
        uchar16 q0a = qa & (uchar)15, q0b = qb & (uchar)15, q1a = qa >> (uchar)4, q1b = qb >> (uchar)4;
#if defined(W_Q5_K)
        const uchar s0 = (uchar)(2 * j), s1 = (uchar)(2 * j + 1);
        q0a |= ((ha >> s0) & (uchar)1) << (uchar)4;
        q0b |= ((hb >> s0) & (uchar)1) << (uchar)4;
        q1a |= ((ha >> s1) & (uchar)1) << (uchar)4;
        q1b |= ((hb >> s1) & (uchar)1) << (uchar)4;
#endif
        const float16 x0a = vload16(0, xb + 64 * j), x0b = vload16(1, xb + 64 * j);
        const float16 x1a = vload16(2, xb + 64 * j), x1b = vload16(3, xb + 64 * j);
        const float16 t0 = convert_float16(q0a) * x0a + convert_float16(q0b) * x0b;
        const float16 t1 = convert_float16(q1a) * x1a + convert_float16(q1b) * x1b;
        acc = fma((float16)dl[2 * j], t0, acc);
        acc = fma((float16)dl[2 * j + 1], t1, acc);
        acc = fma((float16)(-ml[2 * j]), x0a + x0b, acc);
        acc = fma((float16)(-ml[2 * j + 1]), x1a + x1b, acc);
    }
    return acc;
}

// Super-block scales for mul_mm: (d*sc[0..7], dmin*m[0..7]); deq_sub(s) then needs no decoding.
inline float16 block_scales(const global uchar *row, int ib) {
    const global uchar *p = row + (size_t)ib * QK_BYTES;
    const float d = LOAD_HALF(p), dmin = LOAD_HALF(p + 2);
    const uchar4 s0 = vload4(0, p + 4), s1 = vload4(1, p + 4), s2 = vload4(2, p + 4);
    const float4 sc_lo = convert_float4(s0 & (uchar)63), mn_lo = convert_float4(s1 & (uchar)63);
    const float4 sc_hi = convert_float4((s2 & (uchar)15) | ((s0 >> (uchar)6) << (uchar)4));
    const float4 mn_hi = convert_float4((s2 >> (uchar)4) | ((s1 >> (uchar)6) << (uchar)4));
    return (float16)(d * (float8)(sc_lo, sc_hi), dmin * (float8)(mn_lo, mn_hi));
}
inline void deq_sub(const global uchar *row, int ib, int s, float16 scv, float16 *a, float16 *b) {
    const global uchar *p = row + (size_t)ib * QK_BYTES;
    const global uchar *q = p + QK_QS + 32 * (s >> 1);
    const uchar sh = (uchar)(4 * (s & 1));
    uchar16 qa = (vload16(0, q) >> sh) & (uchar)15;
    uchar16 qb = (vload16(1, q) >> sh) & (uchar)15;
#if defined(W_Q5_K)
    qa |= ((vload16(0, p + 16) >> (uchar)s) & (uchar)1) << (uchar)4;
    qb |= ((vload16(1, p + 16) >> (uchar)s) & (uchar)1) << (uchar)4;
#endif
    *a = fma(convert_float16(qa), (float16)scv[s], (float16)(-scv[8 + s]));
    *b = fma(convert_float16(qb), (float16)scv[s], (float16)(-scv[8 + s]));
}

#elif defined(W_Q6_K)
// block_q6_K {uint8 ql[128]; uint8 qh[64]; int8 scales[16]; half d} (210 bytes)
// Sub-block s: half h = s/4, r = s%4; ql[64h + 32(r&1) + l] low (r<2) or high nibble,
// bits 2r..2r+1 of qh[32h + l] as bits 4..5, minus 32; scale scales[8h + 2r + l/16].
#define ROW_BYTES(n) ((size_t)(n) / 256 * 210)
inline void deq_unit(const global uchar *row, int u, float16 *a, float16 *b) {
    const int s = u & 7, h = s >> 2, r = s & 3;
    const global uchar *p = row + (size_t)(u >> 3) * 210;
    const float d = LOAD_HALF(p + 208);
    const global char *sc = (const global char *)(p + 192) + 8 * h + 2 * r;
    const float d0 = d * (float)sc[0], d1 = d * (float)sc[1];
    const global uchar *ql = p + 64 * h + 32 * (r & 1);
    const global uchar *qh = p + 128 + 32 * h;
    const uchar nsh = (uchar)(4 * (r >> 1)), hsh = (uchar)(2 * r);
    const uchar16 qa = ((vload16(0, ql) >> nsh) & (uchar)15) | (((vload16(0, qh) >> hsh) & (uchar)3) << (uchar)4);
    const uchar16 qb = ((vload16(1, ql) >> nsh) & (uchar)15) | (((vload16(1, qh) >> hsh) & (uchar)3) << (uchar)4);
    *a = (convert_float16(qa) - 32.0f) * d0;
    *b = (convert_float16(qb) - 32.0f) * d1;
}
#define QKV 256
#define SB_UNITS 8
// A whole super-block: two halves of 128 values, each four groups r of 32 (module comment above).
inline float16 dot_block(const global uchar *row, int ib, const global float *x, float16 acc) {
    const global uchar *p = row + (size_t)ib * 210;
    const float d = LOAD_HALF(p + 208);
    const global float *xb = x + (size_t)ib * 256;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const global uchar *ql = p + 64 * h;
        const global uchar *qh = p + 128 + 32 * h;
        const float8 sc = d * convert_float8(vload8(0, (const global char *)(p + 192) + 8 * h));
        const uchar16 la = vload16(0, ql), lb = vload16(1, ql), lc = vload16(2, ql), ld = vload16(3, ql);
        const uchar16 ha = vload16(0, qh), hb = vload16(1, qh);
        const global float *xh = xb + 128 * h;
#define Q6_GROUP(r, lo_a, lo_b, nsh)                                                                   \
        {                                                                                              \
            const uchar16 qa = ((lo_a >> (uchar)nsh) & (uchar)15) | (((ha >> (uchar)(2 * r)) & (uchar)3) << (uchar)4); \
            const uchar16 qb = ((lo_b >> (uchar)nsh) & (uchar)15) | (((hb >> (uchar)(2 * r)) & (uchar)3) << (uchar)4); \
            acc = fma((float16)sc[2 * r], (convert_float16(qa) - 32.0f) * vload16(2 * r, xh), acc);       \
            acc = fma((float16)sc[2 * r + 1], (convert_float16(qb) - 32.0f) * vload16(2 * r + 1, xh), acc); \
        }
        Q6_GROUP(0, la, lb, 0)
        Q6_GROUP(1, lc, ld, 0)
        Q6_GROUP(2, la, lb, 4)
        Q6_GROUP(3, lc, ld, 4)
#undef Q6_GROUP
    }
    return acc;
}

// Super-block scales for mul_mm: d * scales[0..15]; deq_sub(s) then needs no decoding.
inline float16 block_scales(const global uchar *row, int ib) {
    const global uchar *p = row + (size_t)ib * 210;
    return LOAD_HALF(p + 208) * convert_float16(vload16(0, (const global char *)(p + 192)));
}
inline void deq_sub(const global uchar *row, int ib, int s, float16 scv, float16 *a, float16 *b) {
    const int h = s >> 2, r = s & 3;
    const global uchar *p = row + (size_t)ib * 210;
    const global uchar *ql = p + 64 * h + 32 * (r & 1);
    const global uchar *qh = p + 128 + 32 * h;
    const uchar nsh = (uchar)(4 * (r >> 1)), hsh = (uchar)(2 * r);
    const uchar16 qa = ((vload16(0, ql) >> nsh) & (uchar)15) | (((vload16(0, qh) >> hsh) & (uchar)3) << (uchar)4);
    const uchar16 qb = ((vload16(1, ql) >> nsh) & (uchar)15) | (((vload16(1, qh) >> hsh) & (uchar)3) << (uchar)4);
    *a = (convert_float16(qa) - 32.0f) * scv[8 * h + 2 * r];
    *b = (convert_float16(qb) - 32.0f) * scv[8 * h + 2 * r + 1];
}

#elif defined(W_Q2_K)
// block_q2_K {uint8 scales[16]; uint8 qs[64]; half d; half dmin} (84 bytes): unit s (0..7) of a
// super-block reads qs[32 (s / 4) + l] bits 2 (s % 4)..+1; its 16-value halves have scales[2s],
// scales[2s + 1]: y = d * (sc & 15) * q - dmin * (sc >> 4) (ggml-quants.c dequantize_row_q2_K).
#define ROW_BYTES(n) ((size_t)(n) / 256 * 84)
inline void deq_unit(const global uchar *row, int u, float16 *a, float16 *b) {
    const int s = u & 7;
    const global uchar *p = row + (size_t)(u >> 3) * 84;
    const float d = LOAD_HALF(p + 80), dmin = LOAD_HALF(p + 82);
    const uchar s0 = p[2 * s], s1 = p[2 * s + 1];
    const global uchar *q = p + 16 + 32 * (s >> 2);
    const uchar sh = (uchar)(2 * (s & 3));
    const float16 qa = convert_float16((vload16(0, q) >> sh) & (uchar)3);
    const float16 qb = convert_float16((vload16(1, q) >> sh) & (uchar)3);
    *a = d * (float)(s0 & 15) * qa - dmin * (float)(s0 >> 4);
    *b = d * (float)(s1 & 15) * qb - dmin * (float)(s1 >> 4);
}
#define QKV 32
inline float16 dot_block(const global uchar *row, int ib, const global float *x, float16 acc) {
    float16 a, b;
    deq_unit(row, ib, &a, &b);
    return fma(b, vload16(2 * ib + 1, x), fma(a, vload16(2 * ib, x), acc));
}

#elif defined(W_Q3_K)
// block_q3_K {uint8 hmask[32]; uint8 qs[64]; uint8 scales[12]; half d} (110 bytes): unit s (0..7)
// reads qs[32 (s / 4) + l] bits 2 (s % 4)..+1 and hmask[l] bit s (clear: minus 4); its 16-value
// halves have the 6-bit scales 2s, 2s + 1 (low 4 bits: scales[k] (k < 8) or scales[k - 8] >> 4; high
// 2 bits: scales[8 + k % 4] >> 2 (k / 4)), minus 32: y = d * sc * q (dequantize_row_q3_K).
#define ROW_BYTES(n) ((size_t)(n) / 256 * 110)
inline float q3k_scale(const global uchar *p, int k) {
    const uint lo = k < 8 ? (p[96 + k] & 15u) : (p[96 + k - 8] >> 4);
    const uint hi = (p[104 + (k & 3)] >> (2 * (k >> 2))) & 3u;
    return (float)((int)(lo | (hi << 4)) - 32);
}
inline void deq_unit(const global uchar *row, int u, float16 *a, float16 *b) {
    const int s = u & 7;
    const global uchar *p = row + (size_t)(u >> 3) * 110;
    const float d = LOAD_HALF(p + 108);
    const global uchar *q = p + 32 + 32 * (s >> 2);
    const uchar sh = (uchar)(2 * (s & 3)), m = (uchar)(1 << s);
    const char16 qa = as_char16((vload16(0, q) >> sh) & (uchar)3) - as_char16(select((uchar16)4, (uchar16)0,
                                                                              (vload16(0, p) & m) != (uchar)0));
    const char16 qb = as_char16((vload16(1, q) >> sh) & (uchar)3) - as_char16(select((uchar16)4, (uchar16)0,
                                                                              (vload16(1, p) & m) != (uchar)0));
    *a = d * q3k_scale(p, 2 * s) * convert_float16(qa);
    *b = d * q3k_scale(p, 2 * s + 1) * convert_float16(qb);
}
#define QKV 32
inline float16 dot_block(const global uchar *row, int ib, const global float *x, float16 acc) {
    float16 a, b;
    deq_unit(row, ib, &a, &b);
    return fma(b, vload16(2 * ib + 1, x), fma(a, vload16(2 * ib, x), acc));
}

#elif defined(W_MXFP4)
// block_mxfp4 {uchar e; uchar qs[16]} (17 bytes, ggml-common.h): value j = kvalues_mxfp4[qs[j] & 15] * d,
// value j + 16 = kvalues_mxfp4[qs[j] >> 4] * d, d = GGML_E8M0_TO_FP32_HALF(e) = 2^(e - 128)
// (ggml-quants.c dequantize_row_mxfp4; the bits 0x00200000 << e below e = 2)
#define ROW_BYTES(n) ((size_t)(n) / 32 * 17)
constant float kvalues_mxfp4[16] = {0.f, 1.f, 2.f, 3.f, 4.f, 6.f, 8.f, 12.f,
                                    0.f, -1.f, -2.f, -3.f, -4.f, -6.f, -8.f, -12.f};
inline void deq_unit(const global uchar *row, int u, float16 *a, float16 *b) {
    const global uchar *p = row + (size_t)u * 17;
    const uint e = p[0];
    const float d = as_float(e < 2u ? (0x00200000u << e) : ((e - 1u) << 23));
    float lo[16], hi[16];
    for (int i = 0; i < 16; i++) {
        const uchar q = p[1 + i];
        lo[i] = kvalues_mxfp4[q & 15];
        hi[i] = kvalues_mxfp4[q >> 4];
    }
    *a = vload16(0, lo) * d;
    *b = vload16(0, hi) * d;
}
#define QKV 32
inline float16 dot_block(const global uchar *row, int ib, const global float *x, float16 acc) {
    float16 a, b;
    deq_unit(row, ib, &a, &b);
    return fma(b, vload16(2 * ib + 1, x), fma(a, vload16(2 * ib, x), acc));
}

#else
#error "define one W_<TYPE> (see cooktop/backends/opencl/programs.py)"
#endif

// Row r of a matrix in the kernels' terms: ROW_PTR its bytes, ROW_LANE 0, except in layouts that
// interleave rows (repacked Q4_0: its row group and lane in it), whose deq_unit / dot_block take the lane.
#ifndef ROW_PTR
#define ROW_PTR(w, r, n) ((w) + (size_t)(r) * ROW_BYTES(n))
#define ROW_LANE(r) 0
#define DEQ_UNIT(row, l, u, a, b) deq_unit(row, u, a, b)
#define DOT_BLOCK(row, l, ib, x, acc) dot_block(row, ib, x, acc)
#endif

inline float hsum16(float16 v) {
    float8 s8 = v.lo + v.hi;
    float4 s4 = s8.lo + s8.hi;
    float2 s2 = s4.lo + s4.hi;
    return s2.x + s2.y;
}
