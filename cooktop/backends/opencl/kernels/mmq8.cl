// Prompt matrices on 8-bit activations with AVX-512 VNNI (mul_mm_q8): one mm_q8_wi per weight
// type (a program has one), for Q8_0, repacked Q4_0, Q4_K / Q5_K and Q6_K; each gives a token the
// mat-vec rows' sums (dotq8.cl) bit for bit. Appended to dequant.cl, dotq8.cl and
// matmul.cl (programs.py PROGRAMS["weights"]).

#if defined(X86_512) && defined(COOKTOP_VNNI)
// CAT32 (two 32-byte vectors as one of 64) comes from dotq8.cl
// What every mm_q8_wi (one per weight type below; a program has one) begins and ends with,
// macros so that the body stays one function (see the register rules of the Q4_0 kernel):
// nt tokens of this work-item, acc[r][t] 16-lane partial sums, wr/xr/dr the rows of w, xq, xd.
#define MMQ_WI_BEGIN()                                                                    \
    const int nt = min(MMQ_TN, n_tok - t0);                                              \
    float16 acc[MMQ_R][MMQ_TN];                                                           \
    const global uchar *wr[MMQ_R];                                                        \
    const global char *xr[MMQ_TN];                                                        \
    const global float *dr[MMQ_TN];                                                       \
    const v16si zero = (v16si)(int16)(0);                                                 \
    _Pragma("unroll")                                                                     \
    for (int t = 0; t < MMQ_TN; t++) {                                                    \
        const size_t tt = (size_t)(t0 + min(t, nt - 1));                                  \
        xr[t] = xq + tt * n_in;                                                           \
        dr[t] = (const global float *)(xd + tt * (n_in / 32));                            \
    }                                                                                     \
    _Pragma("unroll")                                                                     \
    for (int r = 0; r < MMQ_R; r++) {                                                     \
        wr[r] = w + (size_t)min(r0 + r, n_out - 1) * ROW_BYTES(n_in);                     \
        _Pragma("unroll")                                                                 \
        for (int t = 0; t < MMQ_TN; t++) acc[r][t] = (float16)(0.0f);                     \
    }
#define MMQ_WI_STORE()                                                                    \
    for (int r = 0; r < MMQ_R && r0 + r < n_out; r++)                                     \
        for (int t = 0; t < nt; t++) y[(size_t)(t0 + t) * n_out + r0 + r] = hsum16(acc[r][t])
#endif

#if defined(W_Q4_0) && defined(REPACK_Q4_0) && defined(X86_512) && defined(COOKTOP_VNNI)
// Prompt matrices on 8-bit activations with AVX-512 VNNI (vpdpbusd: 64 u8 x s8 products
// summed in 16 int32 lanes, one instruction), for repacked Q4_0 (dequant.cl): the host
// defines COOKTOP_VNNI when the CPU (the PoCL device) has avx512_vnni; the compiler's
// target need not. Per group of 4 blocks each row's nibbles are split once and each
// token's 128 quants loaded once: y = sum_b d_b dx_b sum((q - 8) qy) (block_q4_0).
// The VNNI code is one function per work-item with the target attribute: PoCL inlines the
// kernel into a work-group function compiled for its own target, so VNNI instructions may
// not appear in the kernel itself, and helpers called per block would spill every register.
// A work-item owns MMQ_R rows x MMQ_TN tokens (LaunchShape.mmq_r / mmq_tn). The float
// operations per lane are those of the repacked mat-vec (dotq8_row in dotq8.cl) in its order,
// so each token gets the one-token sums bit for bit: y = sum_g (d dx) sum(q qy) - 8 sum_g d sx,
// the second sum (one float4 per row and token) in a pass of its own after the main loop.
__attribute__((target("avx512vnni"))) __attribute__((noinline))
void mm_q8_wi(const global uchar *w, const global char *xq, const global float2 *xd, global float *y,
              const int n_in, const int n_out, const int n_tok, const int r0, const int t0) {
    const int ng = n_in / 128;
    MMQ_WI_BEGIN();
    const v64qi m15 = (v64qi)(int16)(0x0f0f0f0f);
    for (int g = 0; g < ng; g++) {
        v64qi lo[MMQ_R], hi[MMQ_R];
        float4 d[MMQ_R];
#pragma unroll
        for (int r = 0; r < MMQ_R; r++) {
            const global uchar *gp = wr[r] + (size_t)g * 72;
            const v64qi z = *(const global v64qi_u *)(gp + 8);
            lo[r] = z & m15;
            hi[r] = (v64qi)(((v16si)z >> 4) & (v16si)m15);
            const short8 h = (short8)(vload4(0, (const global short *)gp), (short4)(0));
            d[r] = as_float4(__builtin_ia32_vcvtph2ps((v8hi)h));
        }
#pragma unroll
        for (int t = 0; t < MMQ_TN; t++) {
            const v64qi ya = *(const global v64qi_u *)(xr[t] + (size_t)g * 128);
            const v64qi yb = *(const global v64qi_u *)(xr[t] + (size_t)g * 128 + 64);
            const float4 dx = vload8(g, dr[t]).even;
#pragma unroll
            for (int r = 0; r < MMQ_R; r++) {
                const float4 sc = d[r] * dx;
                const float16 s01 = __builtin_shufflevector(sc, sc, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
                const float16 s23 = __builtin_shufflevector(sc, sc, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
                const float16 p01 = convert_float16(as_int16(__builtin_ia32_vpdpbusd512(zero, (v16si)lo[r], (v16si)ya)));
                const float16 p23 = convert_float16(as_int16(__builtin_ia32_vpdpbusd512(zero, (v16si)hi[r], (v16si)yb)));
                acc[r][t] = fma(p23, s23, fma(p01, s01, acc[r][t]));
            }
        }
    }
#pragma unroll
    for (int r = 0; r < MMQ_R; r++) {  // the -8 of block_q4_0: 8 sum_g d_g sx_g, as dotq8_row sums it
        float4 acc_o[MMQ_TN];
#pragma unroll
        for (int t = 0; t < MMQ_TN; t++) acc_o[t] = (float4)(0.0f);
        for (int g = 0; g < ng; g++) {
            const short8 h = (short8)(vload4(0, (const global short *)(wr[r] + (size_t)g * 72)), (short4)(0));
            const float4 d = as_float4(__builtin_ia32_vcvtph2ps((v8hi)h));
#pragma unroll
            for (int t = 0; t < MMQ_TN; t++) acc_o[t] = fma(d, vload8(g, dr[t]).odd, acc_o[t]);
        }
#pragma unroll
        for (int t = 0; t < MMQ_TN; t++) acc[r][t].s0123 -= 8.0f * acc_o[t];
    }
    MMQ_WI_STORE();
}

#define HAS_MM_Q8_WI
#endif


#if defined(W_Q8_0) && defined(X86_512) && defined(COOKTOP_VNNI)
// Prompt matrices on 8-bit activations with AVX-512 VNNI for Q8_0 (block_q8_0: fp16 d, 32 int8 q;
// y = sum_b d_b dx_b sum(q qy)). vpdpbusd multiplies u8 by s8, so the activations go in offset by
// 128 (qy ^ 0x80 = qy + 128 as u8, once per token and block) and each row's int32 lanes start from
// -128 sum(q) over their 4 bytes (vpdpbusd of 128 with the weights, once per row and block: 8-10 %
// less time at 128 tokens than offsetting the weights, whose correction came per token): the same
// exact integers as the mat-vec's psignb + pmaddubsw + pmaddwd (dotq8.cl). The mat-vec sums each block into the
// same 8 float lanes (fma of the lane's int32 sum with d dx, blocks in order, then hsum8), so here
// a 16-lane accumulator holds two rows of one token (lanes 0..7: row 2p, 8..15: row 2p + 1) and
// the token's 32 activation bytes go in both halves: per block one vpdpbusd, one conversion, one
// product d dx and one fma per row pair and token, the one-token kernel's per-lane operations in
// its order, so each token gets its sums bit for bit. A work-item owns MMQ_R (even) rows x MMQ_TN
// tokens; register rules as for the Q4_0 kernel.
#define MMQ8_RP (MMQ_R / 2)
__attribute__((target("avx512vnni"))) __attribute__((noinline))
void mm_q8_wi(const global uchar *w, const global char *xq, const global float2 *xd, global float *y,
              const int n_in, const int n_out, const int n_tok, const int r0, const int t0) {
    const int nb = n_in / 32;
    const int nt = min(MMQ_TN, n_tok - t0);
    float16 acc[MMQ8_RP][MMQ_TN];
    const global uchar *wr[MMQ_R];
    const global char *xr[MMQ_TN];
    const global float *dr[MMQ_TN];
    const v16si zero = (v16si)(int16)(0);
    const v64qi c128 = (v64qi)(int16)((int)0x80808080);
#pragma unroll
    for (int t = 0; t < MMQ_TN; t++) {
        const size_t tt = (size_t)(t0 + min(t, nt - 1));
        xr[t] = xq + tt * n_in;
        dr[t] = (const global float *)(xd + tt * (n_in / 32));
    }
#pragma unroll
    for (int r = 0; r < MMQ_R; r++) wr[r] = w + (size_t)min(r0 + r, n_out - 1) * ROW_BYTES(n_in);
#pragma unroll
    for (int p = 0; p < MMQ8_RP; p++)
#pragma unroll
        for (int t = 0; t < MMQ_TN; t++) acc[p][t] = (float16)(0.0f);
    for (int b = 0; b < nb; b++) {
        v64qi q[MMQ8_RP];
        v16si nw[MMQ8_RP];
        float16 d[MMQ8_RP];
#pragma unroll
        for (int p = 0; p < MMQ8_RP; p++) {
            const global uchar *pa = wr[2 * p] + (size_t)b * 34, *pb = wr[2 * p + 1] + (size_t)b * 34;
            q[p] = (v64qi)CAT32(LOAD32(pa + 2), LOAD32(pb + 2));
            nw[p] = zero - __builtin_ia32_vpdpbusd512(zero, (v16si)c128, (v16si)q[p]);
            d[p] = (float16)((float8)(h2f(pa)), (float8)(h2f(pb)));
        }
#pragma unroll
        for (int t = 0; t < MMQ_TN; t++) {
            const v32qi x = LOAD32(xr[t] + (size_t)b * 32);
            const v64qi xx = (v64qi)CAT32(x, x) ^ c128;
            const float dx = dr[t][2 * b];
#pragma unroll
            for (int p = 0; p < MMQ8_RP; p++) {
                const float16 pr = convert_float16(as_int16(__builtin_ia32_vpdpbusd512(nw[p], (v16si)xx, (v16si)q[p])));
                acc[p][t] = fma(pr, d[p] * dx, acc[p][t]);
            }
        }
    }
    for (int p = 0; p < MMQ8_RP; p++)
        for (int t = 0; t < nt; t++) {
            global float *yt = y + (size_t)(t0 + t) * n_out + r0 + 2 * p;
            if (r0 + 2 * p < n_out) yt[0] = hsum8(acc[p][t].lo);
            if (r0 + 2 * p + 1 < n_out) yt[1] = hsum8(acc[p][t].hi);
        }
}

#define HAS_MM_Q8_WI
#endif

#if (defined(W_Q4_K) || defined(W_Q5_K)) && defined(X86_512) && defined(COOKTOP_VNNI) && !defined(COOKTOP_NO_MMQ_K) \
    && !defined(Q8K_ON)
// Prompt matrices on 8-bit activations with AVX-512 VNNI for Q4_K and Q5_K (block layouts in dequant.cl;
// Q5_K's fifth bit from qh as in dotq8.cl's Q45K_QUANTS),
// llama.cpp's Q4_K x Q8 idea (ggml_vec_dot_q4_K_q8_K, ggml-cpu/arch/x86/quants.c) on block_q8_1
// activations: per sub-block s of 32 values, y += d sc_s dx_s sum(q qx) - dmin m_s sx_s, where
// sx_s = dx_s sum(qx) comes with the activation (xd.y). Per super-block and row the 6-bit
// scales/mins are decoded once; per 32-byte group j of qs the low nibbles (sub-block 2j) and
// high nibbles (2j+1) are made one 64-byte vector once per row, matching 64 contiguous
// activation bytes, so each token costs one load and one vpdpbusd per row (lanes 0..7:
// sub-block 2j, 8..15: 2j+1). Same work-item shape and register rules as the Q4_0 kernel.
__attribute__((target("avx512vnni"))) __attribute__((noinline))
void mm_q8_wi(const global uchar *w, const global char *xq, const global float2 *xd, global float *y,
              const int n_in, const int n_out, const int n_tok, const int r0, const int t0) {
    const int nsb = n_in / 256;
    MMQ_WI_BEGIN();
    const v64qi m15 = (v64qi)(int16)(0x0f0f0f0f);
    for (int ib = 0; ib < nsb; ib++) {
        float8 dsc[MMQ_R];
#pragma unroll
        for (int r = 0; r < MMQ_R; r++) {
            const global uchar *p = wr[r] + (size_t)ib * QK_BYTES;
            const float d = h2f(p), dmin = h2f(p + 2);
            const uchar4 s0 = vload4(0, p + 4), s1 = vload4(1, p + 4), s2 = vload4(2, p + 4);
            const float4 sc_lo = convert_float4(s0 & (uchar)63), mn_lo = convert_float4(s1 & (uchar)63);
            const float4 sc_hi = convert_float4((s2 & (uchar)15) | ((s0 >> (uchar)6) << (uchar)4));
            const float4 mn_hi = convert_float4((s2 >> (uchar)4) | ((s1 >> (uchar)6) << (uchar)4));
            dsc[r] = d * (float8)(sc_lo, sc_hi);
            const float8 dmn = dmin * (float8)(mn_lo, mn_hi);
#pragma unroll
            for (int t = 0; t < MMQ_TN; t++) {  // mins: one sub-block per lane of the low half
                const float8 sx = vload16(ib, dr[t]).odd;
                acc[r][t].lo = fma(-dmn, sx, acc[r][t].lo);
            }
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            v64qi q[MMQ_R];
            float16 ds[MMQ_R];  // d sc of sub-blocks 2j (lanes 0..7) and 2j+1 (8..15)
#pragma unroll
            for (int r = 0; r < MMQ_R; r++) {
                const global uchar *p = wr[r] + (size_t)ib * QK_BYTES;
                const v32qi z = *(const global v32qi_u *)(p + QK_QS + 32 * j);
                q[r] = Q45K_QUANTS(z, p, j, m15);
                ds[r] = (float16)((float8)(dsc[r][2 * j]), (float8)(dsc[r][2 * j + 1]));
            }
#pragma unroll
            for (int t = 0; t < MMQ_TN; t++) {
                const v64qi ya = *(const global v64qi_u *)(xr[t] + (size_t)ib * 256 + 64 * j);
                const float2 d2 = vload4(ib * 4 + j, dr[t]).even;
                const float16 dx = __builtin_shufflevector(d2, d2, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
#pragma unroll
                for (int r = 0; r < MMQ_R; r++) {
                    const float16 pr = convert_float16(as_int16(__builtin_ia32_vpdpbusd512(zero, (v16si)q[r], (v16si)ya)));
                    acc[r][t] = fma(pr, ds[r] * dx, acc[r][t]);
                }
            }
        }
    }
    MMQ_WI_STORE();
}

#define HAS_MM_Q8_WI
#endif

#if defined(W_Q6_K) && defined(X86_512) && defined(COOKTOP_VNNI) && !defined(COOKTOP_NO_MMQ_K) && !defined(Q8K_ON)
// Prompt matrices on 8-bit activations with AVX-512 VNNI for Q6_K (block layout in dequant.cl;
// ggml_vec_dot_q6_K_q8_K's scheme on block_q8_1 activations): group g (0..3) of a super-block is
// 64 values, half h = g / 2 of ql/qh, low (g even) or high (g odd) nibbles of 64 ql bytes with
// qh bits 0-1 / 2-3 (g even) or 4-5 / 6-7 (g odd) of its 32 qh bytes as bits 4-5. int32 lane i of
// vpdpbusd covers values 4i..4i+3: 16-value sub-block 4g + i / 4 (int8 scale), 32-value
// activation block 2g + i / 8. The -32 of the 6-bit quants is folded into the integer sums as
// in the Q4_0 kernel: vpdpbusd(-32 sum(qy), q, qy) = sum((q - 32) qy), 32 sum(qy) once per token.
__attribute__((target("avx512vnni"))) __attribute__((noinline))
void mm_q8_wi(const global uchar *w, const global char *xq, const global float2 *xd, global float *y,
              const int n_in, const int n_out, const int n_tok, const int r0, const int t0) {
    const int nsb = n_in / 256;
    MMQ_WI_BEGIN();
    const v64qi m15 = (v64qi)(int16)(0x0f0f0f0f);
    const v64qi m3 = (v64qi)(int16)(0x03030303);
    const v64qi c32 = (v64qi)(int16)(0x20202020);
    for (int ib = 0; ib < nsb; ib++) {
#pragma unroll
        for (int g = 0; g < 4; g++) {
            v64qi q[MMQ_R];
            float16 ds[MMQ_R];  // d sc of the 16-value sub-block of each lane
#pragma unroll
            for (int r = 0; r < MMQ_R; r++) {
                const global uchar *p = wr[r] + (size_t)ib * 210;
                const v64qi ql = *(const global v64qi_u *)(p + 64 * (g >> 1));
                const v32qi qh = *(const global v32qi_u *)(p + 128 + 32 * (g >> 1));
                const v64qi lq = (g & 1) ? (v64qi)(((v16si)ql >> 4) & (v16si)m15) : (ql & m15);
                const v16hi qw = (v16hi)qh >> (short)(4 * (g & 1));
                const v64qi hq = (v64qi)CAT32((v32qi)qw, (v32qi)(qw >> 2)) & m3;
                q[r] = lq | (v64qi)((v16si)hq << 4);
                const float4 sc = convert_float4(vload4(g, (const global char *)(p + 192)));
                ds[r] = h2f(p + 208) * __builtin_shufflevector(sc, sc, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
            }
#pragma unroll
            for (int t = 0; t < MMQ_TN; t++) {
                const v64qi ya = *(const global v64qi_u *)(xr[t] + (size_t)ib * 256 + 64 * g);
                const v16si na = zero - __builtin_ia32_vpdpbusd512(zero, (v16si)c32, (v16si)ya);
                const float2 d2 = vload4(ib * 4 + g, dr[t]).even;
                const float16 dx = __builtin_shufflevector(d2, d2, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
#pragma unroll
                for (int r = 0; r < MMQ_R; r++) {
                    const float16 pr = convert_float16(as_int16(__builtin_ia32_vpdpbusd512(na, (v16si)q[r], (v16si)ya)));
                    acc[r][t] = fma(pr, ds[r] * dx, acc[r][t]);
                }
            }
        }
    }
    MMQ_WI_STORE();
}

#define HAS_MM_Q8_WI
#endif

#if defined(Q8K_ON) && defined(X86_512) && defined(COOKTOP_VNNI) && !defined(COOKTOP_NO_MMQ_K) \
    && (defined(W_Q4_K) || defined(W_Q5_K) || defined(W_Q6_K))
// Prompt matrices of Q4_K, Q5_K and Q6_K on block_q8_K activations (dotq8k.cl): per super-block,
// row and token an int32 vector of sum_s sc_s sum(q qy) (pmaddubsw, then vpdpwssd with the scales:
// dotq8k.cl's pmaddubsw + pmaddwd in one instruction, the same integers), then the one-token
// row's float operations in its order, so each token gets dotq8_row's sums bit for bit. The
// MMQ_R rows of a work-item run in passes of MMQK_RP against all its MMQ_TN tokens, so that the
// MMQK_RP x MMQ_TN integer accumulators stay in registers (the float ones are touched once per
// super-block). At 64 tokens 2 rows x 8 tokens beat 4 x 4 and 4 x 2 (fewer quants built per
// product; scripts/bench_q8k.py).
#ifndef MMQK_RP
#define MMQK_RP 2
#endif
#if defined(W_Q6_K)
#define MMQK_GROUP(p, g, q, scv)                                                                     \
    {                                                                                                \
        const v64qi ql = *(const global v64qi_u *)((p) + 64 * ((g) >> 1));                          \
        const v32qi qh = *(const global v32qi_u *)((p) + 128 + 32 * ((g) >> 1));                     \
        const v64qi lq = ((g) & 1) ? (v64qi)(((v16si)ql >> 4) & (v16si)m15) : (ql & m15);            \
        const v16hi qw = (v16hi)qh >> (short)(4 * ((g) & 1));                                        \
        const v64qi hq = (v64qi)CAT32((v32qi)qw, (v32qi)(qw >> 2)) & m3;                             \
        q = lq | (v64qi)((v16si)hq << 4);                                                            \
        scv = (v16si)Q6K_SCV(scr[r], (g));                                                           \
    }
#define MMQK_BYTES 210
#else
#define MMQK_GROUP(p, g, q, scv)                                                                     \
    {                                                                                                \
        const v32qi z = *(const global v32qi_u *)((p) + QK_QS + 32 * (g));                           \
        q = Q45K_QUANTS(z, (p), (g), m15);                                                           \
        scv = MMQK_SCV(scr[r], g);                                                                   \
    }
#define MMQK_BYTES QK_BYTES
// the scales of sub-blocks 2g (int16 lanes 0..15) and 2g+1 (16..31), one constant shuffle once g is
// unrolled (dotq8k.cl's Q8K_STEP)
#define MMQK_SH(v, a, b) ((v16si)__builtin_shufflevector(v, v, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, \
                                                        b, b, b, b, b, b, b, b, b, b, b, b, b, b, b, b))
#define MMQK_SCV(v, g) ((g) == 0 ? MMQK_SH(v, 0, 1) : (g) == 1 ? MMQK_SH(v, 2, 3) : (g) == 2 ? MMQK_SH(v, 4, 5) \
                                                                                         : MMQK_SH(v, 6, 7))
#endif
__attribute__((target("avx512vnni"))) __attribute__((noinline))
void mm_q8_wi(const global uchar *w, const global char *xq, const global float2 *xd, global float *y,
              const int n_in, const int n_out, const int n_tok, const int r0, const int t0) {
    const int nsb = n_in / 256;
    MMQ_WI_BEGIN();
    const v64qi m15 = (v64qi)(int16)(0x0f0f0f0f);
#if defined(W_Q6_K)
    const v64qi m3 = (v64qi)(int16)(0x03030303);
#endif
    for (int rp = 0; rp < MMQ_R; rp += MMQK_RP) {
        for (int ib = 0; ib < nsb; ib++) {
            v16si isum[MMQK_RP][MMQ_TN];
#if !defined(W_Q6_K)
#pragma unroll
            for (int r = 0; r < MMQK_RP; r++)
#pragma unroll
                for (int t = 0; t < MMQ_TN; t++) isum[r][t] = zero;
            short8 scr[MMQK_RP];  // the 6-bit scales of each row's super-block, decoded once
#pragma unroll
            for (int r = 0; r < MMQK_RP; r++) {
                Q8K_SCALES(wr[rp + r] + (size_t)ib * MMQK_BYTES, sc, mn);
                scr[r] = sc;
            }
#else
            short16 scr[MMQK_RP];  // the int8 scales of each row's super-block
#pragma unroll
            for (int r = 0; r < MMQK_RP; r++)
                scr[r] = convert_short16(vload16(0, (const global char *)(wr[rp + r] + (size_t)ib * MMQK_BYTES + 192)));
            // the integers start from the -32 term, lane s: -32 sc_s bsums_s (dotq8k.cl's q6k_bsum_term,
            // the same int32 lanes: one vpdpwssd of sign-extended -32 sc_s and zero-extended bsums_s)
#pragma unroll
            for (int t = 0; t < MMQ_TN; t++) {
                const v16si bz = (v16si)convert_int16(as_ushort16(Q8K_BSUMS(dr[t] + (size_t)ib * 16)));
#pragma unroll
                for (int r = 0; r < MMQK_RP; r++)
                    isum[r][t] = __builtin_ia32_vpdpwssd512(zero, (v16si)convert_int16(scr[r] * (short)(-32)), bz);
            }
#endif
#pragma unroll
            for (int g = 0; g < 4; g++) {
                v64qi q[MMQK_RP];
                v16si scv[MMQK_RP];
#pragma unroll
                for (int r = 0; r < MMQK_RP; r++) MMQK_GROUP(wr[rp + r] + (size_t)ib * MMQK_BYTES, g, q[r], scv[r]);
#pragma unroll
                for (int t = 0; t < MMQ_TN; t++) {
                    const v64qi ya = *(const global v64qi_u *)(xr[t] + (size_t)ib * 256 + 64 * g);
#pragma unroll
                    for (int r = 0; r < MMQK_RP; r++)
                        isum[r][t] = __builtin_ia32_vpdpwssd512(
                            isum[r][t], (v16si)__builtin_ia32_pmaddubsw512(q[r], ya), scv[r]);
                }
            }
            float dy[MMQ_TN];
#pragma unroll
            for (int t = 0; t < MMQ_TN; t++) dy[t] = dr[t][(size_t)ib * 16 + 8];
#pragma unroll
            for (int r = 0; r < MMQK_RP; r++) {  // dotq8_row's float lanes (dotq8k.cl), in its order
                const global uchar *p = wr[rp + r] + (size_t)ib * MMQK_BYTES;
#if defined(W_Q6_K)
                const float dw = h2f(p + 208);
#pragma unroll
                for (int t = 0; t < MMQ_TN; t++)
                    acc[rp + r][t] = fma(convert_float16(as_int16(isum[r][t])), (float16)(dw * dy[t]), acc[rp + r][t]);
#else
                Q8K_SCALES(p, sc, mn);
                const v32hi m2 = q8k_mins_op(mn);
                const float2 dm = h2f2(p);
                const float dw = dm.x, mw = dm.y;
#pragma unroll
                for (int t = 0; t < MMQ_TN; t++) {
                    const v16si mins = q8k_mins16(m2, dr[t] + (size_t)ib * 16);
                    acc[rp + r][t] = fma(convert_float16(as_int16(isum[r][t])), (float16)(dw * dy[t]), acc[rp + r][t]);
                    acc[rp + r][t] = fma((float16)(-(mw * dy[t])), convert_float16(as_int16(mins)), acc[rp + r][t]);
                }
#endif
            }
        }
    }
    MMQ_WI_STORE();
}

#define HAS_MM_Q8_WI
#endif

#ifdef HAS_MM_Q8_WI
// A work-item runs its MMQ_R rows against MMQ_TT tiles of MMQ_TN tokens, one tile after the other,
// so its rows stay in the cache across the tiles (one tile per work-item streamed the whole matrix
// from memory once per MMQ_TN tokens); the grid's second dimension counts MMQ_TN * MMQ_TT tokens.
__kernel void mul_mm_q8(const global uchar *w, const global char *xq, const global float2 *xd,
                        global float *y, const int n_in, const int n_out, const int n_tok) {
    const int r0 = get_global_id(0) * MMQ_R, tb = get_group_id(1) * (MMQ_TN * MMQ_TT);
    if (r0 < n_out)
        for (int t0 = tb; t0 < min(n_tok, tb + MMQ_TN * MMQ_TT); t0 += MMQ_TN)
            mm_q8_wi(w, xq, xd, y, n_in, n_out, n_tok, r0, t0);
}
#endif
