#version 450
// A rectangle of 32-bit words between two row-major matrices (float32 and int32 alike):
// O[dst_off + r * dst_stride + c] = I[src_off + r * src_stride + c] for r < n_rows, c < n_cols
// (offsets and strides in words). The generic layer's tensors stored in row chunks use it to
// put a chunk's result into its columns or rows of the whole (backends/chunked.py).
// Grid-stride loop, WG 256.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer IBuf { uint I[]; };
layout(std430, binding = 1) writeonly buffer OBuf { uint O[]; };
layout(push_constant) uniform PC { uint n_rows; uint n_cols; uint src_off; uint src_stride; uint dst_off;
                                   uint dst_stride; } pc;
#include "common.glsl"

void main() {
    uint n = pc.n_rows * pc.n_cols;
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * 256u;
    for (uint i = flat_group() * 256u + gl_LocalInvocationID.x; i < n; i += stride) {
        uint r = i / pc.n_cols;
        uint c = i - r * pc.n_cols;
        O[pc.dst_off + r * pc.dst_stride + c] = I[pc.src_off + r * pc.src_stride + c];
    }
}
