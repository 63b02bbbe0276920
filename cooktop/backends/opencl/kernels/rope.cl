// Rotary position embedding, ggml_rope_ext (ggml-cpu ops.cpp rope_yarn).
// x, out f32 [n_tok, n_heads * head_dim]; pos int32 [n_tok]; ff f32 [>= n_rot/2] frequency
// factors (read only when has_ff). Global (head_dim/2, n_tok): a work-item computes the
// angle of pair i once and applies it to every head.
// Pair i < n_rot/2: t_extrap = pos * freq_base^(-2i/n_rot) / ff[i], theta = freq_scale * t_extrap;
// when ext_factor != 0 (YaRN) theta is mixed with t_extrap by the ramp over (corr0, corr1).
// cos and sin are scaled by mscale (attn_factor, times YaRN's magnitude factor: host-computed).
// mode 0 rotates (x[2i], x[2i+1]), mode 2 (NeoX) rotates (x[i], x[i + n_rot/2]).
// Dimensions >= n_rot are copied. out may alias x.
// rope_cs and rope_rot are shared with kv_store.cl's rope_store, built without -cl-mad-enable:
// every a * b + c they compute is an explicit fma (or has no add), so both builds round alike.

// (cos, sin) * mscale of pair i at position p
inline float2 rope_cs(const int p, const int i, const int n_rot, const float freq_base, const float freq_scale,
                      const global float *ff, const int has_ff, const float ext_factor, const float mscale,
                      const float corr0, const float corr1) {
    // freq_base^(-2i/n_rot) as exp2 (pow is a slow library call on PoCL)
    float t_extrap = (float)p * exp2(-2.0f * (float)i / (float)n_rot * log2(freq_base));
    if (has_ff) t_extrap /= ff[i];
    float theta = freq_scale * t_extrap;
    if (ext_factor != 0.0f) {
        const float y = ((float)i - corr0) / fmax(0.001f, corr1 - corr0);
        const float ramp = (1.0f - clamp(y, 0.0f, 1.0f)) * ext_factor;
        theta = fma(theta, 1.0f - ramp, t_extrap * ramp);
    }
    float c;
    const float s = sincos(theta, &c);
    return (float2)(c * mscale, s * mscale);
}

// the pair (a, b) rotated by cs = (cos, sin): (a cos - b sin, a sin + b cos)
inline float2 rope_rot(const float a, const float b, const float2 cs) {
    return (float2)(fma(a, cs.x, -(b * cs.y)), fma(a, cs.y, b * cs.x));
}

__kernel void rope(global float *out, const global float *x, const global int *pos,
                   const int head_dim, const int n_rot, const float freq_base,
                   const float freq_scale, const int mode, const int n_heads,
                   const global float *ff, const int has_ff, const float ext_factor,
                   const float mscale, const float corr0, const float corr1) {
    const int i = get_global_id(0);
    const int t = get_global_id(1);
    const int half_rot = n_rot / 2;
    const size_t row = (size_t)t * n_heads * head_dim;
    if (i < half_rot) {
        const float2 cs = rope_cs(pos[t], i, n_rot, freq_base, freq_scale, ff, has_ff, ext_factor, mscale,
                                  corr0, corr1);
        const int i0 = mode == 2 ? i : 2 * i;
        const int i1 = mode == 2 ? i + half_rot : 2 * i + 1;
        for (int h = 0; h < n_heads; h++) {
            const size_t base = row + (size_t)h * head_dim;
            const float2 r = rope_rot(x[base + i0], x[base + i1], cs);
            out[base + i0] = r.x;
            out[base + i1] = r.y;
        }
    } else {
        const int j = n_rot + 2 * (i - half_rot);
        for (int h = 0; h < n_heads; h++) {
            const size_t base = row + (size_t)h * head_dim;
            out[base + j] = x[base + j];
            out[base + j + 1] = x[base + j + 1];
        }
    }
}
