#version 450
// out[i] = x[i] / sqrt(mean(x[i]^2) + eps) * w  (ggml_rms_norm then ggml_mul).
// x, out f32 [n_rows, n]; w f32 [n]. One workgroup of WG per row; sum of squares
// reduced in shared memory, accumulated in float32.
#extension GL_GOOGLE_include_directive : require
#define WG 64
layout(local_size_x = WG) in;
layout(std430, binding = 0) readonly buffer XBuf { float X[]; };
layout(std430, binding = 1) readonly buffer NBuf { float NW[]; };
layout(std430, binding = 2) buffer OBuf { float O[]; };
layout(push_constant) uniform PC { uint n; uint n_rows; uint eps_bits; } pc;
#include "common.glsl"

shared float red[WG];

void main() {
    uint row = flat_group();
    uint tid = gl_LocalInvocationID.x;
    if (row >= pc.n_rows) return;
    uint o = row * pc.n;
    float s = 0.0;
    for (uint k = tid; k < pc.n; k += WG) s += X[o + k] * X[o + k];
    red[tid] = s;
    barrier();
    for (uint h = WG / 2u; h > 0u; h >>= 1) {
        if (tid < h) red[tid] += red[tid + h];
        barrier();
    }
    float scale = 1.0 / sqrt(red[0] / float(pc.n) + uintBitsToFloat(pc.eps_bits));
    for (uint k = tid; k < pc.n; k += WG) O[o + k] = X[o + k] * scale * NW[k];
}
