// K-quant rows (Q4_K, Q5_K, Q6_K; Q2_K, Q3_K in portable C only) dotted with llama.cpp's block_q8_K activations (quant.cl's
// store_q8k: one scale per 256 values, sums of quants per 16), built with -DQ8K (Q8K_ON, set in
// dotq8.cl, which then leaves its block_q8_1 versions of these types out). Appended to dotq8.cl;
// matmul.cl's mul_mv_q8 / mul_mv_q8_3 / mul_mvt_q8 and mmq8.cl's mul_mm_q8 call dotq8_row with
// xd as the record plane (16 floats per super-block: short bsums[16], float d).
//
// As ggml_vec_dot_q4_K_q8_K / q5_K / q6_K (ggml-cpu quants.c, arch/x86/quants.c): inside a
// super-block everything is an int32 sum, sum_s sc_s * sum(q * qy) (the -32 of Q6_K folded in
// through bsums); the super-block then adds (d_w d_y) * isum in float, and Q4_K / Q5_K
// subtract (dmin_w d_y) * sum_s m_s * (bsums[2s] + bsums[2s+1]). Where mmq8.cl's VNNI q8_K prompt
// kernels build (Q45K_LANES, Q6K_LANES below) one float lane per row, one fma per super-block (plus
// one for the mins), which those kernels repeat in the same order, so prompts are bit for bit their
// tokens one at a time; elsewhere 16 float lanes of partial sums per row (prompts: mul_mvt_q8, or
// on the CPU launch shape without the 64-byte code, e.g. AVX2 CPUs, the unpack-once mul_mm_q8 below:
// AVX2 with one float lane per row as the VNNI kernels, portable C with the 16 lanes).

#ifdef Q8K_ON
#ifndef HAS_Q8
#define HAS_Q8 1
#endif
#undef Q8ACC
#undef Q8_HSUM
#define Q8ACC float16
#define Q8_HSUM(v) hsum16(v)
#define DOTQ8_ROW 1

#if defined(W_Q4_K) || defined(W_Q5_K)
// 6-bit scales (sc) and mins (mn) of the 8 sub-blocks (get_scale_min_k4, ggml-quants.c)
#define Q8K_SCALES(p, sc, mn)                                                                       \
    const uchar4 s0_ = vload4(0, (p) + 4), s1_ = vload4(1, (p) + 4), s2_ = vload4(2, (p) + 4);     \
    const short8 sc = convert_short8((uchar8)(s0_ & (uchar)63, (s2_ & (uchar)15) | ((s0_ >> (uchar)6) << (uchar)4))); \
    const int8 mn = convert_int8((uchar8)(s1_ & (uchar)63, (s2_ >> (uchar)4) | ((s1_ >> (uchar)6) << (uchar)4)))
#endif

inline int hsum_i8(int8 v) {
    const int4 s4 = v.lo + v.hi;
    const int2 s2 = s4.lo + s4.hi;
    return s2.x + s2.y;
}

#if defined(X86_512) && (defined(W_Q4_K) || defined(W_Q5_K)) && defined(COOKTOP_VNNI) && !defined(COOKTOP_NO_MMQ_K)
// Q4_K / Q5_K rows on one float lane (where mmq8.cl's Q4_K / Q5_K prompt kernel, 16 rows in the SIMD lanes, runs)
#define Q45K_LANES 1
#endif
#if defined(X86_512) && defined(W_Q6_K) && defined(COOKTOP_VNNI) && !defined(COOKTOP_NO_MMQ_K)
// Q6_K rows on one float lane (where mmq8.cl's Q6_K prompt kernel, 16 rows in the SIMD lanes, runs)
#define Q6K_LANES 1
#endif
#if defined(Q45K_LANES)
// (sum of the 16 int32 lanes of isum, sum of lanes 0..7 of mins): both reductions in one chain of
// shuffles (exact integers)
inline int2 q45k_sums(v16si isum, v16si mins) {
    const int16 a = as_int16(isum);
    const int8 a8 = a.lo + a.hi, m8 = as_int16(mins).lo;
    const int8 e = (int8)(a8.lo + a8.hi, m8.lo + m8.hi);
    const int4 f = e.even + e.odd;
    return f.even + f.odd;
}
#endif

// sum_s m_s * (bsums[2s] + bsums[2s+1]): the integer of the mins term
inline int q8k_mins(const int8 mn, const global float *rec) {
    const short16 bs = vload16(0, (const global short *)rec);
    return hsum_i8(mn * (convert_int8(bs.even) + convert_int8(bs.odd)));
}

#if defined(X86_512)
// the 16 bsums of a q8_K record in one 32-byte load (PoCL splits vload16 of shorts into 8 loads
// and 7 shuffles)
typedef short v16hi_u __attribute__((vector_size(32), aligned(1)));
#define Q8K_BSUMS(rec) as_short16(*(const global v16hi_u *)(rec))
#endif

#if defined(X86_512) && defined(W_Q6_K)
// lane s: -32 sc_s bsums_s (the -32 of Q6_K's quants, one 16-value sub-block per lane) in one
// pmaddwd: -32 sc_s sign-extended to int32 against bsums_s zero-extended (its high int16 half 0,
// so the product is that of the signed low halves)
inline v16si q6k_bsum_term(const short16 sc16s, const global float *rec) {
    const v16si a = (v16si)convert_int16(sc16s * (short)(-32));
    const v16si b = (v16si)convert_int16(as_ushort16(Q8K_BSUMS(rec)));
    return __builtin_ia32_pmaddwd512((v32hi)a, (v32hi)b);
}
#endif

#if defined(X86_512) && (defined(W_Q4_K) || defined(W_Q5_K))
typedef uchar uc16_u __attribute__((ext_vector_type(16), aligned(1)));
// Q8K_SCALES from one 16-byte load of the 12 scale bytes (s0, s1, s2: 4 each; 4 bytes of qs after
// them unused, inside the block): the same 6-bit values in fewer instructions than 3 loads of 4
#undef Q8K_SCALES
#define Q8K_SCALES(p, sc, mn)                                                                       \
    const uchar16 x_ = *(const global uc16_u *)((p) + 4);                                           \
    const uchar8 u_ = x_.s89ab89ab;                                                                 \
    const uchar8 hi_ = (uchar8)(u_.lo & (uchar)15, u_.hi >> (uchar)4) | ((x_.lo >> (uchar)6) << (uchar)4); \
    const uchar8 lo_ = x_.lo & (uchar)63;                                                           \
    const short8 sc = convert_short8((uchar8)(lo_.lo, hi_.lo));                                     \
    const int8 mn = convert_int8((uchar8)(lo_.hi, hi_.hi))
// (d, dmin) of the super-block at p (its first two fp16s) in one vcvtph2ps
typedef int int_u __attribute__((aligned(1)));
inline float2 h2f2(const global uchar *p) {
    const int4 h = (int4)(*(const global int_u *)p, 0, 0, 0);
    return as_float4(__builtin_ia32_vcvtph2ps((v8hi)h)).s01;
}
typedef short v32hi_u __attribute__((vector_size(64), aligned(1)));
// The mins of a row's super-block as pmaddwd's first operand: int16 lanes 2s, 2s+1 hold m_s, 16..31 zero.
inline v32hi q8k_mins_op(const int8 mn) {
    const short8 m = convert_short8(mn);
    return (v32hi)__builtin_shufflevector(m, (short8)(0), 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 8, 8,
                                          8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8);
}
// int32 lane s (0..7): m_s * (bsums[2s] + bsums[2s+1]); lanes 8..15: 0. One pmaddwd against the q8_K
// record's 64 bytes (its 16 bsums, then d and padding, which meet the zero half of m2), so the
// float lanes take the mins term in one 16-lane fma (lanes 8..15 add a zero product: unchanged).
inline v16si q8k_mins16(const v32hi m2, const global float *rec) {
    return __builtin_ia32_pmaddwd512(m2, *(const global v32hi_u *)rec);
}
#endif

#if defined(X86_512) && (defined(W_Q4_K) || defined(W_Q5_K) || defined(W_Q6_K))
// int16 lanes 0..15 a, 16..31 b: per-half counts of one variable shift (vpsravw / vpsllvw)
#define Q8K_SH2(a, b) (v32hi)((short16)(a), (short16)(b))
// Float lanes without Q45K_LANES / Q6K_LANES: 16 int32 lanes of the super-block's
// integer, one fma with d_w d_y; Q4_K / Q5_K: lanes 0..7 add -(dmin_w d_y) m_s sum_s(qy), one
// sub-block each (in a 16-lane fma whose lanes 8..15 add zero products); Q6_K: the -32 enters the
// integer lanes, lane s taking -32 sc_s bsums_s.
#if defined(W_Q4_K) || defined(W_Q5_K)
// The 64 quants of sub-blocks 2j, 2j + 1 (Q45K_QUANTS's bytes): the 32 qs bytes z loaded into both
// halves (one vbroadcasti64x4) and shifted as int16 by 0 (low half: low nibbles) and 4 (high half:
// high nibbles) in one vpsrlvw before the mask; Q5_K's fifth bits likewise, the bits 2j, 2j + 1 of
// qh moved to bit 4 by one variable shift per half (left for j < 2, right after).
#define Q8K_NIB(p, j, m15) \
    ((v64qi)((v32hi)CAT32(LOAD32((p) + QK_QS + 32 * (j)), LOAD32((p) + QK_QS + 32 * (j))) >> Q8K_SH2(0, 4)) & (m15))
#if defined(W_Q5_K)
#define Q8K_QH(p) (v32hi)CAT32(LOAD32((p) + 16), LOAD32((p) + 16))
#define Q8K_HB(p, j) ((j) < 2 ? Q8K_QH(p) << Q8K_SH2(4 - 2 * (j), 3 - 2 * (j)) : Q8K_QH(p) >> Q8K_SH2(2 * (j) - 4, 2 * (j) - 3))
#define Q8K_Q45(p, j, m15) (Q8K_NIB(p, j, m15) | ((v64qi)Q8K_HB(p, j) & (v64qi)(int16)(0x10101010)))
#else
#define Q8K_Q45(p, j, m15) Q8K_NIB(p, j, m15)
#endif
#if defined(Q45K_LANES)
// Q4_K / Q5_K where mmq8.cl's prompt kernel for them runs: the same integers per super-block (Q8K_Q45 quants,
// pmaddubsw, pmaddwd with the scales; the mins' pmaddwd), each summed to one int32, and the row's sum in
// one float lane: a0 = fma(float(isum), d_w d_y, a0), a0 = fma(-(dmin_w d_y), float(mins), a0) per
// super-block in order (the prompt kernel's per-row operations; lanes 1..15 of acc stay +0, so
// hsum16 gives lane 0). Two super-blocks at a time share one chain of shuffles for their four sums;
// inside a super-block pmaddubsw, then vpdpwssd with the scales (any order of the exact integers will do).
inline __attribute__((always_inline, target("avx512vnni"))) void q45k_sb(const global uchar *p, const global char *xb, const global float *rec,
                                                  v16si *isum, v16si *mins) {
    const v64qi m15 = (v64qi)(int16)(0x0f0f0f0f);
    Q8K_SCALES(p, sc, mn);
    v16si is = (v16si)(int16)(0);
#define Q8K_STEP(j, a, b)                                                                                  \
    {                                                                                                      \
        const v64qi q = Q8K_Q45(p, (j), m15);                                                              \
        const v32hi scv = (v32hi)__builtin_shufflevector(sc, sc, a, a, a, a, a, a, a, a, a, a, a, a, a,     \
                                                         a, a, a, b, b, b, b, b, b, b, b, b, b, b, b, b, b, b, b); \
        is = __builtin_ia32_vpdpwssd512(is, (v16si)__builtin_ia32_pmaddubsw512(q, LOAD64(xb + 64 * (j))), (v16si)scv); \
    }
    Q8K_STEP(0, 0, 1)
    Q8K_STEP(1, 2, 3)
    Q8K_STEP(2, 4, 5)
    Q8K_STEP(3, 6, 7)
#undef Q8K_STEP
    *isum = is;
    *mins = q8k_mins16(q8k_mins_op(mn), rec);
}
// the row's float lane from a0 on; VNNI (vpdpwssd) needs a function of that target, one call per row
__attribute__((target("avx512vnni"))) __attribute__((noinline))
float q45k_row(const global uchar *row, int nb, const global char *xq, const global float2 *xd, int lid, float a0) {
    int ib = lid;
    for (; ib + MV_LS < nb; ib += 2 * MV_LS) {
        const int ic = ib + MV_LS;
        const global uchar *p0 = row + (size_t)ib * QK_BYTES, *p1 = row + (size_t)ic * QK_BYTES;
        Q8_PREFETCH(p0, (2 * QK_BYTES + 63) / 64);  // two super-blocks a step: Q4_K 288 bytes (5 lines), Q5_K 352 (6)
        const global float *r0 = (const global float *)xd + (size_t)ib * 16, *r1 = (const global float *)xd + (size_t)ic * 16;
        v16si i0, n0, i1, n1;
        q45k_sb(p0, xq + (size_t)ib * 256, r0, &i0, &n0);
        q45k_sb(p1, xq + (size_t)ic * 256, r1, &i1, &n1);
        const int16 a = as_int16(i0), b = as_int16(i1);
        const int16 x = (int16)(a.lo + a.hi, b.lo + b.hi), m = (int16)(as_int16(n0).lo, as_int16(n1).lo);
        // 4-lane partial sums of isum_0, mins_0, isum_1, mins_1, then pairs, then the four sums
        const int16 z = __builtin_shufflevector(x, m, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27)
                      + __builtin_shufflevector(x, m, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
        const int8 z2 = z.even + z.odd;
        const float4 f = convert_float4(z2.even + z2.odd);
        const float2 d0 = h2f2(p0), d1 = h2f2(p1);
        const float y0 = r0[8], y1 = r1[8];
        a0 = fma(f.x, d0.x * y0, a0);
        a0 = fma(-(d0.y * y0), f.y, a0);
        a0 = fma(f.z, d1.x * y1, a0);
        a0 = fma(-(d1.y * y1), f.w, a0);
    }
    if (ib < nb) {
        const global uchar *p = row + (size_t)ib * QK_BYTES;
        const global float *rec = (const global float *)xd + (size_t)ib * 16;
        v16si is, mi;
        q45k_sb(p, xq + (size_t)ib * 256, rec, &is, &mi);
        const float2 im = convert_float2(q45k_sums(is, mi)), dm = h2f2(p);
        a0 = fma(im.x, dm.x * rec[8], a0);
        a0 = fma(-(dm.y * rec[8]), im.y, a0);
    }
    return a0;
}
inline float16 dotq8_row(const global uchar *row, int nb, const global char *xq, const global float2 *xd, int lid,
                         float16 acc) {
    acc.s0 = q45k_row(row, nb, xq, xd, lid, acc.s0);
    return acc;
}
#else
// per 32-byte group j of qs: 64 quants (Q8K_Q45: sub-blocks 2j, 2j+1) x 64 activation bytes,
// pmaddubsw then pmaddwd with the two sub-blocks' scales as int16 (int32 lanes 0..7: 2j, 8..15: 2j+1)
inline float16 dotq8_row(const global uchar *row, int nb, const global char *xq, const global float2 *xd, int lid,
                         float16 acc) {
    const v64qi m15 = (v64qi)(int16)(0x0f0f0f0f);
    for (int ib = lid; ib < nb; ib += MV_LS) {
        const global uchar *p = row + (size_t)ib * QK_BYTES;
#if defined(W_Q4_K)
        Q8_PREFETCH(p, 3);  // 144 bytes a step (dotq8.cl)
#endif
        const global float *rec = (const global float *)xd + (size_t)ib * 16;
        const float dy = rec[8];
        Q8K_SCALES(p, sc, mn);
        v16si isum = (v16si)(int16)(0);
        // the scales of sub-blocks 2j (int16 lanes 0..15) and 2j+1 (16..31): one constant shuffle
#define Q8K_STEP(j, a, b)                                                                                  \
        {                                                                                                  \
            const v64qi q = Q8K_Q45(p, (j), m15);                                                          \
            const v32hi scv = (v32hi)__builtin_shufflevector(sc, sc, a, a, a, a, a, a, a, a, a, a, a, a, a, \
                                                             a, a, a, b, b, b, b, b, b, b, b, b, b, b, b, b, b, b, b); \
            const v64qi ya = LOAD64(xq + (size_t)ib * 256 + 64 * (j));                                     \
            isum += __builtin_ia32_pmaddwd512(__builtin_ia32_pmaddubsw512(q, ya), scv);                    \
        }
        Q8K_STEP(0, 0, 1)
        Q8K_STEP(1, 2, 3)
        Q8K_STEP(2, 4, 5)
        Q8K_STEP(3, 6, 7)
#undef Q8K_STEP
        const float2 dm = h2f2(p);
        acc = fma(convert_float16(as_int16(isum)), (float16)(dm.x * dy), acc);
        acc = fma((float16)(-(dm.y * dy)), convert_float16(as_int16(q8k_mins16(q8k_mins_op(mn), rec))), acc);
    }
    return acc;
}
#endif
#elif defined(W_Q6_K)
// the scales of 16-value sub-blocks 4g..4g+3 as int16 lanes 8 each: one constant shuffle once g is unrolled
#define Q6K_SH(v, a) __builtin_shufflevector(v, v, a, a, a, a, a, a, a, a, a + 1, a + 1, a + 1, a + 1, a + 1, \
    a + 1, a + 1, a + 1, a + 2, a + 2, a + 2, a + 2, a + 2, a + 2, a + 2, a + 2, a + 3, a + 3, a + 3, a + 3, a + 3, \
    a + 3, a + 3, a + 3)
#define Q6K_SCV(v, g) ((g) == 0 ? Q6K_SH(v, 0) : (g) == 1 ? Q6K_SH(v, 4) : (g) == 2 ? Q6K_SH(v, 8) : Q6K_SH(v, 12))
// group g (0..3) = values 64g..64g+63 (dotq8.cl's Q6_K layout), 16-value sub-blocks 4g..4g+3;
// the -32: lane s starts from -32 sc_s bsums_s (q6k_bsum_term). The two high bits of each quant
// (qh's bits 2r, 2r + 1 for row r of the group's two halves) land on bits 4, 5 in one variable shift
// of qh loaded into both halves (one vbroadcasti64x4), then one mask and one or with the low nibbles.
#if defined(Q6K_LANES)
// Q6_K where mmq8.cl's Q6_K prompt kernel runs: the same integers per super-block, summed to one int32,
// and the row's sum in one float lane, a0 = fma(float(isum), d_w d_y, a0) per super-block in order (the
// prompt kernel's per-row operations; lanes 1..15 of acc stay +0); two super-blocks share one chain
// of shuffles; pmaddubsw then vpdpwssd (VNNI: a function of that target, one call per row).
inline __attribute__((always_inline, target("avx512vnni"))) v16si q6k_sb(const global uchar *p, const global char *xb,
                                                                         const global float *rec) {
    const v64qi m15 = (v64qi)(int16)(0x0f0f0f0f);
    const v64qi m48 = (v64qi)(int16)(0x30303030);
    const short16 sc16s = convert_short16(vload16(0, (const global char *)(p + 192)));
    v16si isum = q6k_bsum_term(sc16s, rec);
#pragma unroll
    for (int g = 0; g < 4; g++) {
        const v64qi ql = LOAD64(p + 64 * (g >> 1));
        const v64qi lq = (g & 1) ? (v64qi)(((v16si)ql >> 4) & (v16si)m15) : (ql & m15);
        const v32hi qh2 = (v32hi)CAT32(LOAD32(p + 128 + 32 * (g >> 1)), LOAD32(p + 128 + 32 * (g >> 1)));
        const v64qi hq = (v64qi)((g & 1) ? qh2 >> Q8K_SH2(0, 2) : qh2 << Q8K_SH2(4, 2)) & m48;
        const v32hi scv = (v32hi)Q6K_SCV(sc16s, g);
        isum = __builtin_ia32_vpdpwssd512(isum, (v16si)__builtin_ia32_pmaddubsw512(lq | hq, LOAD64(xb + 64 * g)), (v16si)scv);
    }
    return isum;
}
__attribute__((target("avx512vnni"))) __attribute__((noinline))
float q6k_row(const global uchar *row, int nb, const global char *xq, const global float2 *xd, int lid, float a0) {
    int ib = lid;
    for (; ib + MV_LS < nb; ib += 2 * MV_LS) {
        const int ic = ib + MV_LS;
        const global uchar *p0 = row + (size_t)ib * 210, *p1 = row + (size_t)ic * 210;
        Q8_PREFETCH(p0, 7);  // two super-blocks, 420 bytes a step (dotq8.cl)
        const global float *r0 = (const global float *)xd + (size_t)ib * 16, *r1 = (const global float *)xd + (size_t)ic * 16;
        const int16 a = as_int16(q6k_sb(p0, xq + (size_t)ib * 256, r0)), b = as_int16(q6k_sb(p1, xq + (size_t)ic * 256, r1));
        const int16 x = (int16)(a.lo + a.hi, b.lo + b.hi);
        const int8 z = x.even + x.odd;
        const int4 z2 = z.even + z.odd;
        const float2 f = convert_float2(z2.even + z2.odd);
        a0 = fma(f.x, h2f(p0 + 208) * r0[8], a0);
        a0 = fma(f.y, h2f(p1 + 208) * r1[8], a0);
    }
    if (ib < nb) {
        const global uchar *p = row + (size_t)ib * 210;
        const global float *rec = (const global float *)xd + (size_t)ib * 16;
        const int16 a = as_int16(q6k_sb(p, xq + (size_t)ib * 256, rec));
        a0 = fma((float)hsum_i8(a.lo + a.hi), h2f(p + 208) * rec[8], a0);
    }
    return a0;
}
inline float16 dotq8_row(const global uchar *row, int nb, const global char *xq, const global float2 *xd, int lid,
                         float16 acc) {
    acc.s0 = q6k_row(row, nb, xq, xd, lid, acc.s0);
    return acc;
}
#else
inline float16 dotq8_row(const global uchar *row, int nb, const global char *xq, const global float2 *xd, int lid,
                         float16 acc) {
    const v64qi m15 = (v64qi)(int16)(0x0f0f0f0f);
    const v64qi m48 = (v64qi)(int16)(0x30303030);
    for (int ib = lid; ib < nb; ib += MV_LS) {
        const global uchar *p = row + (size_t)ib * 210;
        const global float *rec = (const global float *)xd + (size_t)ib * 16;
        const short16 sc16s = convert_short16(vload16(0, (const global char *)(p + 192)));
        v16si isum = q6k_bsum_term(sc16s, rec);
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const v64qi ql = LOAD64(p + 64 * (g >> 1));
            const v64qi lq = (g & 1) ? (v64qi)(((v16si)ql >> 4) & (v16si)m15) : (ql & m15);
            const v32hi qh2 = (v32hi)CAT32(LOAD32(p + 128 + 32 * (g >> 1)), LOAD32(p + 128 + 32 * (g >> 1)));
            const v64qi hq = (v64qi)((g & 1) ? qh2 >> Q8K_SH2(0, 2) : qh2 << Q8K_SH2(4, 2)) & m48;
            const v64qi q = lq | hq;
            const v32hi scv = (v32hi)Q6K_SCV(sc16s, g);
            const v64qi ya = LOAD64(xq + (size_t)ib * 256 + 64 * g);
            isum += __builtin_ia32_pmaddwd512(__builtin_ia32_pmaddubsw512(q, ya), scv);
        }
        acc = fma(convert_float16(as_int16(isum)), (float16)(h2f(p + 208) * rec[8]), acc);
    }
    return acc;
}
#endif
#endif

#else  // portable OpenCL C (GPUs, other CPUs)
#define I16(v) convert_int16(v)
#if defined(__AVX2__) && defined(__F16C__) && !defined(COOKTOP_PORTABLE) \
    && (defined(W_Q4_K) || defined(W_Q5_K) || defined(W_Q6_K))
// AVX2 without the 64-byte code (ggml_vec_dot_q4_K_q8_K / q5_K / q6_K, ggml-cpu/arch/x86/quants.c,
// its __AVX2__ branch): a super-block's quants unpacked as 8 vectors of 32 unsigned bytes (Q4_K /
// Q5_K: sub-block s, the fifth bit included; Q6_K: group g of 32 values, 0..63 with the +32 kept)
// and its scales as int16 vectors (q8k_unpack), then per token pmaddubsw with the token's 32
// bytes, pmaddwd with the scales (Q6_K: one per 16 values, lanes 0..7 and 8..15), and the sums of
// int32 lanes: isum, one int32 per super-block (Q6_K's -32 folded in as pmaddwd(bsums, -32 sc);
// Q4_K / Q5_K's mins sum_s m_s (bsums[2s] + bsums[2s+1]) as pmaddwd(bsums, (m_s, m_s))). Exact
// integers (pmaddubsw pairs <= 2 * 63 * 127, no saturation; |isum| < 2^29). The row's sum is
// one float lane: a = fma(float(isum), d_w d_y, a) per super-block in order (Q4_K / Q5_K then
// a = fma(-(dmin_w d_y), float(mins), a)); the mat-vec (lanes 1..15 of its acc stay +0, so hsum16
// gives a + 0) and the prompt kernel below run the same q8k_unpack + q8k_sb_dot, so a prompt is
// its tokens one at a time bit for bit.
#define Q8K_AVX2 1
typedef char q8k_v32qi __attribute__((vector_size(32)));
typedef char q8k_v32qi_u __attribute__((vector_size(32), aligned(1)));
typedef uchar q8k_v32qu __attribute__((vector_size(32)));
typedef uchar q8k_v32qu_u __attribute__((vector_size(32), aligned(1)));
typedef short q8k_v16hi __attribute__((vector_size(32)));
typedef short q8k_v16hi_u __attribute__((vector_size(32), aligned(1)));
typedef int q8k_v8si __attribute__((vector_size(32)));
#define Q8K_LD(p) (*(const global q8k_v32qu_u *)(p))
#ifndef Q8_PREFETCH  // Q5_K: dotq8.cl's x86 section (and its prefetch) is AVX-512 only
#define Q8_PREFETCH(p, n)                                                                   \
    do {                                                                                  \
        _Pragma("unroll") for (int pf_ = 0; pf_ < (n); pf_++)                             \
            __builtin_prefetch((const global uchar *)(p) + 1536 + 64 * pf_);               \
    } while (0)
#endif
typedef struct {
    q8k_v32qu q[8];   // unsigned quants of values 32 k .. 32 k + 31
    q8k_v16hi sc[8];  // their scales as int16 lanes (pmaddwd's second operand)
    q8k_v16hi m;      // Q4_K / Q5_K: (m_s, m_s) per bsum pair; Q6_K: -32 sc_c per 16 values
} q8k_sb_t;
#if defined(W_Q6_K)
#define Q8K_SB_BYTES 210
inline __attribute__((always_inline)) void q8k_unpack(const global uchar *p, q8k_sb_t *u) {
    const uchar m15 = 15, m3 = 3;
    const short16 sc = convert_short16(vload16(0, (const global char *)(p + 192)));
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const q8k_v32qu l0 = Q8K_LD(p + 64 * h), l1 = Q8K_LD(p + 64 * h + 32), qh = Q8K_LD(p + 128 + 32 * h);
        u->q[4 * h] = (l0 & m15) | ((qh & m3) << 4);
        u->q[4 * h + 1] = (l1 & m15) | (((qh >> 2) & m3) << 4);
        u->q[4 * h + 2] = (l0 >> 4) | (((qh >> 4) & m3) << 4);
        u->q[4 * h + 3] = (l1 >> 4) | ((qh >> 6) << 4);
    }
#pragma unroll
    for (int g = 0; g < 8; g++)
        u->sc[g] = (q8k_v16hi)(short16)((short8)(sc[2 * g]), (short8)(sc[2 * g + 1]));
    u->m = (q8k_v16hi)(sc * (short)(-32));
}
// isum of super-block u with one token's quants xb and record rec
inline __attribute__((always_inline)) int q8k_isum(const q8k_sb_t *u, const global char *xb, const global float *rec) {
    q8k_v8si is = __builtin_ia32_pmaddwd256(*(const global q8k_v16hi_u *)rec, u->m);
#pragma unroll
    for (int g = 0; g < 8; g++)
        is += __builtin_ia32_pmaddwd256(__builtin_ia32_pmaddubsw256((q8k_v32qi)u->q[g],
                                                                    *(const global q8k_v32qi_u *)(xb + 32 * g)),
                                        u->sc[g]);
    const int8 a = as_int8(is);
    const int4 b = a.lo + a.hi;
    const int2 c = b.lo + b.hi;
    return c.x + c.y;
}
inline __attribute__((always_inline)) float q8k_sb_dot(const global uchar *p, const q8k_sb_t *u, const global char *xb,
                                                       const global float *rec, float a) {
    return fma((float)q8k_isum(u, xb, rec), LOAD_HALF(p + 208) * rec[8], a);
}
#else
#define Q8K_SB_BYTES QK_BYTES
inline __attribute__((always_inline)) void q8k_unpack(const global uchar *p, q8k_sb_t *u) {
    const uchar m15 = 15;
    Q8K_SCALES(p, sc, mn);
#if defined(W_Q5_K)
    const q8k_v32qu qh = Q8K_LD(p + 16);
    const uchar b1 = 1;
#endif
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const q8k_v32qu qs = Q8K_LD(p + QK_QS + 32 * j);
#if defined(W_Q5_K)
        u->q[2 * j] = (qs & m15) | (((qh >> (2 * j)) & b1) << 4);
        u->q[2 * j + 1] = (qs >> 4) | (((qh >> (2 * j + 1)) & b1) << 4);
#else
        u->q[2 * j] = qs & m15;
        u->q[2 * j + 1] = qs >> 4;
#endif
    }
#pragma unroll
    for (int s = 0; s < 8; s++) u->sc[s] = (q8k_v16hi)(short16)(sc[s]);
    const short8 m8 = convert_short8(mn);
    u->m = (q8k_v16hi)(short16)(m8.s00112233, m8.s44556677);
}
// (isum, mins) of super-block u with one token's quants xb and record rec: both reductions in one
// chain of shuffles (exact integers)
inline __attribute__((always_inline)) int2 q8k_isum(const q8k_sb_t *u, const global char *xb, const global float *rec) {
    q8k_v8si is = (q8k_v8si)(int8)(0);
#pragma unroll
    for (int s = 0; s < 8; s++)
        is += __builtin_ia32_pmaddwd256(__builtin_ia32_pmaddubsw256((q8k_v32qi)u->q[s],
                                                                    *(const global q8k_v32qi_u *)(xb + 32 * s)),
                                        u->sc[s]);
    const int8 a = as_int8(is), m = as_int8(__builtin_ia32_pmaddwd256(*(const global q8k_v16hi_u *)rec, u->m));
    const int8 e = (int8)(a.lo + a.hi, m.lo + m.hi);
    const int4 f = e.even + e.odd;
    return f.even + f.odd;
}
inline __attribute__((always_inline)) float q8k_sb_dot(const global uchar *p, const q8k_sb_t *u, const global char *xb,
                                                       const global float *rec, float a) {
    const int2 im = q8k_isum(u, xb, rec);
    const float dy = rec[8];
    a = fma((float)im.x, LOAD_HALF(p) * dy, a);
    return fma(-(LOAD_HALF(p + 2) * dy), (float)im.y, a);
}
#endif
inline float16 dotq8_row(const global uchar *row, int nb, const global char *xq, const global float2 *xd, int lid,
                         float16 acc) {
    float a = acc.s0;
    for (int ib = lid; ib < nb; ib += MV_LS) {
        const global uchar *p = row + (size_t)ib * Q8K_SB_BYTES;
        Q8_PREFETCH(p, (Q8K_SB_BYTES + 63) / 64);
        q8k_sb_t u;
        q8k_unpack(p, &u);
        a = q8k_sb_dot(p, &u, xq + (size_t)ib * 256, (const global float *)xd + (size_t)ib * 16, a);
    }
    acc.s0 = a;
    return acc;
}
#if MV_LS == 1 && !defined(COOKTOP_NO_MMQ_K)
// Prompt matrices (CPU launch shape): mul_mm_q8's grid (mmq8.cl), MMQ_R rows x MMQ_TT tiles of
// MMQ_TN tokens per work-item; each row's super-block is unpacked once for a tile's tokens, each
// token gets dotq8_row's integers and float operations (+ 0.0f: hsum16 of the mat-vec's lanes).
__kernel void mul_mm_q8(const global uchar *w, const global char *xq, const global float2 *xd,
                        global float *y, const int n_in, const int n_out, const int n_tok) {
    const int tb = get_group_id(1) * (MMQ_TN * MMQ_TT), r0 = get_global_id(0) * MMQ_R, nsb = n_in / 256;
    for (int t0 = tb; t0 < min(n_tok, tb + MMQ_TN * MMQ_TT); t0 += MMQ_TN) {
    const int nt = min(MMQ_TN, n_tok - t0);
    for (int r = r0; r < min(r0 + MMQ_R, n_out); r++) {
        const global uchar *wr = w + (size_t)r * ROW_BYTES(n_in);
        float acc[MMQ_TN];
        for (int t = 0; t < MMQ_TN; t++) acc[t] = 0.0f;
        for (int ib = 0; ib < nsb; ib++) {
            const global uchar *p = wr + (size_t)ib * Q8K_SB_BYTES;
            q8k_sb_t u;
            q8k_unpack(p, &u);
            for (int t = 0; t < nt; t++) {
                const size_t tt = (size_t)(t0 + t);
                acc[t] = q8k_sb_dot(p, &u, xq + tt * n_in + (size_t)ib * 256,
                                    (const global float *)(xd + tt * (n_in / 32)) + (size_t)ib * 16, acc[t]);
            }
        }
        for (int t = 0; t < nt; t++) y[(size_t)(t0 + t) * n_out + r] = acc[t] + 0.0f;
    }
    }
}
#endif
#elif defined(W_Q4_K) || defined(W_Q5_K) || defined(W_Q6_K)
// Q4_K / Q5_K / Q6_K (ggml_vec_dot_q4_K_q8_K / q5_K / q6_K, ggml-cpu quants.c): a super-block's
// weights unpacked once as 16 vectors of 16 values, w[c] = sc_s * q of values 16c..16c+15 (s = c / 2
// the 32-value sub-block of Q4_K / Q5_K, c the 16-value one of Q6_K, whose q keeps its -32), then
// per token isum = sum_c w[c] * qy[c] in 16 int32 lanes (lane l: the values of index l mod 16).
// Those are exact integers (|w| <= 31 * 63 = 1953 for Q5_K, 32 * 128 = 4096 for Q6_K, in int16;
// a lane's sum at most 16 * 4096 * 127 < 2^23), the same whatever the order of the products, and
// the float operations per lane follow (Q4_K / Q5_K: fma(float(isum), d_w d_y) and, on lane 0,
// fma(-(dmin_w d_y), float(sum_s m_s * (bsums[2s] + bsums[2s+1])))). dotq8_row and the prompt
// kernel below both run q8k_unpack + q8k_sb_dot, so a prompt is its tokens one at a time bit
// for bit.
#define Q8K_W short16
#if defined(W_Q6_K)
#define Q8K_SB_BYTES 210
inline void q8k_unpack(const global uchar *p, short16 *w) {
    const short16 scv = convert_short16(vload16(0, (const global char *)(p + 192)));
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const global uchar *ql = p + 64 * h;
        const global uchar *qh = p + 128 + 32 * h;
        const uchar16 la = vload16(0, ql), lb = vload16(1, ql), lc = vload16(2, ql), ld = vload16(3, ql);
        const uchar16 ha = vload16(0, qh), hb = vload16(1, qh);
#define Q6K_GROUP(r, lo_a, lo_b, nsh)                                                                         \
        w[8 * h + 2 * r] = (convert_short16(((lo_a >> (uchar)nsh) & (uchar)15)                               \
                                            | (((ha >> (uchar)(2 * r)) & (uchar)3) << (uchar)4)) - (short)32) \
                           * scv[8 * h + 2 * r];                                                             \
        w[8 * h + 2 * r + 1] = (convert_short16(((lo_b >> (uchar)nsh) & (uchar)15)                           \
                                                | (((hb >> (uchar)(2 * r)) & (uchar)3) << (uchar)4)) - (short)32) \
                               * scv[8 * h + 2 * r + 1];
        Q6K_GROUP(0, la, lb, 0)
        Q6K_GROUP(1, lc, ld, 0)
        Q6K_GROUP(2, la, lb, 4)
        Q6K_GROUP(3, lc, ld, 4)
#undef Q6K_GROUP
    }
}
#else
#define Q8K_SB_BYTES QK_BYTES
inline void q8k_unpack(const global uchar *p, short16 *w) {
    Q8K_SCALES(p, sc, mn);
    const global uchar *qs = p + QK_QS;
#if defined(W_Q5_K)
    const uchar16 ha = vload16(0, p + 16), hb = vload16(1, p + 16);
#endif
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const uchar16 qa = vload16(0, qs + 32 * j), qb = vload16(1, qs + 32 * j);
        uchar16 q0a = qa & (uchar)15, q0b = qb & (uchar)15, q1a = qa >> (uchar)4, q1b = qb >> (uchar)4;
#if defined(W_Q5_K)
        const uchar h0 = (uchar)(2 * j), h1 = (uchar)(2 * j + 1);
        q0a |= ((ha >> h0) & (uchar)1) << (uchar)4;
        q0b |= ((hb >> h0) & (uchar)1) << (uchar)4;
        q1a |= ((ha >> h1) & (uchar)1) << (uchar)4;
        q1b |= ((hb >> h1) & (uchar)1) << (uchar)4;
#endif
        w[4 * j] = convert_short16(q0a) * sc[2 * j];
        w[4 * j + 1] = convert_short16(q0b) * sc[2 * j];
        w[4 * j + 2] = convert_short16(q1a) * sc[2 * j + 1];
        w[4 * j + 3] = convert_short16(q1b) * sc[2 * j + 1];
    }
}
#endif
// acc + super-block p's products with one token's quants xb and record rec
inline float16 q8k_sb_dot(const global uchar *p, const short16 *w, const global char *xb, const global float *rec,
                          float16 acc) {
    int16 isum = (int16)(0);
#pragma unroll
    for (int c = 0; c < 16; c++) isum += I16(w[c]) * I16(vload16(c, xb));
#if defined(W_Q6_K)
    acc = fma(convert_float16(isum), (float16)(LOAD_HALF(p + 208) * rec[8]), acc);
#else
    const float dy = rec[8];
    Q8K_SCALES(p, sc, mn);
    acc = fma(convert_float16(isum), (float16)(LOAD_HALF(p) * dy), acc);
    acc.s0 = fma(-(LOAD_HALF(p + 2) * dy), (float)q8k_mins(mn, rec), acc.s0);
#endif
    return acc;
}
#if defined(W_Q4_K) || defined(W_Q5_K)
// The mat-vec of Q4_K / Q5_K in one pass over the quants (unpacking first was 4-6% slower in
// this portable C on an AVX2 CPU under PoCL, one token): the same 16 int32 lanes of exact integers (lane l: values of index l mod 16)
// and the same float operations as q8k_sb_dot, so the prompt kernel's tokens equal it bit for bit.
#define Q8K_OWN_ROW 1
inline float16 dotq8_row(const global uchar *row, int nb, const global char *xq, const global float2 *xd, int lid,
                         float16 acc) {
    for (int ib = lid; ib < nb; ib += MV_LS) {
        const global uchar *p = row + (size_t)ib * QK_BYTES;
        const global float *rec = (const global float *)xd + (size_t)ib * 16;
        const float dy = rec[8];
        Q8K_SCALES(p, sc, mn);
        const global char *xb = xq + (size_t)ib * 256;
        const global uchar *qs = p + QK_QS;
#if defined(W_Q5_K)
        const uchar16 ha = vload16(0, p + 16), hb = vload16(1, p + 16);
#endif
        int16 isum = (int16)(0);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uchar16 qa = vload16(0, qs + 32 * j), qb = vload16(1, qs + 32 * j);
            uchar16 q0a = qa & (uchar)15, q0b = qb & (uchar)15, q1a = qa >> (uchar)4, q1b = qb >> (uchar)4;
#if defined(W_Q5_K)
            const uchar h0 = (uchar)(2 * j), h1 = (uchar)(2 * j + 1);
            q0a |= ((ha >> h0) & (uchar)1) << (uchar)4;
            q0b |= ((hb >> h0) & (uchar)1) << (uchar)4;
            q1a |= ((ha >> h1) & (uchar)1) << (uchar)4;
            q1b |= ((hb >> h1) & (uchar)1) << (uchar)4;
#endif
            const global char *x0 = xb + 64 * j;
            const int16 t0 = I16(q0a) * I16(vload16(0, x0)) + I16(q0b) * I16(vload16(1, x0));
            const int16 t1 = I16(q1a) * I16(vload16(2, x0)) + I16(q1b) * I16(vload16(3, x0));
            isum += t0 * (int)sc[2 * j] + t1 * (int)sc[2 * j + 1];
        }
        acc = fma(convert_float16(isum), (float16)(LOAD_HALF(p) * dy), acc);
        acc.s0 = fma(-(LOAD_HALF(p + 2) * dy), (float)q8k_mins(mn, rec), acc.s0);
    }
    return acc;
}
#endif
#elif defined(W_Q2_K) || defined(W_Q3_K)
// Q2_K / Q3_K (block layouts in dequant.cl): a super-block's weights unpacked once as 16 int16-lane
// vectors w[c] = scale_c * q of values 16c..16c+15, then per token isum = sum_c w[c] * qy[c] and
// the float lanes of the others (ggml_vec_dot_q2_K_q8_K / q3_K: Q2_K's 4-bit scales and mins, the
// mins as sum_j bsums[j] * (scales[j] >> 4); Q3_K's 6-bit scales minus 32 and the hmask bit
// (clear: minus 4)). The prompt kernel below reuses one unpacking for its tokens, with the same
// integers and float operations per token as dotq8_row. nb counts 32-value units (QKV).
#define Q8K_W int16
#if defined(W_Q2_K)
#define Q8K_SB_BYTES 84
inline void q8k_unpack(const global uchar *p, int16 *w) {
    const int16 isc = convert_int16(vload16(0, p) & (uchar)15);
#pragma unroll
    for (int s = 0; s < 8; s++) {
        const global uchar *q = p + 16 + 32 * (s >> 2);
        const uchar sh = (uchar)(2 * (s & 3));
        w[2 * s] = I16((vload16(0, q) >> sh) & (uchar)3) * isc[2 * s];
        w[2 * s + 1] = I16((vload16(1, q) >> sh) & (uchar)3) * isc[2 * s + 1];
    }
}
#else
#define Q8K_SB_BYTES 110
inline int q3k_iscale(const global uchar *p, int k) {
    const uint lo = k < 8 ? (p[96 + k] & 15u) : (p[96 + k - 8] >> 4);
    const uint hi = (p[104 + (k & 3)] >> (2 * (k >> 2))) & 3u;
    return (int)(lo | (hi << 4)) - 32;
}
inline void q8k_unpack(const global uchar *p, int16 *w) {
    const uchar16 h0 = vload16(0, p), h1 = vload16(1, p);
#pragma unroll
    for (int s = 0; s < 8; s++) {
        const global uchar *q = p + 32 + 32 * (s >> 2);
        const uchar sh = (uchar)(2 * (s & 3)), m = (uchar)(1 << s);
        w[2 * s] = (I16((vload16(0, q) >> sh) & (uchar)3) - select((int16)(4), (int16)(0), I16(h0 & m) != 0))
                   * q3k_iscale(p, 2 * s);
        w[2 * s + 1] = (I16((vload16(1, q) >> sh) & (uchar)3) - select((int16)(4), (int16)(0), I16(h1 & m) != 0))
                       * q3k_iscale(p, 2 * s + 1);
    }
}
#endif
// acc + super-block p's products with one token's quants xb and record rec
inline float16 q8k_sb_dot(const global uchar *p, const int16 *w, const global char *xb, const global float *rec,
                          float16 acc) {
    int16 isum = (int16)(0);
#pragma unroll
    for (int c = 0; c < 16; c++) isum += w[c] * I16(vload16(c, xb));
#if defined(W_Q2_K)
    const int16 mins = convert_int16(vload16(0, p) >> (uchar)4) * convert_int16(vload16(0, (const global short *)rec));
    acc = fma(convert_float16(isum), (float16)(LOAD_HALF(p + 80) * rec[8]), acc);
    acc.s0 = fma(-(LOAD_HALF(p + 82) * rec[8]), (float)hsum_i8(mins.lo + mins.hi), acc.s0);
#else
    acc = fma(convert_float16(isum), (float16)(LOAD_HALF(p + 108) * rec[8]), acc);
#endif
    return acc;
}
#endif
// dotq8_row (nb: QKV-value units, 32 or 256) and the prompt kernel on the same two helpers
#if !defined(Q8K_OWN_ROW) && !defined(Q8K_AVX2)
inline float16 dotq8_row(const global uchar *row, int nb, const global char *xq, const global float2 *xd, int lid,
                         float16 acc) {
    for (int ib = lid; ib < nb / (256 / QKV); ib += MV_LS) {
        const global uchar *p = row + (size_t)ib * Q8K_SB_BYTES;
        Q8K_W w[16];
        q8k_unpack(p, w);
        acc = q8k_sb_dot(p, w, xq + (size_t)ib * 256, (const global float *)xd + (size_t)ib * 16, acc);
    }
    return acc;
}
#endif
#if MV_LS == 1 && !defined(Q8K_AVX2) && !(defined(COOKTOP_NO_MMQ_K) && (defined(W_Q4_K) || defined(W_Q5_K) || defined(W_Q6_K)))
// Prompt matrices (CPU launch shape): mul_mm_q8's grid (mmq8.cl), MMQ_R rows x MMQ_TT tiles of
// MMQ_TN tokens per work-item; each row's super-block is unpacked once for a tile's tokens, each
// token gets dotq8_row's sums.
#define Q8K_MM_LOW 1
__kernel void mul_mm_q8(const global uchar *w, const global char *xq, const global float2 *xd,
                        global float *y, const int n_in, const int n_out, const int n_tok) {
    const int tb = get_group_id(1) * (MMQ_TN * MMQ_TT), r0 = get_global_id(0) * MMQ_R, nsb = n_in / 256;
    for (int t0 = tb; t0 < min(n_tok, tb + MMQ_TN * MMQ_TT); t0 += MMQ_TN) {
    const int nt = min(MMQ_TN, n_tok - t0);
    for (int r = r0; r < min(r0 + MMQ_R, n_out); r++) {
        const global uchar *wr = w + (size_t)r * ROW_BYTES(n_in);
        float16 acc[MMQ_TN];
        for (int t = 0; t < MMQ_TN; t++) acc[t] = (float16)(0.0f);
        for (int ib = 0; ib < nsb; ib++) {
            const global uchar *p = wr + (size_t)ib * Q8K_SB_BYTES;
            Q8K_W wq[16];
            q8k_unpack(p, wq);
            for (int t = 0; t < nt; t++) {
                const size_t tt = (size_t)(t0 + t);
                acc[t] = q8k_sb_dot(p, wq, xq + tt * n_in + (size_t)ib * 256,
                                    (const global float *)(xd + tt * (n_in / 32)) + (size_t)ib * 16, acc[t]);
            }
        }
        for (int t = 0; t < nt; t++) y[(size_t)(t0 + t) * n_out + r] = hsum16(acc[t]);
    }
    }
}
#endif
#endif  // portable
#endif  // Q8K_ON
