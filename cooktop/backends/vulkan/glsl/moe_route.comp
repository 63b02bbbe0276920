#version 450
// Expert routing (llama.cpp build_moe_ffn): one invocation per row of logits L f32 [n, n_expert];
// ids int32 / weights f32 [n, k] (k <= 32); B f32 [n_expert] the selection bias, read when has_bias.
// The k largest scores (equal ones: the lower index first, as a stable sort): without a bias the
// logits (every gating is monotonic in them), with one the probabilities plus the bias (llama.cpp's
// exp_probs_b: it picks, it does not weigh). Weights by gating 0 softmax over all, 1 softmax over
// the selected, 2 sigmoid; then norm: divided by their sum clamped to >= 6.103515625e-5; scale
// (not 0 or 1): times scale. Workgroups of 32.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 32) in;
layout(std430, binding = 0) readonly buffer LBuf { float L[]; };
layout(std430, binding = 1) writeonly buffer IBuf { int ids[]; };
layout(std430, binding = 2) writeonly buffer WBuf { float Wt[]; };
layout(std430, binding = 3) readonly buffer BBuf { float B[]; };
layout(push_constant) uniform PC { uint n; uint n_expert; uint k; uint gating; uint norm; uint scale; uint has_bias; } pc;
#include "common.glsl"

float prob(float v, float mx, float sum) {
    return pc.gating == 0u ? exp(v - mx) / sum : pc.gating == 2u ? 1.0 / (1.0 + exp(-v)) : v;
}

void main() {
    uint r = flat_group() * 32u + gl_LocalInvocationID.x;
    if (r >= pc.n) return;
    uint l0 = r * pc.n_expert;
    float mx = -1.0 / 0.0, sum = 0.0;
    for (uint e = 0u; e < pc.n_expert; e++) mx = max(mx, L[l0 + e]);
    if (pc.gating == 0u) {
        for (uint e = 0u; e < pc.n_expert; e++) sum += exp(L[l0 + e] - mx);
    }
    int sel[32];
    for (uint j = 0u; j < pc.k; j++) {
        int best = -1;
        float best_s = 0.0;
        for (uint e = 0u; e < pc.n_expert; e++) {
            bool taken = false;
            for (uint q = 0u; q < j; q++) taken = taken || sel[q] == int(e);
            float sc = pc.has_bias != 0u ? prob(L[l0 + e], mx, sum) + B[e] : L[l0 + e];
            if (!taken && (best < 0 || sc > best_s)) {
                best = int(e);
                best_s = sc;
            }
        }
        sel[j] = best;
    }
    float w[32];
    float tot = 0.0;
    for (uint j = 0u; j < pc.k; j++) {
        float v = L[l0 + uint(sel[j])];
        float p = pc.gating == 1u ? exp(v - L[l0 + uint(sel[0])]) : prob(v, mx, sum);
        w[j] = p;
        tot += p;
    }
    float scale = uintBitsToFloat(pc.scale);
    for (uint j = 0u; j < pc.k; j++) {
        float p = w[j];
        if (pc.gating == 1u) p /= tot;
        else if (pc.norm != 0u) p /= max(tot, 6.103515625e-5);
        if (scale != 0.0 && scale != 1.0) p *= scale;
        ids[r * pc.k + j] = sel[j];
        Wt[r * pc.k + j] = p;
    }
}
