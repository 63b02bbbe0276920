#version 450
// L2 norm of each group of g consecutive values, as llama.cpp src/models/models.h build_gdn_l2_norm
// writes it: ggml_rms_norm with eps / g, then ggml_scale by 1 / sqrt(g):
//   out[grp] = x[grp] * (1 / sqrt(sum(x[grp]^2) / g + eps_g)) * inv_sqrt_g
// x, out f32 [n_groups * g] (out may be x). One workgroup of WG per group (rmsnorm.comp's shape); the
// sum of squares reduced in shared memory, accumulated in float32.
#extension GL_GOOGLE_include_directive : require
#define WG 64
layout(local_size_x = WG) in;
layout(std430, binding = 0) readonly buffer XBuf { float X[]; };
layout(std430, binding = 1) buffer OBuf { float O[]; };
layout(push_constant) uniform PC { uint g; uint n_groups; uint eps_g_bits; uint inv_sqrt_g_bits; } pc;
#include "common.glsl"

shared float red[WG];

void main() {
    uint grp = flat_group();
    uint tid = gl_LocalInvocationID.x;
    if (grp >= pc.n_groups) return;
    uint o = grp * pc.g;
    float s = 0.0;
    for (uint k = tid; k < pc.g; k += WG) s += X[o + k] * X[o + k];
    red[tid] = s;
    barrier();
    for (uint h = WG / 2u; h > 0u; h >>= 1) {
        if (tid < h) red[tid] += red[tid + h];
        barrier();
    }
    float scale = 1.0 / sqrt(red[0] / float(pc.g) + uintBitsToFloat(pc.eps_g_bits));
    float inv_sqrt_g = uintBitsToFloat(pc.inv_sqrt_g_bits);
    for (uint k = tid; k < pc.g; k += WG) O[o + k] = X[o + k] * scale * inv_sqrt_g;
}
