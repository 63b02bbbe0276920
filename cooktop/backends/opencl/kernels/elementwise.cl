// Elementwise ops on f32 activations; global size n rounded up to the local size.

// out = a + b (out may alias a)
__kernel void add(global float *out, const global float *a, const global float *b, const int n) {
    const int i = get_global_id(0);
    if (i < n) out[i] = a[i] + b[i];
}

// out[r, j] = x[r, j] + b[j]: a bias row b f32 [m] broadcast over the rows of x f32 [n / m, m]
// (out may alias x)
__kernel void add_bias(global float *out, const global float *x, const global float *b, const int n,
                       const int m) {
    const int i = get_global_id(0);
    if (i < n) out[i] = x[i] + b[i % m];
}

// out = silu(gate) * up = gate / (1 + exp(-gate)) * up  (SwiGLU)
__kernel void silu_mul(global float *out, const global float *gate, const global float *up, const int n) {
    const int i = get_global_id(0);
    if (i < n) {
        const float g = gate[i];
        out[i] = g / (1.0f + exp(-g)) * up[i];
    }
}

// cache[pos[t], j] = x[t, j]; cache f32 [n_ctx, dim], x f32 [n_tok, dim]; global (dim, n_tok).
// Positions outside [0, n_ctx) are dropped (the host checks them before enqueueing).
__kernel void kv_store(global float *cache, const global float *x, const global int *pos,
                       const int dim, const int n_ctx) {
    const int j = get_global_id(0);
    const int t = get_global_id(1);
    const int p = pos[t];
    if (j < dim && p >= 0 && p < n_ctx) cache[(size_t)p * dim + j] = x[(size_t)t * dim + j];
}

// out = gelu(gate) * up (GeGLU), GELU in ggml's tanh form (ggml_gelu_f32, ggml-cpu/vec.h):
// 0.5 g (1 + tanh(sqrt(2/pi) g (1 + 0.044715 g^2))). out may alias gate.
__kernel void gelu_mul(global float *out, const global float *gate, const global float *up, const int n) {
    const int i = get_global_id(0);
    if (i < n) {
        const float g = gate[i];
        out[i] = 0.5f * g * (1.0f + tanh(0.79788456080286535588f * g * (1.0f + 0.044715f * g * g))) * up[i];
    }
}

// out = x, n floats; global ceil(n / 256): each work-item copies 256 values (16 x float16),
// so every core of a CPU device takes part (a buffer copy command runs on one thread in PoCL)
__kernel void copy_f32(global float *out, const global float *x, const int n) {
    const size_t i0 = (size_t)get_global_id(0) * 256;
    if (i0 + 256 <= (size_t)n) {
#pragma unroll
        for (int k = 0; k < 16; k++) vstore16(vload16(k, x + i0), k, out + i0);
    } else {
        for (size_t i = i0; i < (size_t)n; i++) out[i] = x[i];
    }
}
