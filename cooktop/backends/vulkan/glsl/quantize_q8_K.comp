#version 450
// x f32 [n_blocks * 256] -> llama.cpp's block_q8_K (ggml-common.h; quantize_row_q8_K_ref in
// ggml-quants.c) for the K-quant integer-dot mat-vecs built with Q8K (mul_mat_vec_q8.comp).
// Block b of 256 values is 19 uvec4:
//   XQ[19b .. 19b+15]: qs[0..255] as int8, four per uint (little-endian, value 4i+k in byte k of
//   word i);  XQ[19b+16], XQ[19b+17]: bsums[0..15] as int16, two per uint (bsum 2i in the low
//   half of word i), bsum g = sum(qs[16g .. 16g+15]);  XQ[19b+18] = (d, 0, 0, 0) as float bits.
// max = the first value of largest |x|, iscale = -127 / max, qs = min(127, roundEven(iscale * x)),
// d = 1 / iscale (the sign of -max); an all-zero block has d = 0 and qs = 0 (the numpy reference:
// reference.quantize_q8_K_ref). One invocation per block (two passes over its values: the max,
// then the quants), grid-stride over workgroups of 64.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer XBuf { vec4 X4[]; };
layout(std430, binding = 1) writeonly buffer QBuf { uvec4 XQ[]; };
layout(push_constant) uniform PC { uint n_blocks; } pc;
#include "common.glsl"

void main() {
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * 64u;
    for (uint b = flat_group() * 64u + gl_LocalInvocationID.x; b < pc.n_blocks; b += stride) {
        float amax = 0.0, mx = 0.0;
        for (uint i = 0u; i < 64u; i++) {
            vec4 v = X4[64u * b + i];
            [[unroll]] for (uint c = 0u; c < 4u; c++) {
                float a = abs(v[c]);
                if (a > amax) { amax = a; mx = v[c]; }
            }
        }
        float iscale = amax > 0.0 ? -127.0 / mx : 0.0;
        float d = amax > 0.0 ? 1.0 / iscale : 0.0;
        uint bw[8];
        for (uint g = 0u; g < 16u; g++) {
            uint w[4];
            int bsum = 0;
            [[unroll]] for (uint i = 0u; i < 4u; i++) {
                ivec4 q = min(ivec4(roundEven(X4[64u * b + 4u * g + i] * iscale)), ivec4(127));
                bsum += q.x + q.y + q.z + q.w;
                w[i] = (uint(q.x) & 0xFFu) | ((uint(q.y) & 0xFFu) << 8) | ((uint(q.z) & 0xFFu) << 16) | (uint(q.w) << 24);
            }
            XQ[19u * b + g] = uvec4(w[0], w[1], w[2], w[3]);
            uint h = uint(bsum) & 0xFFFFu;
            if ((g & 1u) == 0u) bw[g >> 1] = h; else bw[g >> 1] |= h << 16;
        }
        XQ[19u * b + 16u] = uvec4(bw[0], bw[1], bw[2], bw[3]);
        XQ[19u * b + 17u] = uvec4(bw[4], bw[5], bw[6], bw[7]);
        XQ[19u * b + 18u] = uvec4(floatBitsToUint(d), 0u, 0u, 0u);
    }
}
