// Rotary position embedding, ggml_rope_ext with ext_factor 0 and attn_factor 1.
// x, out f32 [n_tok, n_heads * head_dim]; pos int32 [n_tok]. Global (head_dim/2, n_heads, n_tok).
// Pair i < n_rot/2: theta = pos * freq_scale * freq_base^(-2i/n_rot); mode 0 rotates
// (x[2i], x[2i+1]), mode 2 (NeoX) rotates (x[i], x[i + n_rot/2]). Dimensions >= n_rot
// are copied. out may alias x.
__kernel void rope(global float *out, const global float *x, const global int *pos,
                   const int head_dim, const int n_rot, const float freq_base,
                   const float freq_scale, const int mode) {
    const int i = get_global_id(0);
    const size_t base = ((size_t)get_global_id(2) * get_global_size(1) + get_global_id(1)) * head_dim;
    const int half_rot = n_rot / 2;
    if (i < half_rot) {
        const float theta = (float)pos[get_global_id(2)] * freq_scale
                            * pow(freq_base, -2.0f * (float)i / (float)n_rot);
        const float c = cos(theta), s = sin(theta);
        const int i0 = mode == 2 ? i : 2 * i;
        const int i1 = mode == 2 ? i + half_rot : 2 * i + 1;
        const float a = x[base + i0], b = x[base + i1];
        out[base + i0] = a * c - b * s;
        out[base + i1] = a * s + b * c;
    } else {
        const int j = n_rot + 2 * (i - half_rot);
        out[base + j] = x[base + j];
        out[base + j + 1] = x[base + j + 1];
    }
}
