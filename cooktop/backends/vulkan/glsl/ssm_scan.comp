#version 450
// Mamba-2's selective scan with a carried state (ggml_ssm_scan, ggml-cpu/ops.cpp
// ggml_compute_forward_ssm_scan_f32, the Mamba-2 branch: a scalar A per head), with dt's bias before it and
// y + x * D after it as llama.cpp src/models/mamba-base.cpp build_mamba2_layer adds them. XBC f32 [n, w]
// (w = h * p + 2 * g * ns: x [h, p], then B [g, ns], then C [g, ns]); DT f32 [n, h]; A, D, DTB f32 [h];
// S f32 [n_slots, h * p * ns], slot s's row as S[h, p, ns]; SL int [n]; O f32 [n, h * p]. Head hd reads
// group hd / (h / g). One invocation per (head, p) (grid-stride, 64-wide workgroups) walks the rows in
// order: it owns S[hd, p, :] of the row's slot (no other invocation reads or writes it), so the rows of
// one slot see the state the rows before them left:
//   dt' = softplus(dt + dt_bias); S = S * exp(dt' a) + B * (x dt'); out = S . C + x * D
#extension GL_GOOGLE_include_directive : require
#define WG 64
layout(local_size_x = WG) in;
layout(std430, binding = 0) readonly buffer XBuf { float XBC[]; };
layout(std430, binding = 1) readonly buffer DtBuf { float DT[]; };
layout(std430, binding = 2) readonly buffer ABuf { float A[]; };
layout(std430, binding = 3) readonly buffer DBuf { float D[]; };
layout(std430, binding = 4) readonly buffer BBuf { float DTB[]; };
layout(std430, binding = 5) buffer SBuf { float S[]; };
layout(std430, binding = 6) readonly buffer IBuf { int SL[]; };
layout(std430, binding = 7) writeonly buffer OBuf { float O[]; };
layout(push_constant) uniform PC { uint n; uint h; uint p; uint ns; uint g; } pc;
#include "common.glsl"

void main() {
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * WG;
    uint d_inner = pc.h * pc.p, w = d_inner + 2u * pc.g * pc.ns;
    for (uint id = flat_group() * WG + gl_LocalInvocationID.x; id < d_inner; id += stride) {  // hd * p + j
        uint hd = id / pc.p;
        uint grp = (hd / (pc.h / pc.g)) * pc.ns;
        for (uint r = 0u; r < pc.n; ++r) {
            uint s = uint(SL[r]) * d_inner * pc.ns + id * pc.ns;
            uint row = r * w;
            uint bm = row + d_inner + grp, cm = row + d_inner + pc.g * pc.ns + grp;
            float v = DT[r * pc.h + hd] + DTB[hd];
            float sp = v > 20.0 ? v : log(1.0 + exp(v));
            float da = exp(sp * A[hd]);
            float x = XBC[row + id];
            float xdt = x * sp;
            float sum = 0.0;
            for (uint i = 0u; i < pc.ns; ++i) {
                float st = S[s + i] * da + XBC[bm + i] * xdt;
                S[s + i] = st;
                sum += st * XBC[cm + i];
            }
            O[r * d_inner + id] = sum + x * D[hd];
        }
    }
}
