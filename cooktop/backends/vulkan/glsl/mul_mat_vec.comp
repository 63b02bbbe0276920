#version 450
// Matrix-vector product for few tokens (decode): Y[t, r] = sum_k X[t, k] * W[r, k]
// (llama.cpp mul_mat_vec). W [n_out, n_in] raw GGML blocks (type from TYPE_*),
// X f32 [n_tok, n_in], Y f32 [n_tok, n_out]. One workgroup of WG computes NROWS
// rows of one token: its invocations stride over the 32-value units of the rows,
// dequantize each unit in registers (dequant.glsl), reuse the unit's x values for
// all NROWS rows, and reduce with subgroupAdd plus one shared-memory step
// (needs subgroup arithmetic in compute shaders, Vulkan 1.1; the probe checks it).
// F32 / F16 rows of any length: the values past the last whole unit are added one by one.
// A workgroup handles groups_per_wg consecutive groups of NROWS rows (1 on GPUs; more on
// CPU drivers such as lavapipe, which pay a fixed cost per workgroup).
// Grid: n_tok * ceil(ceil(n_out / NROWS) / groups_per_wg) workgroups (flat_group()).
// On lavapipe (subgroups of 8 lanes) a barrier-free one-subgroup workgroup is about twice
// as fast as a shared-memory tree reduction: its barriers were the expensive part.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#ifndef NROWS
#define NROWS 8
#endif
// The workgroup size is specialization constant 0, set by the host to the device's
// subgroup size (32 when not specialized), so that usually one subgroupAdd reduces it.
layout(local_size_x_id = 0) in;
#define WG gl_WorkGroupSize.x
layout(std430, binding = 0) readonly buffer WBuf { uvec4 W4[]; };
#ifdef PACKED16
// The same weight buffer as 16-bit words (needs storageBuffer16BitAccess; variants.json
// records the features each variant's SPIR-V needs): blocks of 2-byte aligned types
// (Q4_0 18 bytes, Q8_0 34) are read with aligned 16-bit loads instead of two 32-bit
// loads and a shift per unaligned word (ggml-vulkan's packed16 block layouts).
#extension GL_EXT_shader_16bit_storage : require
layout(std430, binding = 0) readonly buffer WBuf16 { uint16_t W16[]; };
#endif
layout(std430, binding = 1) readonly buffer XBuf { vec4 X4[]; };  // allocations are padded to 4 floats
layout(std430, binding = 2) writeonly buffer YBuf { float Y[]; };
layout(push_constant) uniform PC { uint n_in; uint n_out; uint n_tok; uint row_bytes; uint groups_per_wg; } pc;
#define HAS_WEIGHTS
#include "common.glsl"
#include "dequant.glsl"

shared float red[NROWS * WG];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint n_groups = (pc.n_out + NROWS - 1u) / NROWS;          // row groups of NROWS
    uint n_wg = (n_groups + pc.groups_per_wg - 1u) / pc.groups_per_wg;  // workgroups per token
    uint g = flat_group();
    uint tok = g / n_wg;
    if (tok >= pc.n_tok) return;  // uniform over the workgroup
    uint gi0 = (g % n_wg) * pc.groups_per_wg;
    uint gi1 = min(gi0 + pc.groups_per_wg, n_groups);
    uint n_units = pc.n_in / 32u;
    for (uint gi = gi0; gi < gi1; gi++) {
        uint r0 = gi * NROWS;
        float acc[NROWS];
        [[unroll]] for (uint r = 0u; r < NROWS; r++) acc[r] = 0.0;
        for (uint u = tid; u < n_units; u += WG) {
            float xv[32];
            uint xo = tok * pc.n_in + u * 32u;
            if ((xo & 3u) == 0u) {  // rows of a multiple of 4 values: 16-byte loads
                [[unroll]] for (uint i = 0u; i < 8u; i++) {
                    vec4 f = X4[(xo >> 2) + i];
                    xv[4u * i] = f.x; xv[4u * i + 1u] = f.y; xv[4u * i + 2u] = f.z; xv[4u * i + 3u] = f.w;
                }
            } else {
                [[unroll]] for (uint i = 0u; i < 32u; i++) xv[i] = X4[(xo + i) >> 2][(xo + i) & 3u];
            }
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
            uint xk_i = tok * pc.n_in + k;
            float xk = X4[xk_i >> 2][xk_i & 3u];
            [[unroll]] for (uint r = 0u; r < NROWS; r++) {
                acc[r] += value_at(min(r0 + r, pc.n_out - 1u) * pc.row_bytes, k) * xk;
            }
        }
#endif
        // reduce: subgroupAdd; when the workgroup is one subgroup (the host sizes it so),
        // no barrier at all (lavapipe pays for every barrier), else one shared-memory step
        if (gl_NumSubgroups == 1u) {
            [[unroll]] for (uint r = 0u; r < NROWS; r++) {
                float t = subgroupAdd(acc[r]);
                if (tid == r && r0 + r < pc.n_out) Y[tok * pc.n_out + r0 + r] = t;
            }
        } else {
            [[unroll]] for (uint r = 0u; r < NROWS; r++) {
                float t = subgroupAdd(acc[r]);
                if (gl_SubgroupInvocationID == 0u) red[r * WG + gl_SubgroupID] = t;
            }
            barrier();
            if (tid < NROWS && r0 + tid < pc.n_out) {
                float t = 0.0;
                for (uint i = 0u; i < gl_NumSubgroups; i++) t += red[tid * WG + i];
                Y[tok * pc.n_out + r0 + tid] = t;
            }
            barrier();  // red is reused by the next row group
        }
    }
}
