#version 450
// Average pool of a patch grid over non-overlapping k x k windows (ggml_pool_2d GGML_OP_POOL_AVG, stride k,
// no padding; ggml-cpu/ops.cpp ggml_compute_forward_pool_2d: the window's float sum, then / (k * k)).
// x f32 [height * width, c] token-major (token y * width + x); out f32 [(height / k) * (width / k), c].
// One invocation per output value (grid-stride loop, 256-wide workgroups), the window summed row by row.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer XBuf { float X[]; };
layout(std430, binding = 1) writeonly buffer OBuf { float O[]; };
layout(push_constant) uniform PC { uint width; uint k; uint c; uint n; } pc;
#include "common.glsl"

void main() {
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * 256u;
    uint wo = pc.width / pc.k;
    for (uint i = flat_group() * 256u + gl_LocalInvocationID.x; i < pc.n; i += stride) {
        uint ch = i % pc.c;
        uint o = i / pc.c;
        uint y0 = (o / wo) * pc.k, x0 = (o % wo) * pc.k;
        float s = 0.0;
        for (uint dy = 0u; dy < pc.k; ++dy) {
            uint row = (y0 + dy) * pc.width + x0;
            for (uint dx = 0u; dx < pc.k; ++dx) s += X[(row + dx) * pc.c + ch];
        }
        O[i] = s / float(pc.k * pc.k);
    }
}
