#version 450
// Integer-dot matrix-vector product for few tokens (decode) on 8-bit activations:
// Y[t, r] = sum_k X[t, k] * W[r, k] with X given as 8-bit blocks. W [n_out, n_in] raw GGML blocks
// (TYPE_Q4_0, TYPE_Q8_0, TYPE_Q4_K, TYPE_Q5_K or TYPE_Q6_K, read as 16-bit words: needs
// storageBuffer16BitAccess), Y f32 [n_tok, n_out]. XQ, the activations, is one of:
//   block_q8_1 (quantize_q8_1.comp: llama.cpp's Q8_1 idea, its mul_mat_vecq): [n_tok * n_in / 32]
//     blocks of 3 uvec4 (32 int8, then d and s = d * sum(q));
//   block_q8_K (Q8K defined, K-quants only; quantize_q8_K.comp: llama.cpp's block_q8_K,
//     ggml_vec_dot_q*_K_q8_K): [n_tok * n_in / 256] blocks of 19 uvec4 (256 int8, 16 int16
//     bsums, then d).
// K-quants: one group of 8 32-value units is one super-block. Each 32-value block pair is 8 packed
// 4x8-bit dot products (OpSDot, SPV_KHR_integer_dot_product: needs shaderIntegerDotProduct;
// glslc 2023.2 has no GL_EXT_integer_dot_product, so the instruction is declared with
// GL_EXT_spirv_intrinsics), then float multiply-adds per block (q8_1) or per super-block (q8_K):
//   Q8_0: d_w * d_x * sum(qw * qx)
//   Q4_0: d_w * (d_x * sum(q * qx) - 8 * s_x), q = the unsigned nibbles, s_x = d_x * sum(qx)
// (the -8 offset of Q4_0 through the block sum, as llama.cpp's vec_dot_q4_0_q8_1; the K-quants
// below at their block layouts).
// Work split, reduction and grid as mul_mat_vec.comp: one workgroup of WG invocations
// (spec constant 0) computes NROWS rows of one token for groups_per_wg row groups.
// Loads: rows of a multiple of 16 bytes (n_in % 256 == 0) are read 8 blocks at a time per
// invocation: 8 Q4_0 blocks are 144 bytes = 9 aligned uvec4 (Q8_0: 272 = 17), unpacked with
// offsets known at compile time, and the 8 x blocks are loaded once for the NROWS rows. On
// lavapipe, where each load instruction costs the same whatever its width, that is ~6x fewer
// loads than one 16-bit load per weight pair; other rows and the units past the last whole
// group of 8 go block by block (16-bit loads). A Q6_K super-block (210 bytes) starts at any even
// offset: it is read as the 14 aligned uvec4 that cover it, shifted into place by its offset.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_spirv_intrinsics : require
#ifndef NROWS
#define NROWS 8
#endif
layout(local_size_x_id = 0) in;
#define WG gl_WorkGroupSize.x
layout(std430, binding = 0) readonly buffer WBuf16 { uint16_t W16[]; };
layout(std430, binding = 0) readonly buffer WBuf4 { uvec4 W4[]; };  // the same buffer, 16-byte words
layout(std430, binding = 1) readonly buffer XBuf { uvec4 XQ[]; };
layout(std430, binding = 2) writeonly buffer YBuf { float Y[]; };
layout(push_constant) uniform PC { uint n_in; uint n_out; uint n_tok; uint row_bytes; uint groups_per_wg; } pc;
#include "common.glsl"

// OpSDot (4450) with PackedVectorFormat4x8Bit (0): capabilities DotProduct (6019) and
// DotProductInput4x8BitPacked (6018)
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot4x8(uint a, uint b, spirv_literal int packed_format);

uint w_pair(uint w) {  // two 16-bit words from 16-bit index w: a little-endian uint32
    return uint(W16[w]) | (uint(W16[w + 1u]) << 16);
}

#if defined(TYPE_Q4_0)
#define BLOCK_BYTES 18u
#define GROUP_VEC4 9u   // 8 blocks = 144 bytes
// block_q4_0: f16 d; uint8 qs[16]; value j = qs[j] & 15, value j + 16 = qs[j] >> 4 (minus 8)
float block_dot(uint w, uvec4 xa, uvec4 xb, vec2 ds) {
    uint q[4];
    [[unroll]] for (uint k = 0u; k < 4u; k++) q[k] = w_pair(w + 1u + 2u * k);
    int s = sdot4x8(q[0] & 0x0F0F0F0Fu, xa.x, 0) + sdot4x8(q[1] & 0x0F0F0F0Fu, xa.y, 0)
          + sdot4x8(q[2] & 0x0F0F0F0Fu, xa.z, 0) + sdot4x8(q[3] & 0x0F0F0F0Fu, xa.w, 0)
          + sdot4x8((q[0] >> 4) & 0x0F0F0F0Fu, xb.x, 0) + sdot4x8((q[1] >> 4) & 0x0F0F0F0Fu, xb.y, 0)
          + sdot4x8((q[2] >> 4) & 0x0F0F0F0Fu, xb.z, 0) + sdot4x8((q[3] >> 4) & 0x0F0F0F0Fu, xb.w, 0);
    float dw = unpackHalf2x16(uint(W16[w])).x;
    return dw * (ds.x * float(s) - 8.0 * ds.y);
}
#elif defined(TYPE_Q8_0)
#define BLOCK_BYTES 34u
#define GROUP_VEC4 17u  // 8 blocks = 272 bytes
// block_q8_0: f16 d; int8 qs[32]
float block_dot(uint w, uvec4 xa, uvec4 xb, vec2 ds) {
    int s = sdot4x8(w_pair(w + 1u), xa.x, 0) + sdot4x8(w_pair(w + 3u), xa.y, 0)
          + sdot4x8(w_pair(w + 5u), xa.z, 0) + sdot4x8(w_pair(w + 7u), xa.w, 0)
          + sdot4x8(w_pair(w + 9u), xb.x, 0) + sdot4x8(w_pair(w + 11u), xb.y, 0)
          + sdot4x8(w_pair(w + 13u), xb.z, 0) + sdot4x8(w_pair(w + 15u), xb.w, 0);
    float dw = unpackHalf2x16(uint(W16[w])).x;
    return dw * ds.x * float(s);
}
#elif defined(TYPE_Q4_K)
// block_q4_K (ggml-common.h): f16 d, dmin; uint8 scales[12] (6-bit scale and min of 8 sub-blocks);
// uint8 qs[128]: sub-block j of 32 values is the low (j even) or high (j odd) nibbles of
// qs[32 (j / 2) ..]; y = d sc_j q - dmin m_j, so the super-block adds
//   q8_1: sum_j d sc_j (d_x sum(q qx)) - dmin m_j s_x    (llama.cpp's vec_dot_q4_K_q8_1)
//   q8_K: d_x (d sum_j sc_j sum(q qx) - dmin sum_j m_j bsum_j)   (ggml_vec_dot_q4_K_q8_K; the
//         integer sums in int32, bsum_j = the two 16-value bsums of sub-block j)
// Rows hold whole super-blocks (n_in % 256 == 0); a group of 8 units is one super-block, read
// as aligned uvec4 where the rows are 16-byte aligned (always: 144 bytes); no block_dot.
#define SUPER_BYTES 144u
#define GROUP_VEC4 9u
#define K_SUPER 1
#define QS_BYTE 16u
#elif defined(TYPE_Q5_K)
// block_q5_K: Q4_K's fields with uint8 qh[32] after the scales: bit j of qh[l] is bit 4 of value
// l of sub-block j (values 0..31), qs at byte 48; 176 bytes = 11 aligned uvec4 per super-block.
#define SUPER_BYTES 176u
#define GROUP_VEC4 11u
#define K_SUPER 1
#define QS_BYTE 48u
#elif defined(TYPE_Q6_K)
// block_q6_K (ggml-common.h, 210 bytes): uint8 ql[128]; uint8 qh[64]; int8 scales[16]; f16 d.
// Unit s = 4h + k (h = s / 4, k = s % 4) of 32 values, l < 32: the low 4 bits are the low (k < 2)
// or high nibble of ql[64h + 32 (k & 1) + l], the high 2 bits (qh[32h + l] >> 2k) & 3, and
// y = d scales[2s + l / 16] (q - 32). The -32 goes through the 16-value activation sums xs_g:
//   q8_1: d sum_s d_x,s sum_{g of s} sc_g (sum(q qx) - 32 xs_g)   (xs_g summed here from qx)
//   q8_K: d d_x sum_g sc_g (sum(q qx) - 32 bsum_g)                 (ggml_vec_dot_q6_K_q8_K)
// with q = 0..63 and the integer sums in int32 (as llama.cpp's mul_mat_vecq Q6_K, whose
// repack4 subtracts the 32 in the bytes instead).
#define SUPER_BYTES 210u
#define K_SUPER 1
#define UNALIGNED_SUPER 1
#else
#error "mul_mat_vec_q8.comp: define TYPE_Q4_0, TYPE_Q8_0, TYPE_Q4_K, TYPE_Q5_K or TYPE_Q6_K"
#endif
#if defined(Q8K) && !defined(K_SUPER)
#error "mul_mat_vec_q8.comp: Q8K (block_q8_K activations) is for the K-quants"
#endif

#ifdef UNALIGNED_SUPER
#define GROUP_WORDS 53u  // the super-block's 210 bytes as words (the last one half used)
#else
#define GROUP_WORDS (4u * GROUP_VEC4)
#endif
#ifndef SUPER_BYTES
#define SUPER_BYTES (8u * BLOCK_BYTES)
#endif
// little-endian uint32 / uint16 at even byte offset b of the group's words (b is a constant
// after unrolling, so the array is indexed statically)
uint g_u32(uint wv[GROUP_WORDS], uint b) {
    uint i = b >> 2;
    return (b & 2u) == 0u ? wv[i] : (wv[i] >> 16) | (wv[i + 1u] << 16);
}
float g_f16(uint wv[GROUP_WORDS], uint b) {
    return unpackHalf2x16(wv[b >> 2] >> ((b & 2u) << 3)).x;
}
uint g_u8(uint wv[GROUP_WORDS], uint b) {
    return (wv[b >> 2] >> ((b & 3u) << 3)) & 0xFFu;
}

// The x side of one group of 8 units (256 values) of one token: q[2j], q[2j + 1] are unit j's
// 32 int8 values (q[g] holds values 16g .. 16g + 15); q8_1: ds[j] = (d, s) of unit j;
// q8_K: d, and bs[g] the sum of values 16g .. 16g + 15 (Q6_K on q8_1 sums them here).
struct XGroup {
    uvec4 q[16];
#ifdef Q8K
    float d;
#else
    vec2 ds[8];
#endif
#if defined(Q8K) || defined(TYPE_Q6_K)
    int bs[16];
#endif
};

#ifdef K_SUPER
// the super-block in wv against x group x
float super_dot(uint wv[GROUP_WORDS], XGroup x) {
#if defined(TYPE_Q4_K) || defined(TYPE_Q5_K)
    int isum = 0, imin = 0;   // q8_K
    float fsum = 0.0, fmin = 0.0;  // q8_1
    [[unroll]] for (uint j = 0u; j < 8u; j++) {
        // 6-bit scale and min of sub-block j (ggml get_scale_min_k4; scales at bytes 4..15)
        uint sc, m;
        if (j < 4u) {
            sc = g_u8(wv, 4u + j) & 63u;
            m = g_u8(wv, 8u + j) & 63u;
        } else {
            sc = (g_u8(wv, 8u + j) & 15u) | ((g_u8(wv, j) >> 6) << 4);
            m = (g_u8(wv, 8u + j) >> 4) | ((g_u8(wv, 4u + j) >> 6) << 4);
        }
        uint q0 = (QS_BYTE + 32u * (j >> 1)) >> 2, sh = 4u * (j & 1u);
        uint q[8];
        [[unroll]] for (uint k = 0u; k < 8u; k++) q[k] = (wv[q0 + k] >> sh) & 0x0F0F0F0Fu;
#if defined(TYPE_Q5_K)
        [[unroll]] for (uint k = 0u; k < 8u; k++) q[k] |= ((wv[4u + k] >> j) & 0x01010101u) << 4;  // qh words 4..11
#endif
        uvec4 xa = x.q[2u * j], xb = x.q[2u * j + 1u];
        int s = sdot4x8(q[0], xa.x, 0) + sdot4x8(q[1], xa.y, 0) + sdot4x8(q[2], xa.z, 0) + sdot4x8(q[3], xa.w, 0)
              + sdot4x8(q[4], xb.x, 0) + sdot4x8(q[5], xb.y, 0) + sdot4x8(q[6], xb.z, 0) + sdot4x8(q[7], xb.w, 0);
#ifdef Q8K
        isum += int(sc) * s;
        imin += int(m) * (x.bs[2u * j] + x.bs[2u * j + 1u]);
#else
        fsum += float(sc) * (x.ds[j].x * float(s));
        fmin += float(m) * x.ds[j].y;
#endif
    }
#ifdef Q8K
    return x.d * (g_f16(wv, 0u) * float(isum) - g_f16(wv, 2u) * float(imin));
#else
    return g_f16(wv, 0u) * fsum - g_f16(wv, 2u) * fmin;
#endif
#else  // TYPE_Q6_K
    int isum = 0;      // q8_K
    float fsum = 0.0;  // q8_1
    [[unroll]] for (uint s = 0u; s < 8u; s++) {
        uint h = s >> 2, k = s & 3u;
        uint qlw = 16u * h + 8u * (k & 1u), qhw = 32u + 8u * h, sl = 4u * (k >> 1), sh = 2u * k;
        uint v[8];
        [[unroll]] for (uint i = 0u; i < 8u; i++)
            v[i] = ((wv[qlw + i] >> sl) & 0x0F0F0F0Fu) | (((wv[qhw + i] >> sh) & 0x03030303u) << 4);
        uvec4 xa = x.q[2u * s], xb = x.q[2u * s + 1u];
        int s0 = sdot4x8(v[0], xa.x, 0) + sdot4x8(v[1], xa.y, 0) + sdot4x8(v[2], xa.z, 0) + sdot4x8(v[3], xa.w, 0);
        int s1 = sdot4x8(v[4], xb.x, 0) + sdot4x8(v[5], xb.y, 0) + sdot4x8(v[6], xb.z, 0) + sdot4x8(v[7], xb.w, 0);
        int sc0 = int(g_u8(wv, 192u + 2u * s) << 24) >> 24, sc1 = int(g_u8(wv, 193u + 2u * s) << 24) >> 24;
        int t = sc0 * (s0 - 32 * x.bs[2u * s]) + sc1 * (s1 - 32 * x.bs[2u * s + 1u]);
#ifdef Q8K
        isum += t;
#else
        fsum += x.ds[s].x * float(t);
#endif
    }
#ifdef Q8K
    return g_f16(wv, 208u) * (x.d * float(isum));
#else
    return g_f16(wv, 208u) * fsum;
#endif
#endif
}
#else
// block j (0..7) of a group of 8 against x block (xa, xb, ds)
float group_block_dot(uint wv[GROUP_WORDS], uint j, uvec4 xa, uvec4 xb, vec2 ds) {
    uint b0 = j * BLOCK_BYTES;
#if defined(TYPE_Q4_0)
    uint q0 = g_u32(wv, b0 + 2u), q1 = g_u32(wv, b0 + 6u), q2 = g_u32(wv, b0 + 10u), q3 = g_u32(wv, b0 + 14u);
    int s = sdot4x8(q0 & 0x0F0F0F0Fu, xa.x, 0) + sdot4x8(q1 & 0x0F0F0F0Fu, xa.y, 0)
          + sdot4x8(q2 & 0x0F0F0F0Fu, xa.z, 0) + sdot4x8(q3 & 0x0F0F0F0Fu, xa.w, 0)
          + sdot4x8((q0 >> 4) & 0x0F0F0F0Fu, xb.x, 0) + sdot4x8((q1 >> 4) & 0x0F0F0F0Fu, xb.y, 0)
          + sdot4x8((q2 >> 4) & 0x0F0F0F0Fu, xb.z, 0) + sdot4x8((q3 >> 4) & 0x0F0F0F0Fu, xb.w, 0);
    return g_f16(wv, b0) * (ds.x * float(s) - 8.0 * ds.y);
#else
    int s = sdot4x8(g_u32(wv, b0 + 2u), xa.x, 0) + sdot4x8(g_u32(wv, b0 + 6u), xa.y, 0)
          + sdot4x8(g_u32(wv, b0 + 10u), xa.z, 0) + sdot4x8(g_u32(wv, b0 + 14u), xa.w, 0)
          + sdot4x8(g_u32(wv, b0 + 18u), xb.x, 0) + sdot4x8(g_u32(wv, b0 + 22u), xb.y, 0)
          + sdot4x8(g_u32(wv, b0 + 26u), xb.z, 0) + sdot4x8(g_u32(wv, b0 + 30u), xb.w, 0);
    return g_f16(wv, b0) * ds.x * float(s);
#endif
}
#endif

#ifdef Q8K
#define XQ_GROUP_VEC4 19u  // uvec4 per block_q8_K record (256 values)
#endif
// the x side of group gr (values 256 gr .. 256 gr + 255) of token tok
void load_x_group(uint tok, uint n_units, uint gr, out XGroup x) {
#ifdef Q8K
    uint xb = XQ_GROUP_VEC4 * (tok * (n_units / 8u) + gr);
    [[unroll]] for (uint i = 0u; i < 16u; i++) x.q[i] = XQ[xb + i];
    uvec4 b0 = XQ[xb + 16u], b1 = XQ[xb + 17u];
    uint bw[8] = uint[8](b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w);
    [[unroll]] for (uint i = 0u; i < 8u; i++) {
        x.bs[2u * i] = int(bw[i] << 16) >> 16;
        x.bs[2u * i + 1u] = int(bw[i]) >> 16;
    }
    x.d = uintBitsToFloat(XQ[xb + 18u].x);
#else
    [[unroll]] for (uint j = 0u; j < 8u; j++) {
        uint xb = 3u * (tok * n_units + 8u * gr + j);
        x.q[2u * j] = XQ[xb];
        x.q[2u * j + 1u] = XQ[xb + 1u];
        x.ds[j] = uintBitsToFloat(XQ[xb + 2u].xy);
    }
#if defined(TYPE_Q6_K)
    [[unroll]] for (uint g = 0u; g < 16u; g++) {
        uvec4 t = x.q[g];
        x.bs[g] = sdot4x8(t.x, 0x01010101u, 0) + sdot4x8(t.y, 0x01010101u, 0)
                + sdot4x8(t.z, 0x01010101u, 0) + sdot4x8(t.w, 0x01010101u, 0);
    }
#endif
#endif
}

// the weight words of group gr of row `row`
void load_w_group(uint row, uint gr, out uint wv[GROUP_WORDS]) {
    uint start = row * pc.row_bytes + gr * SUPER_BYTES;
#ifdef UNALIGNED_SUPER
    // the 14 aligned uvec4 from start & ~15 cover bytes start .. start + 209 for any even
    // offset o = start & 15 (o + 210 <= 224; the buffer's spare uvec4 keeps the last in bounds),
    // then a shift by o: whole words (o / 4, two selects) and half a word (o & 2)
    uint v0 = start >> 4, o = start & 15u;
    uint u[57];
    [[unroll]] for (uint i = 0u; i < 14u; i++) {
        uvec4 t = W4[v0 + i];
        u[4u * i] = t.x; u[4u * i + 1u] = t.y; u[4u * i + 2u] = t.z; u[4u * i + 3u] = t.w;
    }
    u[56] = 0u;
    bool s1 = (o & 4u) != 0u, s2 = (o & 8u) != 0u, half_word = (o & 2u) != 0u;
    uint a[56];
    [[unroll]] for (uint i = 0u; i < 56u; i++) a[i] = s1 ? u[i + 1u] : u[i];
    uint b[54];
    [[unroll]] for (uint i = 0u; i < 54u; i++) b[i] = s2 ? a[i + 2u] : a[i];
    [[unroll]] for (uint i = 0u; i < GROUP_WORDS; i++) wv[i] = half_word ? (b[i] >> 16) | (b[i + 1u] << 16) : b[i];
#else
    uint v0 = start >> 4;
    [[unroll]] for (uint i = 0u; i < GROUP_VEC4; i++) {
        uvec4 t = W4[v0 + i];
        wv[4u * i] = t.x; wv[4u * i + 1u] = t.y; wv[4u * i + 2u] = t.z; wv[4u * i + 3u] = t.w;
    }
#endif
}

// acc[r] += group gr of rows r0 + r (clamped rows are computed and dropped)
void group_rows(uint gr, uint r0, XGroup x, inout float acc[NROWS]) {
    [[unroll]] for (uint r = 0u; r < NROWS; r++) {
        uint row = min(r0 + r, pc.n_out - 1u);
        uint wv[GROUP_WORDS];
        load_w_group(row, gr, wv);
#ifdef K_SUPER
        acc[r] += super_dot(wv, x);
#else
        float s = 0.0;
        [[unroll]] for (uint j = 0u; j < 8u; j++) s += group_block_dot(wv, j, x.q[2u * j], x.q[2u * j + 1u], x.ds[j]);
        acc[r] += s;
#endif
    }
}

shared float red[NROWS * WG];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint n_groups = (pc.n_out + NROWS - 1u) / NROWS;
    uint n_wg = (n_groups + pc.groups_per_wg - 1u) / pc.groups_per_wg;
    uint g = flat_group();
    uint tok = g / n_wg;
    if (tok >= pc.n_tok) return;  // uniform over the workgroup
    uint gi0 = (g % n_wg) * pc.groups_per_wg;
    uint gi1 = min(gi0 + pc.groups_per_wg, n_groups);
    uint n_units = pc.n_in / 32u;
#ifdef UNALIGNED_SUPER
    uint n_grp = n_units / 8u;  // every super-block, wherever it starts
#else
    uint n_grp = (pc.row_bytes & 15u) == 0u ? n_units / 8u : 0u;  // whole aligned groups of 8 blocks
#endif
    XGroup x;
    if (n_grp <= WG && tid < n_grp) load_x_group(tok, n_units, tid, x);  // once for all row groups
    for (uint gi = gi0; gi < gi1; gi++) {
        uint r0 = gi * NROWS;
        float acc[NROWS];
        [[unroll]] for (uint r = 0u; r < NROWS; r++) acc[r] = 0.0;
        if (n_grp <= WG) {  // uniform: at most one group per invocation, x already loaded
            if (tid < n_grp) group_rows(tid, r0, x, acc);
        } else {
            for (uint gr = tid; gr < n_grp; gr += WG) {
                load_x_group(tok, n_units, gr, x);
                group_rows(gr, r0, x, acc);
            }
        }
#ifndef K_SUPER
        for (uint u = 8u * n_grp + tid; u < n_units; u += WG) {
            uint xb = 3u * (tok * n_units + u);
            uvec4 xa = XQ[xb], xc = XQ[xb + 1u];
            vec2 ds = uintBitsToFloat(XQ[xb + 2u].xy);
            [[unroll]] for (uint r = 0u; r < NROWS; r++) {
                uint row = min(r0 + r, pc.n_out - 1u);  // clamped rows are computed and dropped
                acc[r] += block_dot((row * pc.row_bytes + u * BLOCK_BYTES) >> 1, xa, xc, ds);
            }
        }
#endif
        if (gl_NumSubgroups == 1u) {
            [[unroll]] for (uint r = 0u; r < NROWS; r++) {
                float t = subgroupAdd(acc[r]);
                if (tid == r && r0 + r < pc.n_out) Y[tok * pc.n_out + r0 + r] = t;
            }
        } else {
            [[unroll]] for (uint r = 0u; r < NROWS; r++) {
                float t = subgroupAdd(acc[r]);
                if (gl_SubgroupInvocationID == 0u) red[r * WG + gl_SubgroupID] = t;
            }
            barrier();
            if (tid < NROWS && r0 + tid < pc.n_out) {
                float t = 0.0;
                for (uint i = 0u; i < gl_NumSubgroups; i++) t += red[tid * WG + i];
                Y[tok * pc.n_out + r0 + tid] = t;
            }
            barrier();
        }
    }
}
