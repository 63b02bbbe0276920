#version 450
// out = a * b, elementwise f32 [n] (ggml_mul; out may be a or b). Grid-stride loop, 256-wide workgroups.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer ABuf { float A[]; };
layout(std430, binding = 1) readonly buffer BBuf { float B[]; };
layout(std430, binding = 2) buffer OBuf { float O[]; };
layout(push_constant) uniform PC { uint n; } pc;
#include "common.glsl"

void main() {
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * 256u;
    for (uint i = flat_group() * 256u + gl_LocalInvocationID.x; i < pc.n; i += stride) O[i] = A[i] * B[i];
}
