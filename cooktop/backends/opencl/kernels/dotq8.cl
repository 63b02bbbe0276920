// Integer dot products of GGML weight blocks with 8-bit quantized activations.
// Appended to dequant.cl (one W_<TYPE> defined); matmul.cl and mmq8.cl follow.
//
// Activations are quantized per 32 values as llama.cpp's block_q8_1 (ggml-common.h),
// stored as two planes so the quants load as plain vectors:
//   xq char [n_tok, n_in]          q = round(x / d), |q| <= 127
//   xd float2 [n_tok, n_in / 32]   (d, d * sum(q)),  d = max|x| / 127
// (quantize_row_q8_1, ggml-quants.c). A weight block then contributes
//   d_w * d_x * sum(q_w * q_x)  (+ offset terms through d_x * sum(q_x))
// where the sums over int8 x int8 products are exact in int32, as in ggml's
// vec_dot_q4_0_q8_0 & co. On CPUs, int16 x int16 -> int32 products of sign-extended
// bytes compile to pmaddwd (x86) / smull (ARM); on GPUs to integer multiply-adds.
//
// Each type defines HAS_Q8 and
//   float16 dotq8_block(row, ib, xq, xd, acc)   acc + the products of block ib (QKV values)
// whose 16 lanes hold partial sums (hsum16 at the end). Types without HAS_Q8 run
// the float kernels (mul_mv / mul_mm) only.

// -DQ8K: the K-quants (Q4_K, Q5_K, Q6_K) read block_q8_K activations instead (dotq8k.cl).
#if defined(Q8K) && (defined(W_Q4_K) || defined(W_Q5_K) || defined(W_Q6_K) || defined(W_Q2_K) || defined(W_Q3_K))
#define Q8K_ON 1
#endif

// x86 CPUs (PoCL compiles for the host, so clang predefines __AVX2__ etc.): the block
// dot products use the same instructions as ggml's AVX2 code (ggml-cpu/arch/x86/quants.c):
// pmaddubsw (unsigned x signed bytes -> pairs summed in int16), pmaddwd (pairs -> int32),
// psignb (|w| and sign-moved activations for signed weights), vcvtph2ps (fp16 scales).
// 8 float lanes of partial sums (Q8ACC). Built with -DCOOKTOP_PORTABLE=1 the portable
// OpenCL C below runs instead (tests check both on PoCL).
#if defined(__AVX2__) && defined(__F16C__) && !defined(COOKTOP_PORTABLE) \
    && (defined(W_Q4_0) || defined(W_Q8_0) || defined(W_Q4_K) || defined(W_Q6_K) \
        || (defined(W_Q5_K) && defined(__AVX512BW__) && !defined(COOKTOP_NO_AVX512)))
#define X86_Q8 1
#define HAS_Q8 1
// Software prefetch of the weight stream Q8_PF bytes ahead of the loads (prefetcht0; -DQ8_PF=0:
// none). The mat-vecs read each weight byte once, a work-item streaming its row(s) front to back;
// the hardware streamer alone left one thread at ~8 GB/s of Q8_0 rows where a plain sum of the
// same rows reads ~15 (one thread; 2 threads ~30). Q8_PREFETCH(p, n) touches the n cache lines
// from p + Q8_PF, the bytes one loop step consumes; prefetches do not fault past the buffer's end.
#ifndef Q8_PF
#define Q8_PF 1536
#endif
#if Q8_PF > 0
#define Q8_PREFETCH(p, n)                                                                   \
    do {                                                                                  \
        _Pragma("unroll") for (int pf_ = 0; pf_ < (n); pf_++)                             \
            __builtin_prefetch((const global uchar *)(p) + Q8_PF + 64 * pf_);              \
    } while (0)
#else
#define Q8_PREFETCH(p, n) do { } while (0)
#endif
#define Q8ACC float8
#define Q8_HSUM(v) hsum8(v)
inline float hsum8(float8 v) {
    const float4 s4 = v.lo + v.hi;
    const float2 s2 = s4.lo + s4.hi;
    return s2.x + s2.y;
}
typedef uchar uc32 __attribute__((ext_vector_type(32)));
typedef char v32qi __attribute__((vector_size(32)));
typedef char v32qi_u __attribute__((vector_size(32), aligned(1)));
typedef short v16hi __attribute__((vector_size(32)));
typedef int v8si __attribute__((vector_size(32)));
typedef short v8hi __attribute__((vector_size(16)));
#define LOAD32(p) (*(const global v32qi_u *)(p))
#define as_uchar32_u(v) __builtin_astype((v), uc32)
#define CAT16(a, b) __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, \
                                            16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31)
// sum of u8 x s8 products in 8 int32 lanes (4 products each) as float8
inline float8 mulsum_u8s8(v32qi u, v32qi s) {
    const v16hi p = __builtin_ia32_pmaddubsw256(u, s);
    return convert_float8(as_int8(__builtin_ia32_pmaddwd256(p, (v16hi)(short16)(1))));
}
// fp16 -> fp32 with vcvtph2ps (p 2-byte aligned)
inline float h2f(const global uchar *p) {
    const short8 h = (short8)(*(const global short *)p, 0, 0, 0, 0, 0, 0, 0);
    return __builtin_ia32_vcvtph2ps((v8hi)h)[0];
}
#if defined(__AVX512BW__) && !defined(COOKTOP_NO_AVX512)
// 64-byte versions (AVX-512BW): two 32-value blocks per instruction
#define X86_512 1
typedef char v64qi __attribute__((vector_size(64)));
typedef char v64qi_u __attribute__((vector_size(64), aligned(1)));
typedef short v32hi __attribute__((vector_size(64)));
typedef int v16si __attribute__((vector_size(64)));
#define LOAD64(p) (*(const global v64qi_u *)(p))
#define CAT32(a, b) __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, \
    19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, \
    47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63)
// int32 lanes of sum(u * s) over 4 bytes each, as vpdpbusd(0, u, s) gives them (int16 pair sums
// cannot saturate here: |u| <= 63, |s| <= 127)
// The 64 quants of sub-blocks 2j, 2j + 1 of a Q4_K / Q5_K super-block p from its 32 qs bytes z
// (Q5_K: bits 2j, 2j + 1 of the 32 qh bytes at p + 16 as bit 4)
#if defined(W_Q5_K)
#define Q45K_QUANTS(z, p, j, m15) \
    (((v64qi)CAT32((z), (v32qi)((v16hi)(z) >> 4)) & (m15)) \
     | (v64qi)(((v16si)((v64qi)CAT32((v32qi)((v16hi)LOAD32((p) + 16) >> (short)(2 * (j))), \
                                     (v32qi)((v16hi)LOAD32((p) + 16) >> (short)(2 * (j) + 1))) \
                        & (v64qi)(int16)(0x01010101))) << 4))
#else
#define Q45K_QUANTS(z, p, j, m15) ((v64qi)CAT32((z), (v32qi)((v16hi)(z) >> 4)) & (m15))
#endif
inline v16si dot64_u8s8(v64qi u, v64qi s) {
    return __builtin_ia32_pmaddwd512(__builtin_ia32_pmaddubsw512(u, s), (v32hi)(int16)(0x00010001));
}
// sums of u8 x s8 products in 16 int32 lanes (lanes 0..7: bytes 0..31, 8..15: bytes 32..63)
inline float16 mulsum64_u8s8(v64qi u, v64qi s) {
    const v32hi p = __builtin_ia32_pmaddubsw512(u, s);
    return convert_float16(as_int16(__builtin_ia32_pmaddwd512(p, (v32hi)(int16)(0x00010001))));
}
#endif

#if defined(W_Q8_0)
inline float8 dotq8_block(const global uchar *row, int ib, const global char *xq, const global float2 *xd,
                          float8 acc) {
    const global uchar *p = row + (size_t)ib * 34;
    Q8_PREFETCH(p, 1);
    const v32qi w = LOAD32(p + 2), y = LOAD32(xq + (size_t)ib * 32);
    const float8 t = mulsum_u8s8(__builtin_ia32_psignb256(w, w), __builtin_ia32_psignb256(y, w));
    return fma(t, (float8)(h2f(p) * xd[ib].x), acc);
}
#elif defined(W_Q4_0) && defined(REPACK_Q4_0) && defined(X86_512)
// Repacked Q4_0 (dequant.cl: 16 rows in the lanes): a work-item runs a row group, 16 rows at
// once (q4r_rows16; matmul.cl's mat-vec kernels with Q8_ROWS16). Per block, the 8 four-byte
// pieces of the activation's 32 quants, each broadcast to the 16 lanes, meet vectors of the
// 16 rows' matching quants (u8 x s8 products: vpdpbusd with COOKTOP_VNNI, else pmaddubsw +
// pmaddwd, the same exact int32 sums), so int32 lane l holds row l's sum(q qy) over the whole
// block; then per block and lane one conversion and the float operations
//   acc = fma(float(sum(q qy)), d dx, acc),  aco = fma(d, sx, aco)   (blocks in order)
// and y = acc - 8 aco (the -8 of block_q4_0: sx = dx sum(qy)). mul_mm_q8 (mmq8.cl) does the same
// per lane in the same order, so a prompt's tokens get these sums bit for bit.
#define DOTQ8_ROW 1
#define Q8_ROWS16 1
#if MV_LS != 1
#error "repacked Q4_0 runs with one work-item per row group (MV_LS 1; KernelCache.repacks)"
#endif
typedef float v16sf_q4r __attribute__((vector_size(64)));
typedef short v16hi_q4r __attribute__((vector_size(32)));
// the 16 fp16 scales at p as floats
inline float16 q4r_scales(const global uchar *p) {
    const v8hi a = *(const global v8hi *)p, b = *(const global v8hi *)(p + 16);
    return (float16)(as_float8(__builtin_ia32_vcvtph2ps256(a)), as_float8(__builtin_ia32_vcvtph2ps256(b)));
}
#if defined(COOKTOP_VNNI)
#define Q4R_DOT(s, q, x) __builtin_ia32_vpdpbusd512((s), (v16si)(q), (v16si)(int16)(x))
__attribute__((target("avx512vnni")))
#else
#define Q4R_DOT(s, q, x) ((s) + dot64_u8s8((q), (v64qi)(int16)(x)))
#endif
// y[0..15] = rows 16G..16G+15 (group grp) times the activation row xq / xd
__attribute__((noinline)) void q4r_rows16(const global uchar *grp, const int nb, const global char *xq,
                                          const global float2 *xd, global float *y) {
    const v16si zero = (v16si)(int16)(0);
    const v64qi m15 = (v64qi)(int16)(0x0f0f0f0f);
    const global float *dr = (const global float *)xd;
    float16 acc = (float16)(0.0f), aco = (float16)(0.0f);
    for (int b = 0; b < nb; b++) {
        const global uchar *p = grp + (size_t)b * Q4R_BLOCK;
        Q8_PREFETCH(p, 5);  // 288 bytes a step
        const float16 d = q4r_scales(p);
        const global int *xi = (const global int *)(xq + (size_t)b * 32);
        v16si s0 = zero, s1 = zero;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const v64qi z = *(const global v64qi_u *)(p + 32 + 64 * j);
            s0 = Q4R_DOT(s0, z & m15, xi[j]);
            s1 = Q4R_DOT(s1, (v64qi)(((v16si)z >> 4) & (v16si)m15), xi[j + 4]);
        }
        const float dx = dr[2 * b], sx = dr[2 * b + 1];
        acc = fma(convert_float16(as_int16(s0 + s1)), d * dx, acc);
        aco = fma(d, (float16)(sx), aco);
    }
    vstore16(acc - 8.0f * aco, 0, y);
}
#elif (defined(W_Q4_K) || defined(W_Q5_K)) && defined(X86_512) && !defined(Q8K_ON)
// Q4_K / Q5_K with 64-byte vectors: per 32-byte group j of qs the low nibbles (sub-block 2j) and
// high nibbles (2j+1) make one 64-byte vector against 64 contiguous activation bytes (lanes 0..7:
// sub-block 2j, 8..15: 2j+1; Q5_K ORs in bits 2j, 2j+1 of qh as bit 4, values 0..31); the mins
// take the low 8 lanes, one sub-block each. The float operations per lane and their order are
// mul_mm_q8's (mmq8.cl), so a prompt on that kernel gives each token these sums bit for bit.
#undef Q8ACC
#undef Q8_HSUM
#define Q8ACC float16
#define Q8_HSUM(v) hsum16(v)
#define DOTQ8_ROW 1
inline float16 dotq8_row(const global uchar *row, int nb, const global char *xq, const global float2 *xd, int lid,
                         float16 acc) {
    const v64qi m15 = (v64qi)(int16)(0x0f0f0f0f);
    const global float *dr = (const global float *)xd;
    for (int ib = lid; ib < nb; ib += MV_LS) {
        const global uchar *p = row + (size_t)ib * QK_BYTES;
        const float d = h2f(p), dmin = h2f(p + 2);
        const uchar4 s0 = vload4(0, p + 4), s1 = vload4(1, p + 4), s2 = vload4(2, p + 4);
        const float4 sc_lo = convert_float4(s0 & (uchar)63), mn_lo = convert_float4(s1 & (uchar)63);
        const float4 sc_hi = convert_float4((s2 & (uchar)15) | ((s0 >> (uchar)6) << (uchar)4));
        const float4 mn_hi = convert_float4((s2 >> (uchar)4) | ((s1 >> (uchar)6) << (uchar)4));
        const float8 dmn = dmin * (float8)(mn_lo, mn_hi);
        const float16 dxs = vload16(ib, dr);  // (d, s) of the 8 activation blocks
        acc.lo = fma(-dmn, dxs.odd, acc.lo);
        // one rounding per product, so d sc_s dx_s made here once is mul_mm_q8's per-lane value
        const float8 dl = (d * (float8)(sc_lo, sc_hi)) * dxs.even;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const v32qi z = *(const global v32qi_u *)(p + QK_QS + 32 * j);
            const v64qi q = Q45K_QUANTS(z, p, j, m15);
            const float16 ds = (float16)((float8)(dl[2 * j]), (float8)(dl[2 * j + 1]));
            const v64qi ya = LOAD64(xq + (size_t)ib * 256 + 64 * j);
            acc = fma(convert_float16(as_int16(dot64_u8s8(q, ya))), ds, acc);
        }
    }
    return acc;
}
#elif defined(W_Q6_K) && defined(X86_512) && !defined(Q8K_ON)
// Q6_K with 64-byte vectors: group g (0..3) of a super-block is 64 values (half g / 2 of ql/qh,
// low or high nibbles of its 64 ql bytes, two qh bits each as bits 4-5); int32 lane i covers
// values 4i..4i+3 (16-value sub-block 4g + i / 4, 32-value activation block 2g + i / 8). The -32 of
// the 6-bit quants is taken out of the integer sums (32 sum(qy) per lane). Float operations per
// lane in mul_mm_q8's order (mmq8.cl), as for Q4_K.
#undef Q8ACC
#undef Q8_HSUM
#define Q8ACC float16
#define Q8_HSUM(v) hsum16(v)
#define DOTQ8_ROW 1
inline float16 dotq8_row(const global uchar *row, int nb, const global char *xq, const global float2 *xd, int lid,
                         float16 acc) {
    const v64qi m15 = (v64qi)(int16)(0x0f0f0f0f);
    const v64qi m3 = (v64qi)(int16)(0x03030303);
    const v64qi c32 = (v64qi)(int16)(0x20202020);
    const global float *dr = (const global float *)xd;
    for (int ib = lid; ib < nb; ib += MV_LS) {
        const global uchar *p = row + (size_t)ib * 210;
        const float d = h2f(p + 208);
        const float8 dx8 = vload16(ib, dr).even;
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const v64qi ql = LOAD64(p + 64 * (g >> 1));
            const v32qi qh = *(const global v32qi_u *)(p + 128 + 32 * (g >> 1));
            const v64qi lq = (g & 1) ? (v64qi)(((v16si)ql >> 4) & (v16si)m15) : (ql & m15);
            const v16hi qw = (v16hi)qh >> (short)(4 * (g & 1));
            const v64qi hq = (v64qi)CAT32((v32qi)qw, (v32qi)(qw >> 2)) & m3;
            const v64qi q = lq | (v64qi)((v16si)hq << 4);
            const float4 sc = convert_float4(vload4(g, (const global char *)(p + 192)));
            const float16 ds = d * __builtin_shufflevector(sc, sc, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
            const v64qi ya = LOAD64(xq + (size_t)ib * 256 + 64 * g);
            const v16si s = dot64_u8s8(q, ya) - dot64_u8s8(c32, ya);
            const float16 dx = (float16)((float8)(dx8[2 * g]), (float8)(dx8[2 * g + 1]));
            acc = fma(convert_float16(as_int16(s)), ds * dx, acc);
        }
    }
    return acc;
}
#elif defined(W_Q4_0)
// d * sum((q - 8) y) = d * (dx * sum(q qy) - 8 * sx); the 8 lanes each take sx once
inline float8 dotq8_block(const global uchar *row, int ib, const global char *xq, const global float2 *xd,
                          float8 acc) {
    const global uchar *p = row + (size_t)ib * 18;
    const uchar16 q = vload16(0, p + 2);
    const uc32 w = CAT16(q & (uchar)15, q >> (uchar)4);
    const float8 t = mulsum_u8s8((v32qi)w, LOAD32(xq + (size_t)ib * 32));
    const float2 dx = xd[ib];
    return fma(fma(t, (float8)dx.x, (float8)(-dx.y)), (float8)h2f(p), acc);
}
#elif defined(W_Q4_K) && !defined(Q8K_ON)
inline float8 dotq8_block(const global uchar *row, int ib, const global char *xq, const global float2 *xd,
                          float8 acc) {
    const global uchar *p = row + (size_t)ib * 144;
    const float d = h2f(p), dmin = h2f(p + 2);
    const uchar4 s0 = vload4(0, p + 4), s1 = vload4(1, p + 4), s2 = vload4(2, p + 4);
    const float4 sc_lo = convert_float4(s0 & (uchar)63), mn_lo = convert_float4(s1 & (uchar)63);
    const float4 sc_hi = convert_float4((s2 & (uchar)15) | ((s0 >> (uchar)6) << (uchar)4));
    const float4 mn_hi = convert_float4((s2 >> (uchar)4) | ((s1 >> (uchar)6) << (uchar)4));
    const float16 dxs = vload16(ib, (const global float *)xd);  // (d, s) of the 8 sub-blocks
    const float8 dl = d * (float8)(sc_lo, sc_hi) * dxs.even;
    // mins: dmin * m_s * sx_s, spread over the 8 lanes (one sub-block per lane)
    acc = fma((float8)(-dmin) * (float8)(mn_lo, mn_hi), dxs.odd, acc);
    const global uchar *qs = p + 16;
    const global char *xb = xq + (size_t)ib * 256;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const uc32 q = as_uchar32_u(LOAD32(qs + 32 * j));
        const float8 t0 = mulsum_u8s8((v32qi)(q & (uchar)15), LOAD32(xb + 64 * j));
        const float8 t1 = mulsum_u8s8((v32qi)(q >> (uchar)4), LOAD32(xb + 64 * j + 32));
        acc = fma(t0, (float8)dl[2 * j], acc);
        acc = fma(t1, (float8)dl[2 * j + 1], acc);
    }
    return acc;
}
#elif defined(W_Q6_K) && !defined(Q8K_ON)
// per group of 32: sum over its two 16-value halves of sc * ((q - 32) y): pmaddubsw of q
// and of 32 (then subtracted), pmaddwd with the scales as int16 (ggml's AVX2 q6_K)
inline float8 dotq8_block(const global uchar *row, int ib, const global char *xq, const global float2 *xd,
                          float8 acc) {
    const global uchar *p = row + (size_t)ib * 210;
    const float d = h2f(p + 208);
    const global char *xb = xq + (size_t)ib * 256;
    const short16 sc = convert_short16(vload16(0, (const global char *)(p + 192)));
    const float8 dd = d * vload16(ib, (const global float *)xd).even;
    const v32qi m32 = (v32qi)(uc32)(32);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const global uchar *ql = p + 64 * h;
        const uc32 qh = as_uchar32_u(LOAD32(p + 128 + 32 * h));
        const uc32 l0 = as_uchar32_u(LOAD32(ql)), l1 = as_uchar32_u(LOAD32(ql + 32));
        const global char *xh = xb + 128 * h;
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const uc32 lo = (r & 1) ? l1 : l0;
            const uc32 q = ((r >> 1) ? (lo >> (uchar)4) : (lo & (uchar)15)) | (((qh >> (uchar)(2 * r)) & (uchar)3) << (uchar)4);
            const v32qi y = LOAD32(xh + 32 * r);
            const v16hi pq = __builtin_ia32_pmaddubsw256((v32qi)q, y) - __builtin_ia32_pmaddubsw256(m32, y);
            const short a = sc[8 * h + 2 * r], b = sc[8 * h + 2 * r + 1];
            const short16 scv = (short16)((short8)(a), (short8)(b));
            const float8 t = convert_float8(as_int8(__builtin_ia32_pmaddwd256(pq, (v16hi)scv)));
            acc = fma(t, (float8)dd[4 * h + r], acc);
        }
    }
    return acc;
}
#endif

#else  // portable OpenCL C
#define Q8ACC float16
#define Q8_HSUM(v) hsum16(v)
#define I16(v) convert_int16(v)

#if defined(W_Q8_0)
#define HAS_Q8 1
// block_q8_0: y = d * qs
inline float16 dotq8_block(const global uchar *row, int ib, const global char *xq, const global float2 *xd,
                           float16 acc) {
    const global uchar *p = row + (size_t)ib * 34;
    const global char *q = (const global char *)(p + 2);
    const global char *xb = xq + (size_t)ib * 32;
    const int16 s = I16(vload16(0, q)) * I16(vload16(0, xb)) + I16(vload16(1, q)) * I16(vload16(1, xb));
    return fma(convert_float16(s), (float16)(LOAD_HALF(p) * xd[ib].x), acc);
}

#elif defined(W_Q4_0)
#define HAS_Q8 1
// block_q4_0: y = d * (q - 8), q = low nibbles (values 0..15) then high nibbles (16..31);
// d * (dx * sum(q qx) - 8 * sx) keeps one factor of each product unsigned (cheaper on CPUs)
inline float16 dotq8_block(const global uchar *row, int ib, const global char *xq, const global float2 *xd,
                           float16 acc) {
    const global uchar *p = row + (size_t)ib * 18;
    const uchar16 q = vload16(0, p + 2);
    const global char *xb = xq + (size_t)ib * 32;
    const int16 s = I16(q & (uchar)15) * I16(vload16(0, xb)) + I16(q >> (uchar)4) * I16(vload16(1, xb));
    const float2 dx = xd[ib];
    const float d = LOAD_HALF(p);
    acc.s0 = fma(-8.0f * d, dx.y, acc.s0);
    return fma(convert_float16(s), (float16)(d * dx.x), acc);
}

#elif defined(W_Q4_1)
#define HAS_Q8 1
// block_q4_1: y = d * q + m  ->  d*dx*sum(q*qx) + m * (dx*sum(qx))
inline float16 dotq8_block(const global uchar *row, int ib, const global char *xq, const global float2 *xd,
                           float16 acc) {
    const global uchar *p = row + (size_t)ib * 20;
    const uchar16 q = vload16(0, p + 4);
    const global char *xb = xq + (size_t)ib * 32;
    const int16 s = I16(q & (uchar)15) * I16(vload16(0, xb)) + I16(q >> (uchar)4) * I16(vload16(1, xb));
    const float2 dx = xd[ib];
    acc.s0 = fma(LOAD_HALF(p + 2), dx.y, acc.s0);
    return fma(convert_float16(s), (float16)(LOAD_HALF(p) * dx.x), acc);
}

#elif defined(W_Q5_0) || defined(W_Q5_1)
#define HAS_Q8 1
// 5-bit quants as in q5_raw (dequant.cl); Q5_0: y = d * (q - 16), Q5_1: y = d * q + m
inline float16 dotq8_block(const global uchar *row, int ib, const global char *xq, const global float2 *xd,
                           float16 acc) {
    const global uchar *p = row + (size_t)ib * Q5_BYTES;
    const uchar4 h = vload4(0, p + Q5_QH);
    const uint qh = (uint)h.s0 | ((uint)h.s1 << 8) | ((uint)h.s2 << 16) | ((uint)h.s3 << 24);
    const uint16 sh = (uint16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const int16 hl = as_int16(((((uint16)qh) >> sh) & 1u) << 4);
    const int16 hh = as_int16(((((uint16)qh) >> (sh + 16u)) & 1u) << 4);
    const uchar16 q = vload16(0, p + Q5_QH + 4);
    const global char *xb = xq + (size_t)ib * 32;
    const int16 qa = I16(q & (uchar)15) | hl, qb = I16(q >> (uchar)4) | hh;  // unsigned 0..31
    const int16 s = qa * I16(vload16(0, xb)) + qb * I16(vload16(1, xb));
    const float2 dx = xd[ib];
    const float d = LOAD_HALF(p);
#if defined(W_Q5_1)
    acc.s0 = fma(LOAD_HALF(p + 2), dx.y, acc.s0);
#else
    acc.s0 = fma(-16.0f * d, dx.y, acc.s0);  // d * (dx * sum(q qx) - 16 * sx)
#endif
    return fma(convert_float16(s), (float16)(d * dx.x), acc);
}

#elif (defined(W_Q4_K) || defined(W_Q5_K)) && !defined(Q8K_ON)
#define HAS_Q8 1
// Super-block of 8 sub-blocks s of 32: y = d*sc_s*q - dmin*m_s, so the block adds
// sum_s d*sc_s*dx_s*sum(q*qx) - dmin*m_s*(dx_s*sum(qx)) (vec_dot_q4_K_q8_K).
inline float16 dotq8_block(const global uchar *row, int ib, const global char *xq, const global float2 *xd,
                           float16 acc) {
    const global uchar *p = row + (size_t)ib * QK_BYTES;
    const float d = LOAD_HALF(p), dmin = LOAD_HALF(p + 2);
    const uchar4 s0 = vload4(0, p + 4), s1 = vload4(1, p + 4), s2 = vload4(2, p + 4);
    const float4 sc_lo = convert_float4(s0 & (uchar)63), mn_lo = convert_float4(s1 & (uchar)63);
    const float4 sc_hi = convert_float4((s2 & (uchar)15) | ((s0 >> (uchar)6) << (uchar)4));
    const float4 mn_hi = convert_float4((s2 >> (uchar)4) | ((s1 >> (uchar)6) << (uchar)4));
    const float16 dxs = vload16(ib, (const global float *)xd);  // (d, s) of the 8 sub-blocks
    const float8 dx = dxs.even, sx = dxs.odd;
    const float8 dl = d * (float8)(sc_lo, sc_hi) * dx;
    const float8 ml = dmin * (float8)(mn_lo, mn_hi) * sx;
    const global char *xb = xq + (size_t)ib * 256;
    const global uchar *qs = p + QK_QS;
#if defined(W_Q5_K)
    const uchar16 ha = vload16(0, p + 16), hb = vload16(1, p + 16);
#endif
    float8 mm = ml;
    acc.s0 -= (mm.s0 + mm.s1 + mm.s2 + mm.s3) + (mm.s4 + mm.s5 + mm.s6 + mm.s7);
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
        acc = fma(convert_float16(t0), (float16)dl[2 * j], acc);
        acc = fma(convert_float16(t1), (float16)dl[2 * j + 1], acc);
    }
    return acc;
}

#elif defined(W_Q6_K) && !defined(Q8K_ON)
#define HAS_Q8 1
// Two halves of 128 values, four groups r of 32 each (deq_unit in dequant.cl); the
// 16-value halves of a group have their own int8 scale: y = d * sc * (q - 32).
inline float16 dotq8_block(const global uchar *row, int ib, const global char *xq, const global float2 *xd,
                           float16 acc) {
    const global uchar *p = row + (size_t)ib * 210;
    const float d = LOAD_HALF(p + 208);
    const global char *xb = xq + (size_t)ib * 256;
    const int16 scv = convert_int16(vload16(0, (const global char *)(p + 192)));
    const float16 dxs = vload16(ib, (const global float *)xd);
    const float8 dd = d * dxs.even;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const global uchar *ql = p + 64 * h;
        const global uchar *qh = p + 128 + 32 * h;
        const uchar16 la = vload16(0, ql), lb = vload16(1, ql), lc = vload16(2, ql), ld = vload16(3, ql);
        const uchar16 ha = vload16(0, qh), hb = vload16(1, qh);
        const global char *xh = xb + 128 * h;
#define Q6_GROUP(r, lo_a, lo_b, nsh)                                                                      \
        {                                                                                                 \
            const char16 qa = as_char16(((lo_a >> (uchar)nsh) & (uchar)15)                                \
                                        | (((ha >> (uchar)(2 * r)) & (uchar)3) << (uchar)4)) - (char)32;  \
            const char16 qb = as_char16(((lo_b >> (uchar)nsh) & (uchar)15)                                \
                                        | (((hb >> (uchar)(2 * r)) & (uchar)3) << (uchar)4)) - (char)32;  \
            const int16 t = I16(qa) * I16(vload16(2 * r, xh)) * scv[8 * h + 2 * r]                         \
                          + I16(qb) * I16(vload16(2 * r + 1, xh)) * scv[8 * h + 2 * r + 1];                \
            acc = fma(convert_float16(t), (float16)dd[4 * h + r], acc);                                   \
        }
        Q6_GROUP(0, la, lb, 0)
        Q6_GROUP(1, lc, ld, 0)
        Q6_GROUP(2, la, lb, 4)
        Q6_GROUP(3, lc, ld, 4)
#undef Q6_GROUP
    }
    return acc;
}
#endif
#endif  // portable

#if defined(HAS_Q8) && !defined(DOTQ8_ROW) && !defined(Q8K_ON)
// partial sums of a row's blocks lid, lid + MV_LS, ... (mul_mv_q8)
inline Q8ACC dotq8_row(const global uchar *row, int nb, const global char *xq, const global float2 *xd, int lid,
                       Q8ACC acc) {
    for (int ib = lid; ib < nb; ib += MV_LS) acc = dotq8_block(row, ib, xq, xd, acc);
    return acc;
}
#endif
