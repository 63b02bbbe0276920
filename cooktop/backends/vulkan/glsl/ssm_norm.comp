#version 450
// Mamba-2's gated RMS norm over groups (llama.cpp src/models/mamba-base.cpp build_mamba2_layer:
// ggml_swiglu_split(z, y), then ggml_rms_norm of each group of gw values times ssm_norm): with
// v = y * silu(z), out = v / sqrt(mean(v^2) + eps) * w[group]. Y, Z, O f32 [n_rows * n_groups * gw] (O may
// be Y or Z: every value is read in the first pass, before the barrier, and written by the invocation that
// reads it again in the second); W f32 [n_groups * gw]. One workgroup of WG per group of a row
// (rmsnorm.comp's shape); the sum of squares reduced in shared memory, accumulated in float32.
#extension GL_GOOGLE_include_directive : require
#define WG 64
layout(local_size_x = WG) in;
layout(std430, binding = 0) readonly buffer YBuf { float Y[]; };
layout(std430, binding = 1) readonly buffer ZBuf { float Z[]; };
layout(std430, binding = 2) readonly buffer WBuf { float W[]; };
layout(std430, binding = 3) buffer OBuf { float O[]; };
layout(push_constant) uniform PC { uint gw; uint n_groups; uint n_total; uint eps_bits; } pc;
#include "common.glsl"

shared float red[WG];

void main() {
    uint grp = flat_group();
    uint tid = gl_LocalInvocationID.x;
    if (grp >= pc.n_total) return;
    uint o = grp * pc.gw;
    uint wo = (grp % pc.n_groups) * pc.gw;
    float s = 0.0;
    for (uint k = tid; k < pc.gw; k += WG) {
        float zv = Z[o + k];
        float v = Y[o + k] * (zv / (1.0 + exp(-zv)));
        s += v * v;
    }
    red[tid] = s;
    barrier();
    for (uint h = WG / 2u; h > 0u; h >>= 1) {
        if (tid < h) red[tid] += red[tid + h];
        barrier();
    }
    float scale = 1.0 / sqrt(red[0] / float(pc.gw) + uintBitsToFloat(pc.eps_bits));
    for (uint k = tid; k < pc.gw; k += WG) {
        float zv = Z[o + k];
        float v = Y[o + k] * (zv / (1.0 + exp(-zv)));
        O[o + k] = v * scale * W[wo + k];
    }
}
