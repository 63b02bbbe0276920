#version 450
// gpt-oss's clamped SwiGLU (ggml swiglu_oai): g = min(gate, limit), u = clamp(up, -limit, limit),
// out = g / (1 + exp(-alpha g)) * (u + 1), elementwise f32 [n] (out may be gate).
// Grid-stride loop, 256-wide workgroups.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer GBuf { float G[]; };
layout(std430, binding = 1) readonly buffer UBuf { float U[]; };
layout(std430, binding = 2) buffer OBuf { float O[]; };
layout(push_constant) uniform PC { uint n; uint alpha; uint limit; } pc;
#include "common.glsl"

void main() {
    float alpha = uintBitsToFloat(pc.alpha), limit = uintBitsToFloat(pc.limit);
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * 256u;
    for (uint i = flat_group() * 256u + gl_LocalInvocationID.x; i < pc.n; i += stride) {
        float g = min(G[i], limit);
        float u = clamp(U[i], -limit, limit);
        O[i] = g / (1.0 + exp(-alpha * g)) * (u + 1.0);
    }
}
