#version 450
// x f32 [n_blocks * 32] -> 8-bit blocks for the integer-dot mat-vec (mul_mat_vec_q8.comp):
// llama.cpp's block_q8_1 idea (ggml-common.h; quantize_row_q8_1 in ggml-quants.c), one
// quantization of an activation per mat-vec input. Block b of 32 values is 3 uvec4:
//   XQ[3b], XQ[3b+1]: qs[0..31] as int8, four per uint (little-endian, value 4i+k in byte k
//   of word i);  XQ[3b+2] = (d, s, 0, 0) as float bits, d = max|x| / 127, s = d * sum(qs).
// qs = roundEven(x * (127 / max|x|)), 0 where max|x| == 0. Rows of a multiple of 32 values are
// contiguous blocks, so a [n_tok, n_in] activation is n_tok * n_in / 32 blocks.
// One invocation per block, grid-stride over workgroups of 64.
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
        vec4 v[8];
        float amax = 0.0;
        [[unroll]] for (uint i = 0u; i < 8u; i++) {
            v[i] = X4[8u * b + i];
            vec4 a = abs(v[i]);
            amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
        }
        float d = amax / 127.0;
        float id = amax > 0.0 ? 127.0 / amax : 0.0;  // as OpenCL's quant.cl: one reference for both
        uint w[8];
        int sum = 0;
        [[unroll]] for (uint i = 0u; i < 8u; i++) {
            ivec4 q = ivec4(roundEven(v[i] * id));
            sum += q.x + q.y + q.z + q.w;
            w[i] = (uint(q.x) & 0xFFu) | ((uint(q.y) & 0xFFu) << 8) | ((uint(q.z) & 0xFFu) << 16) | (uint(q.w) << 24);
        }
        XQ[3u * b] = uvec4(w[0], w[1], w[2], w[3]);
        XQ[3u * b + 1u] = uvec4(w[4], w[5], w[6], w[7]);
        XQ[3u * b + 2u] = uvec4(floatBitsToUint(d), floatBitsToUint(d * float(sum)), 0u, 0u);
    }
}
