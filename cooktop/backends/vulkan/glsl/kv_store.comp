#version 450
// cache[pos[i], :] = x[i, :]; cache f32 [n_ctx, n_kv_dim], x f32 [n, n_kv_dim],
// pos int32 [n]. Rows with pos outside [0, n_ctx) are skipped (the engine
// refuses such positions with ContextOverflowError before they get here).
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer CBuf { float C[]; };
layout(std430, binding = 1) readonly buffer XBuf { float X[]; };
layout(std430, binding = 2) readonly buffer PBuf { int P[]; };
layout(push_constant) uniform PC { uint n; uint kv_dim; uint n_ctx; } pc;
#include "common.glsl"

void main() {
    uint id = flat_group() * 64u + gl_LocalInvocationID.x;
    uint row = id / pc.kv_dim;
    if (row >= pc.n) return;
    int p = P[row];
    if (p < 0 || uint(p) >= pc.n_ctx) return;
    C[uint(p) * pc.kv_dim + id % pc.kv_dim] = X[id];
}
