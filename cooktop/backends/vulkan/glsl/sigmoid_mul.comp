#version 450
// out = a * 1 / (1 + exp(-gate)), elementwise f32 [n] (ggml_sigmoid then ggml_mul: llama.cpp
// src/models/qwen35.cpp's gated attention output; out may be a or gate). Grid-stride loop, 256-wide workgroups.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer ABuf { float A[]; };
layout(std430, binding = 1) readonly buffer GBuf { float G[]; };
layout(std430, binding = 2) buffer OBuf { float O[]; };
layout(push_constant) uniform PC { uint n; } pc;
#include "common.glsl"

void main() {
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * 256u;
    for (uint i = flat_group() * 256u + gl_LocalInvocationID.x; i < pc.n; i += stride)
        O[i] = A[i] * (1.0 / (1.0 + exp(-G[i])));
}
