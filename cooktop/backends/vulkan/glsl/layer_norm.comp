#version 450
// Layer norm of each row (ggml_norm, ggml-cpu/ops.cpp ggml_compute_forward_norm_f32, then ggml_mul and
// ggml_add: llama.cpp tools/mtmd/clip.cpp build_norm NORM_TYPE_NORMAL):
//   out[r] = (x[r] - mean) / sqrt(var + eps) * w + b, var = mean((x[r] - mean)^2) (biased)
// x, out f32 [n_rows, n] (out may be x: each invocation writes only the values it read); w, b f32 [n]
// (has_b 0: no bias, b not read). One workgroup of WG per row (rmsnorm.comp's shape); the sum, then the
// sum of squared deviations, reduced in shared memory in float32.
#extension GL_GOOGLE_include_directive : require
#define WG 64
layout(local_size_x = WG) in;
layout(std430, binding = 0) readonly buffer XBuf { float X[]; };
layout(std430, binding = 1) readonly buffer WBuf { float W[]; };
layout(std430, binding = 2) readonly buffer BBuf { float B[]; };
layout(std430, binding = 3) buffer OBuf { float O[]; };
layout(push_constant) uniform PC { uint n; uint n_rows; uint has_b; uint eps_bits; } pc;
#include "common.glsl"

shared float red[WG];

float reduce_sum(float s, uint tid) {
    red[tid] = s;
    barrier();
    for (uint h = WG / 2u; h > 0u; h >>= 1) {
        if (tid < h) red[tid] += red[tid + h];
        barrier();
    }
    float r = red[0];
    barrier();  // every invocation has read red[0] before the next reduction writes it
    return r;
}

void main() {
    uint row = flat_group();
    uint tid = gl_LocalInvocationID.x;
    if (row >= pc.n_rows) return;
    uint o = row * pc.n;
    float s = 0.0;
    for (uint k = tid; k < pc.n; k += WG) s += X[o + k];
    float mean = reduce_sum(s, tid) / float(pc.n);
    float v = 0.0;
    for (uint k = tid; k < pc.n; k += WG) {
        float d = X[o + k] - mean;
        v += d * d;
    }
    float scale = 1.0 / sqrt(reduce_sum(v, tid) / float(pc.n) + uintBitsToFloat(pc.eps_bits));
    for (uint k = tid; k < pc.n; k += WG) {
        float y = (X[o + k] - mean) * scale * W[k];
        O[o + k] = pc.has_b != 0u ? y + B[k] : y;
    }
}
