#version 450
// Raw 32-bit word copy O[i] = I[i] for i < n (float32 and int32 alike), or with
// FILL defined, O[i] = value. Used for host<->device staging inside recorded
// sequences (write(), read()) and for zeros(). Grid-stride loop, WG 256.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
#ifdef FILL
layout(std430, binding = 0) writeonly buffer OBuf { uint O[]; };
layout(push_constant) uniform PC { uint n; uint value; } pc;
#else
layout(std430, binding = 0) readonly buffer IBuf { uint I[]; };
layout(std430, binding = 1) writeonly buffer OBuf { uint O[]; };
layout(push_constant) uniform PC { uint n; } pc;
#endif
#include "common.glsl"

void main() {
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * 256u;
    for (uint i = flat_group() * 256u + gl_LocalInvocationID.x; i < pc.n; i += stride) {
#ifdef FILL
        O[i] = pc.value;
#else
        O[i] = I[i];
#endif
    }
}
