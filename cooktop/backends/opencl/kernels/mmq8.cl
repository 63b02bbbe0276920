// Prompt matrices on 8-bit activations with AVX-512 VNNI (mul_mm_q8): one mm_q8_wi per weight
// type (a program has one), for Q8_0, repacked Q4_0, Q4_K / Q5_K and Q6_K (block_q8_K activations:
// the K-quants' own mul_mm_q8 at the end instead); each gives a token the
// mat-vec rows' sums (dotq8.cl, dotq8k.cl) bit for bit. Appended to dequant.cl, dotq8.cl and
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
// Prompt matrices on 8-bit activations with AVX-512 VNNI for repacked Q4_0 (dequant.cl: 16 rows in
// the lanes), llama.cpp's ggml_gemm_q4_0_8x8_q8_0 idea (ggml-cpu/repack.cpp): a work-item owns one
// row group (16 rows, MMQ_WI_ROWS) x MMQ_TN tokens. Per block the group's 8 vectors of quants
// (low / high nibbles of its four 64-byte vectors) and 16 scales are made once; per token the 8
// four-byte pieces of its 32 quants go to 8 vpdpbusd as broadcast operands, so int32 lane l sums
// row l's whole block, and then one conversion and the float operations of the mat-vec
// (q4r_rows16 in dotq8.cl) per lane in its order: acc = fma(float(sum), d dx, acc),
// aco = fma(d, sx, aco), y = acc - 8 aco; each token gets the one-token sums bit for bit.
// The VNNI code is one function per work-item with the target attribute: PoCL inlines the
// kernel into a work-group function compiled for its own target, so VNNI instructions may
// not appear in the kernel itself, and helpers called per block would spill every register.
#define MMQ_WI_ROWS 16
__attribute__((target("avx512vnni"))) __attribute__((noinline))
void mm_q8_wi(const global uchar *w, const global char *xq, const global float2 *xd, global float *y,
              const int n_in, const int n_out, const int n_tok, const int r0, const int t0) {
    const int nb = n_in / 32;
    const int nt = min(MMQ_TN, n_tok - t0);
    float16 acc[MMQ_TN], aco[MMQ_TN];
    const global char *xr[MMQ_TN];
    const global float *dr[MMQ_TN];
    const global uchar *wg = ROW_PTR(w, r0, n_in);
    const v16si zero = (v16si)(int16)(0);
    const v64qi m15 = (v64qi)(int16)(0x0f0f0f0f);
#pragma unroll
    for (int t = 0; t < MMQ_TN; t++) {
        const size_t tt = (size_t)(t0 + min(t, nt - 1));
        xr[t] = xq + tt * n_in;
        dr[t] = (const global float *)(xd + tt * nb);
        acc[t] = aco[t] = (float16)(0.0f);
    }
    for (int b = 0; b < nb; b++) {
        const global uchar *p = wg + (size_t)b * Q4R_BLOCK;
        const float16 d = q4r_scales(p);
        v64qi q[8];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const v64qi z = *(const global v64qi_u *)(p + 32 + 64 * j);
            q[j] = z & m15;
            q[j + 4] = (v64qi)(((v16si)z >> 4) & (v16si)m15);
        }
#pragma unroll
        for (int t = 0; t < MMQ_TN; t++) {
            const global int *xi = (const global int *)(xr[t] + (size_t)b * 32);
            v16si s = zero;
#pragma unroll
            for (int c = 0; c < 8; c++) s = __builtin_ia32_vpdpbusd512(s, (v16si)q[c], (v16si)(int16)(xi[c]));
            acc[t] = fma(convert_float16(as_int16(s)), d * dr[t][2 * b], acc[t]);
            aco[t] = fma(d, (float16)(dr[t][2 * b + 1]), aco[t]);
        }
    }
    for (int t = 0; t < nt; t++) vstore16(acc[t] - 8.0f * aco[t], 0, y + (size_t)(t0 + t) * n_out + r0);
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

#if defined(Q45K_LANES) || defined(Q6K_LANES)
// Prompt matrices of Q4_K and Q5_K on block_q8_K activations with 16 rows in the SIMD lanes (llama.cpp's
// block_q4_Kx8 idea, ggml-cpu/repack.cpp, but the plain layout: the rows are transposed in
// registers once per super-block and pass): int32 lane r is row r0 + r. Per super-block the 16 rows'
// quants become 64 vectors wq[8 s + k] (lane r: the 4 quants of values 32 s + 4 k.. of row r; Q5_K's
// fifth bit included, Q4_K the same code without the qh part) and their scales / mins 8 vectors each; per token and sub-block s, 8 vpdpbusd with the
// token's 4-byte pieces as broadcast operands give each row's sum over the sub-block, one vpmulld by
// the scales adds it to the row's integer, and 8 vpdpwssd of the (m_s, m_s) pairs with the bsum pairs
// give the mins' integer. Then per token the mat-vec's float operations (dotq8k.cl's Q4_K / Q5_K
// dotq8_row under Q45K_LANES: one float lane per row, fma(float(isum), d_w d_y), fma(-(dmin_w d_y), float(mins))),
// so each token gets the one-token sums bit for bit. 64 vpdpbusd per 16 rows, token and super-block
// where the former 4-row kernel (one row's quant vectors per group, a token's 64 activation bytes
// against them) needed 16 vpdpbusd, 8 word shuffles, 8 pmaddwd and 12 float / mins operations per 4 rows.
#define MQ5_TN 16  // tokens whose integers sit in registers
#define MQ5_TH 2   // halves of MQ5_TN tokens per built super-block (a pass)
typedef int mq5_v8si_u __attribute__((vector_size(32), aligned(1)));
// rows a, b's 8 dwords at byte offset o of super-block ib as one vector (row a low half)
#define MQ5_P(a, b, o) ((v16si)__builtin_shufflevector(*(const global mq5_v8si_u *)(a + (o)),        \
                        *(const global mq5_v8si_u *)(b + (o)), 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15))
// 8 x 8 dword transposes in both 256-bit halves: p[i] = (row i dwords 0..7, row i + 8 dwords 0..7) ->
// o[c] lane r = row r's dword c (unpack 32, unpack 64, 128-bit lanes)
inline __attribute__((always_inline)) void mq5_tr8(v16si *o, const v16si *p) {
    v16si t[8], u[8];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        t[2 * i] = __builtin_shufflevector(p[2 * i], p[2 * i + 1], 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29);
        t[2 * i + 1] = __builtin_shufflevector(p[2 * i], p[2 * i + 1], 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31);
    }
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            u[4 * j + 2 * e] = __builtin_shufflevector(t[4 * j + e], t[4 * j + e + 2], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
            u[4 * j + 2 * e + 1] = __builtin_shufflevector(t[4 * j + e], t[4 * j + e + 2], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
        }
#pragma unroll
    for (int c = 0; c < 4; c++) {
        o[c] = __builtin_shufflevector(u[c], u[c + 4], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
        o[c + 4] = __builtin_shufflevector(u[c], u[c + 4], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    }
}
#define MQ5_SH(v, n) ((n) >= 0 ? (v) << (n) : (v) >> (-(n)))
#endif

#if defined(Q45K_LANES)
__attribute__((target("avx512vnni"))) __attribute__((noinline))
void mmq45_pass(const global uchar *w, const global char *xq, const global float2 *xd, global float *y,
               const int n_in, const int n_out, const int r0, const int t0, const int nt) {
    const int nsb = n_in / 256;
    const size_t xs = (size_t)n_in, rs = (size_t)(n_in / 16);  // one token's quants / records (floats)
    const v16si m15 = (v16si)(int16)(0x0f0f0f0f);
#if defined(W_Q5_K)
    const v16si m16 = (v16si)(int16)(0x10101010);
#endif
    const global uchar *wr[16];
#pragma unroll
    for (int r = 0; r < 16; r++) wr[r] = w + (size_t)min(r0 + r, n_out - 1) * ROW_BYTES(n_in);
    float16 acc[MQ5_TN * MQ5_TH];
    for (int t = 0; t < MQ5_TN * MQ5_TH; t++) acc[t] = (float16)(0.0f);
    for (int ib = 0; ib < nsb; ib++) {
        const size_t ob = (size_t)ib * QK_BYTES;
        v16si wq[64], scv[8], mnw[8];
        float dd[16], dmn[16];
        {
            v16si p[8], h[8], qv[8];
#if defined(W_Q5_K)
#pragma unroll
            for (int i = 0; i < 8; i++) p[i] = MQ5_P(wr[i], wr[i + 8], ob + 16);  // qh
            mq5_tr8(h, p);
#endif
#pragma unroll
            for (int g = 0; g < 4; g++) {
#pragma unroll
                for (int i = 0; i < 8; i++) p[i] = MQ5_P(wr[i], wr[i + 8], ob + QK_QS + 32 * g);
                mq5_tr8(qv, p);
#pragma unroll
                for (int c = 0; c < 8; c++) {
#if defined(W_Q5_K)
                    // qh bit 2g (low nibbles) and 2g + 1 (high) to bit 4
                    wq[16 * g + c] = (qv[c] & m15) | (MQ5_SH(h[c], 4 - 2 * g) & m16);
                    wq[16 * g + 8 + c] = ((qv[c] >> 4) & m15) | (MQ5_SH(h[c], 3 - 2 * g) & m16);
#else
                    wq[16 * g + c] = qv[c] & m15;
                    wq[16 * g + 8 + c] = (qv[c] >> 4) & m15;
#endif
                }
            }
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const global uchar *pa = wr[i] + ob, *pb = wr[i + 8] + ob;
                int8 sa, ma, sb, mb;
                { Q8K_SCALES(pa, sc, mn); sa = convert_int8(sc); ma = mn; }
                { Q8K_SCALES(pb, sc, mn); sb = convert_int8(sc); mb = mn; }
                p[i] = (v16si)(int16)(sa, sb);
                qv[i] = (v16si)(int16)(ma, mb);
                const float2 da = h2f2(pa), db = h2f2(pb);
                dd[i] = da.x, dmn[i] = da.y, dd[i + 8] = db.x, dmn[i + 8] = db.y;
            }
            mq5_tr8(scv, p);
            mq5_tr8(h, qv);
#pragma unroll
            for (int s = 0; s < 8; s++) mnw[s] = h[s] | (h[s] << 16);  // (m_s, m_s) as int16 words
        }
        const float16 dv = vload16(0, dd), mv = vload16(0, dmn);
        const global char *xb = xq + (size_t)t0 * xs + (size_t)ib * 256;
        const global float *db = (const global float *)xd + (size_t)t0 * rs + (size_t)ib * 16;
        for (int hf = 0; hf < MQ5_TH && hf * MQ5_TN < nt; hf++) {
            int toff[MQ5_TN];  // token of each slot (the last one past nt)
#pragma unroll
            for (int t = 0; t < MQ5_TN; t++) toff[t] = min(hf * MQ5_TN + t, nt - 1);
            v16si is[MQ5_TN];
#pragma unroll
            for (int t = 0; t < MQ5_TN; t++) is[t] = (v16si)(int16)(0);
#pragma unroll 1
            for (int s = 0; s < 8; s++) {
                v16si wk[8];
#pragma unroll
                for (int k = 0; k < 8; k++) wk[k] = wq[8 * s + k];
                const v16si sc = scv[s];
#pragma unroll
                for (int t = 0; t < MQ5_TN; t++) {
                    const global int *xi = (const global int *)(xb + (size_t)toff[t] * xs + 32 * s);
                    v16si a = (v16si)(int16)(0);
#pragma unroll
                    for (int k = 0; k < 8; k++) a = __builtin_ia32_vpdpbusd512(a, wk[k], (v16si)(int16)(xi[k]));
                    is[t] += a * sc;
                }
            }
#pragma unroll
            for (int t = 0; t < MQ5_TN; t++) {
                const global int *rec = (const global int *)(db + (size_t)toff[t] * rs);
                v16si mi = (v16si)(int16)(0);
#pragma unroll
                for (int s = 0; s < 8; s++) mi = __builtin_ia32_vpdpwssd512(mi, mnw[s], (v16si)(int16)(rec[s]));
                const float dy = as_float(rec[8]);
                float16 a = fma(convert_float16(as_int16(is[t])), dv * dy, acc[hf * MQ5_TN + t]);
                acc[hf * MQ5_TN + t] = fma(-(mv * dy), convert_float16(as_int16(mi)), a);
            }
        }
    }
    if (r0 + 16 <= n_out)
        for (int t = 0; t < nt; t++) vstore16(acc[t], 0, y + (size_t)(t0 + t) * n_out + r0);
    else
        for (int t = 0; t < nt; t++)
            for (int r = 0; r < n_out - r0; r++) y[(size_t)(t0 + t) * n_out + r0 + r] = acc[t][r];
}

#endif

#if defined(Q6K_LANES)
// Prompt matrices of Q6_K on block_q8_K activations, 16 rows in the SIMD lanes as mmq45_pass: per super-block
// and pass the rows' ql (4 transposes) and qh (2) make the 64 quant vectors wq[4 k + i] (lane r: the 4
// quants of values 16 k + 4 i.. of row r, 0..63: the -32 comes through the bsums), the scales 16
// vectors and the (-32 sc_2j, -32 sc_2j+1) word pairs 8; per token and sub-block k 4 vpdpbusd of
// broadcast activations and one vpmulld by sc_k, 8 vpdpwssd of the bsum pairs, then the mat-vec's one
// fma per row (dotq8k.cl's Q6_K dotq8_row under Q6K_LANES), lane by lane: each token gets the
// one-token sums bit for bit.
__attribute__((target("avx512vnni"))) __attribute__((noinline))
void mmq6_pass(const global uchar *w, const global char *xq, const global float2 *xd, global float *y,
               const int n_in, const int n_out, const int r0, const int t0, const int nt) {
    const int nsb = n_in / 256;
    const size_t xs = (size_t)n_in, rs = (size_t)(n_in / 16);
    const v16si m15 = (v16si)(int16)(0x0f0f0f0f), m48 = (v16si)(int16)(0x30303030);
    const global uchar *wr[16];
#pragma unroll
    for (int r = 0; r < 16; r++) wr[r] = w + (size_t)min(r0 + r, n_out - 1) * ROW_BYTES(n_in);
    float16 acc[MQ5_TN * MQ5_TH];
    for (int t = 0; t < MQ5_TN * MQ5_TH; t++) acc[t] = (float16)(0.0f);
    for (int ib = 0; ib < nsb; ib++) {
        const size_t ob = (size_t)ib * 210;
        v16si wq[64], scv[16], nsw[8];
        float dd[16];
        {
            v16si p[8], h[8], l0[8], l1[8];
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
#pragma unroll
                for (int i = 0; i < 8; i++) p[i] = MQ5_P(wr[i], wr[i + 8], ob + 128 + 32 * hh);  // qh of half hh
                mq5_tr8(h, p);
#pragma unroll
                for (int i = 0; i < 8; i++) p[i] = MQ5_P(wr[i], wr[i + 8], ob + 64 * hh);  // ql dwords 0..7
                mq5_tr8(l0, p);
#pragma unroll
                for (int i = 0; i < 8; i++) p[i] = MQ5_P(wr[i], wr[i + 8], ob + 64 * hh + 32);  // ql dwords 8..15
                mq5_tr8(l1, p);
#pragma unroll
                for (int j = 0; j < 8; j++) {  // values 128 hh + 32 m + 4 j: dword 32 hh + 8 m + j
                    wq[32 * hh + j] = (l0[j] & m15) | ((h[j] << 4) & m48);
                    wq[32 * hh + 8 + j] = (l1[j] & m15) | ((h[j] << 2) & m48);
                    wq[32 * hh + 16 + j] = ((l0[j] >> 4) & m15) | (h[j] & m48);
                    wq[32 * hh + 24 + j] = ((l1[j] >> 4) & m15) | ((h[j] >> 2) & m48);
                }
            }
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const int16 sa = convert_int16(vload16(0, (const global char *)(wr[i] + ob + 192)));
                const int16 sb = convert_int16(vload16(0, (const global char *)(wr[i + 8] + ob + 192)));
                p[i] = (v16si)(int16)(sa.lo, sb.lo);
                l0[i] = (v16si)(int16)(sa.hi, sb.hi);
                dd[i] = h2f(wr[i] + ob + 208), dd[i + 8] = h2f(wr[i + 8] + ob + 208);
            }
            mq5_tr8(scv, p);
            mq5_tr8(scv + 8, l0);
#pragma unroll
            for (int j = 0; j < 8; j++)  // (-32 sc_2j, -32 sc_2j+1) as int16 words
                nsw[j] = ((scv[2 * j] * -32) & (v16si)(int16)(0xffff)) | ((scv[2 * j + 1] * -32) << 16);
        }
        const float16 dv = vload16(0, dd);
        const global char *xb = xq + (size_t)t0 * xs + (size_t)ib * 256;
        const global float *db = (const global float *)xd + (size_t)t0 * rs + (size_t)ib * 16;
        for (int hf = 0; hf < MQ5_TH && hf * MQ5_TN < nt; hf++) {
            int toff[MQ5_TN];
#pragma unroll
            for (int t = 0; t < MQ5_TN; t++) toff[t] = min(hf * MQ5_TN + t, nt - 1);
            v16si is[MQ5_TN];
#pragma unroll
            for (int t = 0; t < MQ5_TN; t++) is[t] = (v16si)(int16)(0);
#pragma unroll 1
            for (int s = 0; s < 8; s++) {  // sub-blocks 2 s, 2 s + 1
                v16si wk[8];
#pragma unroll
                for (int k = 0; k < 8; k++) wk[k] = wq[8 * s + k];
                const v16si sc0 = scv[2 * s], sc1 = scv[2 * s + 1];
#pragma unroll
                for (int t = 0; t < MQ5_TN; t++) {
                    const global int *xi = (const global int *)(xb + (size_t)toff[t] * xs + 32 * s);
                    v16si a = (v16si)(int16)(0), b = (v16si)(int16)(0);
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        a = __builtin_ia32_vpdpbusd512(a, wk[k], (v16si)(int16)(xi[k]));
                        b = __builtin_ia32_vpdpbusd512(b, wk[k + 4], (v16si)(int16)(xi[k + 4]));
                    }
                    is[t] += a * sc0 + b * sc1;
                }
            }
#pragma unroll
            for (int t = 0; t < MQ5_TN; t++) {
                const global int *rec = (const global int *)(db + (size_t)toff[t] * rs);
                v16si i = is[t];
#pragma unroll
                for (int j = 0; j < 8; j++) i = __builtin_ia32_vpdpwssd512(i, nsw[j], (v16si)(int16)(rec[j]));
                acc[hf * MQ5_TN + t] = fma(convert_float16(as_int16(i)), dv * as_float(rec[8]), acc[hf * MQ5_TN + t]);
            }
        }
    }
    if (r0 + 16 <= n_out)
        for (int t = 0; t < nt; t++) vstore16(acc[t], 0, y + (size_t)(t0 + t) * n_out + r0);
    else
        for (int t = 0; t < nt; t++)
            for (int r = 0; r < n_out - r0; r++) y[(size_t)(t0 + t) * n_out + r0 + r] = acc[t][r];
}
#define MQK_PASS mmq6_pass
#else
#define MQK_PASS mmq45_pass
#endif

#if defined(Q45K_LANES) || defined(Q6K_LANES)
#if 16 % MMQ_R != 0
#error "the Q4_K / Q5_K / Q6_K prompt kernels take 16 rows per work-item of 16 / MMQ_R"
#endif
// The grid is the other K-quants' (MMQ_R rows per work-item): the work-item whose rows start a group
// of 16 runs the group, the others none; tokens as there (MMQ_TN * MMQ_TT per work-item), in passes
// of MQ5_TN * MQ5_TH.
__kernel void mul_mm_q8(const global uchar *w, const global char *xq, const global float2 *xd,
                        global float *y, const int n_in, const int n_out, const int n_tok) {
    const int r0 = get_global_id(0) * MMQ_R, tb = get_group_id(1) * (MMQ_TN * MMQ_TT);
    const int te = min(n_tok, tb + MMQ_TN * MMQ_TT);
    if (r0 % 16 == 0 && r0 < n_out)
        for (int t0 = tb; t0 < te; t0 += MQ5_TN * MQ5_TH)
            MQK_PASS(w, xq, xd, y, n_in, n_out, r0, t0, min(MQ5_TN * MQ5_TH, te - t0));
}
#endif

#ifdef HAS_MM_Q8_WI
#ifndef MMQ_WI_ROWS
#define MMQ_WI_ROWS MMQ_R
#endif
// A work-item runs its MMQ_WI_ROWS rows (MMQ_R; 16 for repacked Q4_0) against MMQ_TT tiles of
// MMQ_TN tokens, one tile after the other,
// so its rows stay in the cache across the tiles (one tile per work-item streamed the whole matrix
// from memory once per MMQ_TN tokens); the grid's second dimension counts MMQ_TN * MMQ_TT tokens.
__kernel void mul_mm_q8(const global uchar *w, const global char *xq, const global float2 *xd,
                        global float *y, const int n_in, const int n_out, const int n_tok) {
    const int r0 = get_global_id(0) * MMQ_WI_ROWS, tb = get_group_id(1) * (MMQ_TN * MMQ_TT);
    if (r0 < n_out)
        for (int t0 = tb; t0 < min(n_tok, tb + MMQ_TN * MMQ_TT); t0 += MMQ_TN)
            mm_q8_wi(w, xq, xd, y, n_in, n_out, n_tok, r0, t0);
}
#endif
