#version 450
// Multi-section rope, vision mode (ggml_rope_multi with GGML_ROPE_TYPE_VISION, n_dims = head_dim / 2:
// ggml-cpu/ops.cpp ggml_mrope_cache_init with indep_sects, rotate_pairs with n_offset = n_dims). Pair i of a
// head: sector c = i % (s0 + s1 + s2 + s3), its section s and index j there; theta = pos[s * n + t] *
// freq_base^(-2 j / n_dims); (x[i], x[i + n_dims]) rotated by theta. x, out f32 [n, n_head * head_dim] (out may
// be x: each invocation reads and writes its own pair); pos int [4, n]. One invocation per (row, head, pair),
// grid-stride loop, 256-wide workgroups.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer XBuf { float X[]; };
layout(std430, binding = 1) readonly buffer PBuf { int P[]; };
layout(std430, binding = 2) buffer OBuf { float O[]; };
layout(push_constant) uniform PC {
    uint head_dim; uint n; uint n_head; uint s0; uint s1; uint s2; uint s3; uint log2_base_bits;
} pc;
#include "common.glsl"

void main() {
    uint nd = pc.head_dim / 2u;
    uint total = pc.n * pc.n_head * nd;
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * 256u;
    float log2_base = uintBitsToFloat(pc.log2_base_bits);
    for (uint g = flat_group() * 256u + gl_LocalInvocationID.x; g < total; g += stride) {
        uint i = g % nd, rh = g / nd;  // rh = t * n_head + h
        uint t = rh / pc.n_head;
        uint c = i % (pc.s0 + pc.s1 + pc.s2 + pc.s3);
        uint s = c < pc.s0 ? 0u : c < pc.s0 + pc.s1 ? 1u : c < pc.s0 + pc.s1 + pc.s2 ? 2u : 3u;
        uint j = c - (s > 0u ? pc.s0 : 0u) - (s > 1u ? pc.s1 : 0u) - (s > 2u ? pc.s2 : 0u);
        float theta = float(P[s * pc.n + t]) * exp2(-2.0 * float(j) / float(nd) * log2_base);
        float cs = cos(theta), sn = sin(theta);
        uint o = rh * pc.head_dim + i;
        float a = X[o], b = X[o + nd];
        O[o] = a * cs - b * sn;
        O[o + nd] = a * sn + b * cs;
    }
}
