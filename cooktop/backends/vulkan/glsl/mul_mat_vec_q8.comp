#version 450
// Integer-dot matrix-vector product for few tokens (decode) on 8-bit activations:
// Y[t, r] = sum_k X[t, k] * W[r, k] with X given as 8-bit blocks (quantize_q8_1.comp:
// llama.cpp's Q8_1 idea, its mul_mat_vecq). W [n_out, n_in] raw GGML blocks (TYPE_Q4_0,
// TYPE_Q8_0, TYPE_Q4_K or TYPE_Q5_K, read as 16-bit words: needs storageBuffer16BitAccess), XQ [n_tok * n_in / 32]
// blocks of 3 uvec4, Y f32 [n_tok, n_out] (K-quants: one group of 8 units is one super-block). Each 32-value block pair is 8 packed 4x8-bit
// dot products (OpSDot, SPV_KHR_integer_dot_product: needs shaderIntegerDotProduct;
// glslc 2023.2 has no GL_EXT_integer_dot_product, so the instruction is declared with
// GL_EXT_spirv_intrinsics), then one float multiply-add per block:
//   Q8_0: d_w * d_x * sum(qw * qx)
//   Q4_0: d_w * (d_x * sum(q * qx) - 8 * s_x), q = the unsigned nibbles, s_x = d_x * sum(qx)
// (the -8 offset of Q4_0 through the block sum, as llama.cpp's vec_dot_q4_0_q8_1).
// Work split, reduction and grid as mul_mat_vec.comp: one workgroup of WG invocations
// (spec constant 0) computes NROWS rows of one token for groups_per_wg row groups.
// Loads: rows of a multiple of 16 bytes (n_in % 256 == 0) are read 8 blocks at a time per
// invocation: 8 Q4_0 blocks are 144 bytes = 9 aligned uvec4 (Q8_0: 272 = 17), unpacked with
// offsets known at compile time, and the 8 x blocks are loaded once for the NROWS rows. On
// lavapipe, where each load instruction costs the same whatever its width, that is ~6x fewer
// loads than one 16-bit load per weight pair; other rows and the units past the last whole
// group of 8 go block by block (16-bit loads).
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
// qs[32 (j / 2) ..]; y = d sc_j q - dmin m_j, so the block adds
//   d sc_j (d_x sum(q qx)) - dmin m_j s_x   (llama.cpp's vec_dot_q4_K_q8_1 on block_q8_1 activations).
// A super-block is 8 of this shader's 32-value units: BLOCK_BYTES is 144 / 8 so the group of 8
// units starts at 8 * BLOCK_BYTES; rows hold whole super-blocks (n_in % 256 == 0, 16-byte aligned),
// so every unit goes through the grouped path (no block_dot).
#define BLOCK_BYTES 18u
#define GROUP_VEC4 9u   // one super-block = 144 bytes
#define K_SUPER 1
#define QS_BYTE 16u
#elif defined(TYPE_Q5_K)
// block_q5_K: Q4_K's fields with uint8 qh[32] after the scales: bit j of qh[l] is bit 4 of value
// l of sub-block j (values 0..31), qs at byte 48; 176 bytes = 11 aligned uvec4 per super-block.
#define BLOCK_BYTES 22u
#define GROUP_VEC4 11u
#define K_SUPER 1
#define QS_BYTE 48u
#else
#error "mul_mat_vec_q8.comp: define TYPE_Q4_0, TYPE_Q8_0, TYPE_Q4_K or TYPE_Q5_K"
#endif

#define GROUP_WORDS (4u * GROUP_VEC4)
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
// block j (0..7) of a group of 8 against x block (xa, xb, ds)
float group_block_dot(uint wv[GROUP_WORDS], uint j, uvec4 xa, uvec4 xb, vec2 ds) {
    uint b0 = j * BLOCK_BYTES;
#if defined(TYPE_Q4_K) || defined(TYPE_Q5_K)
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
    int s = sdot4x8(q[0], xa.x, 0) + sdot4x8(q[1], xa.y, 0) + sdot4x8(q[2], xa.z, 0) + sdot4x8(q[3], xa.w, 0)
          + sdot4x8(q[4], xb.x, 0) + sdot4x8(q[5], xb.y, 0) + sdot4x8(q[6], xb.z, 0) + sdot4x8(q[7], xb.w, 0);
    return g_f16(wv, 0u) * float(sc) * (ds.x * float(s)) - g_f16(wv, 2u) * float(m) * ds.y;
#elif defined(TYPE_Q4_0)
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

// the 8 x blocks of group gr (blocks 8 gr .. 8 gr + 7 of token tok)
void load_x_group(uint tok, uint n_units, uint gr, out uvec4 xq[16], out vec2 xds[8]) {
    [[unroll]] for (uint j = 0u; j < 8u; j++) {
        uint xb = 3u * (tok * n_units + 8u * gr + j);
        xq[2u * j] = XQ[xb];
        xq[2u * j + 1u] = XQ[xb + 1u];
        xds[j] = uintBitsToFloat(XQ[xb + 2u].xy);
    }
}

// acc[r] += group gr of rows r0 + r (clamped rows are computed and dropped)
void group_rows(uint gr, uint r0, uvec4 xq[16], vec2 xds[8], inout float acc[NROWS]) {
    [[unroll]] for (uint r = 0u; r < NROWS; r++) {
        uint row = min(r0 + r, pc.n_out - 1u);
        uint v0 = (row * pc.row_bytes + 8u * gr * BLOCK_BYTES) >> 4;
        uint wv[GROUP_WORDS];
        [[unroll]] for (uint i = 0u; i < GROUP_VEC4; i++) {
            uvec4 t = W4[v0 + i];
            wv[4u * i] = t.x; wv[4u * i + 1u] = t.y; wv[4u * i + 2u] = t.z; wv[4u * i + 3u] = t.w;
        }
        float s = 0.0;
        [[unroll]] for (uint j = 0u; j < 8u; j++) s += group_block_dot(wv, j, xq[2u * j], xq[2u * j + 1u], xds[j]);
        acc[r] += s;
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
    uint n_grp = (pc.row_bytes & 15u) == 0u ? n_units / 8u : 0u;  // whole aligned groups of 8 blocks
    uvec4 xq[16];
    vec2 xds[8];
    if (n_grp <= WG && tid < n_grp) load_x_group(tok, n_units, tid, xq, xds);  // once for all row groups
    for (uint gi = gi0; gi < gi1; gi++) {
        uint r0 = gi * NROWS;
        float acc[NROWS];
        [[unroll]] for (uint r = 0u; r < NROWS; r++) acc[r] = 0.0;
        if (n_grp <= WG) {  // uniform: at most one group per invocation, x already loaded
            if (tid < n_grp) group_rows(tid, r0, xq, xds, acc);
        } else {
            for (uint gr = tid; gr < n_grp; gr += WG) {
                load_x_group(tok, n_units, gr, xq, xds);
                group_rows(gr, r0, xq, xds, acc);
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
