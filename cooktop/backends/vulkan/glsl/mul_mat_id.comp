#version 450
// ggml_mul_mat_id: slot rs = i * k + j of row i: Y f32 [n * k, n_out] = X_rs @ W[ids[rs]]^T, with
// W [n_expert, n_out, n_in] raw GGML blocks (TYPE_*; expert e's rows follow each other), X f32
// [n, n_in] (per_slot 0: the k slots of a row share its input) or [n * k, n_in], ids int32 [n * k]
// clamped to [0, n_expert). One invocation per output value, workgroups of 32 over n * k * n_out.
// Only the selected experts' rows are read; a prompt's rows are not grouped by expert.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 32) in;
layout(std430, binding = 0) readonly buffer WBuf { uvec4 W4[]; };
layout(std430, binding = 1) readonly buffer XBuf { float X[]; };
layout(std430, binding = 2) readonly buffer IdBuf { int ids[]; };
layout(std430, binding = 3) writeonly buffer YBuf { float Y[]; };
layout(push_constant) uniform PC { uint n_in; uint n_out; uint n_slots; uint k; uint per_slot; uint n_expert;
                                   uint row_bytes; } pc;
#define HAS_WEIGHTS
#include "common.glsl"
#include "dequant.glsl"

void main() {
    uint idx = flat_group() * 32u + gl_LocalInvocationID.x;
    uint o = idx % pc.n_out;
    uint rs = idx / pc.n_out;
    if (rs >= pc.n_slots) return;
    uint e = uint(clamp(ids[rs], 0, int(pc.n_expert) - 1));
    uint roff = (e * pc.n_out + o) * pc.row_bytes;
    uint xo = (pc.per_slot != 0u ? rs : rs / pc.k) * pc.n_in;
    uint n_units = pc.n_in / 32u;
    float acc = 0.0;
    for (uint u = 0u; u < n_units; u++) {
        float v[32];
        unit_values(roff, u, v);
        [[unroll]] for (uint i = 0u; i < 32u; i++) acc += v[i] * X[xo + u * 32u + i];
    }
#if defined(TYPE_F32)
    for (uint c = n_units * 32u; c < pc.n_in; c++) acc += uintBitsToFloat(w_u32a(roff + 4u * c)) * X[xo + c];
#elif defined(TYPE_F16)
    for (uint c = n_units * 32u; c < pc.n_in; c++) acc += w_f16(roff + 2u * c) * X[xo + c];
#endif
    Y[rs * pc.n_out + o] = acc;
}
