#version 450
// Matrix-vector product for few tokens (decode): Y[t, r] = sum_k X[t, k] * W[r, k]
// (llama.cpp mul_mat_vec). W [n_out, n_in] raw GGML blocks (type from TYPE_*),
// X f32 [n_tok, n_in], Y f32 [n_tok, n_out]. One workgroup of WG computes NROWS
// rows of one token: its invocations stride over the 32-value units of the rows,
// dequantize each unit in registers (dequant.glsl), reuse the unit's x values for
// all NROWS rows, and reduce in shared memory.
// F32 / F16 rows of any length: the values past the last whole unit are added one by one.
// Grid: n_tok * ceil(n_out / NROWS) workgroups (flat_group()).
// WG 16 x NROWS 8 measured fastest on lavapipe (2 cores, 256-bit SIMD: two
// subgroups of 8 lanes per workgroup); GPUs would like WG >= 32.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#ifndef WG
#define WG 16
#endif
#ifndef NROWS
#define NROWS 8
#endif
layout(local_size_x = WG) in;
layout(std430, binding = 0) readonly buffer WBuf { uint W[]; };
layout(std430, binding = 1) readonly buffer XBuf { float X[]; };
layout(std430, binding = 2) writeonly buffer YBuf { float Y[]; };
layout(push_constant) uniform PC { uint n_in; uint n_out; uint n_tok; uint row_bytes; } pc;
#define HAS_WEIGHTS
#include "common.glsl"
#include "dequant.glsl"

shared float red[NROWS * WG];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint n_groups = (pc.n_out + NROWS - 1u) / NROWS;
    uint g = flat_group();
    uint tok = g / n_groups;
    uint r0 = (g % n_groups) * NROWS;
    if (tok >= pc.n_tok) return;  // uniform over the workgroup
    uint n_units = pc.n_in / 32u;
    float acc[NROWS];
    [[unroll]] for (uint r = 0u; r < NROWS; r++) acc[r] = 0.0;
    for (uint u = tid; u < n_units; u += WG) {
        float xv[32];
        uint xo = tok * pc.n_in + u * 32u;
        [[unroll]] for (uint i = 0u; i < 32u; i++) xv[i] = X[xo + i];
        [[unroll]] for (uint r = 0u; r < NROWS; r++) {
            uint row = min(r0 + r, pc.n_out - 1u);  // clamped rows are computed and dropped
            float v[32];
            unit_values(row * pc.row_bytes, u, v);
            float s = 0.0;
            [[unroll]] for (uint i = 0u; i < 32u; i++) s += v[i] * xv[i];
            acc[r] += s;
        }
    }
#ifdef FLOAT_TYPE
    // F32 / F16 rows may end in a partial unit: its values one by one
    for (uint k = n_units * 32u + tid; k < pc.n_in; k += WG) {
        float xk = X[tok * pc.n_in + k];
        [[unroll]] for (uint r = 0u; r < NROWS; r++) acc[r] += value_at(min(r0 + r, pc.n_out - 1u) * pc.row_bytes, k) * xk;
    }
#endif
    for (uint r = 0u; r < NROWS; r++) red[r * WG + tid] = acc[r];
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (tid < s) {
            for (uint r = 0u; r < NROWS; r++) red[r * WG + tid] += red[r * WG + tid + s];
        }
        barrier();
    }
    if (tid < NROWS && r0 + tid < pc.n_out) Y[tok * pc.n_out + r0 + tid] = red[tid * WG];
}
