// The recurrent layers' ops (backends/recurrent_ops.py) on f32 activations.

// Causal depthwise convolution with a carried state (ggml_ssm_conv, ggml-cpu/ops.cpp ssm_conv_f32, with
// the state prepended and written back as llama.cpp src/models/lfm2.cpp does). x, out f32 [n, c];
// w f32 [c, k] (k taps per channel); state f32 [n_slots, (k - 1) * c], slot s's row as [k - 1, c], oldest
// first; slots int [n]. One work-item per channel walks the rows in order, so rows of one slot see the
// inputs of the rows before them. The sum runs over the taps in order, in float, as ggml's.
__kernel void ssm_conv(global float *out, const global float *x, global float *state, const global float *w,
                       const global int *slots, const int n, const int c, const int k) {
    const int ch = get_global_id(0);
    if (ch >= c) return;
    const global float *wc = w + (size_t)ch * k;
    for (int i = 0; i < n; ++i) {
        global float *st = state + (size_t)slots[i] * (size_t)(k - 1) * c + ch;
        const float xi = x[(size_t)i * c + ch];
        float sum = 0.0f;
        for (int t = 0; t < k - 1; ++t) sum += st[(size_t)t * c] * wc[t];
        sum += xi * wc[k - 1];
        for (int t = 0; t < k - 2; ++t) st[(size_t)t * c] = st[(size_t)(t + 1) * c];
        st[(size_t)(k - 2) * c] = xi;
        out[(size_t)i * c + ch] = sum;
    }
}

// out = a * b (ggml_mul; out may alias a or b)
__kernel void mul(global float *out, const global float *a, const global float *b, const int n) {
    const int i = get_global_id(0);
    if (i < n) out[i] = a[i] * b[i];
}
