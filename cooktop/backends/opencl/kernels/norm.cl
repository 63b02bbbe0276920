// rmsnorm: out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w   (ggml_rms_norm then ggml_mul)
// x, out f32 [n_rows, n]; w f32 [n]. Local size (RN_LS, 1), one group per row;
// the sum of squares is reduced in local memory. out may alias x.
__kernel void rmsnorm(global float *out, const global float *x, const global float *w,
                      const int n, const float eps) {
    const int lid = get_local_id(0);
    const size_t off = (size_t)get_group_id(1) * n;
    local float red[RN_LS];
    float s = 0.0f;
    for (int i = lid; i < n; i += RN_LS) s = mad(x[off + i], x[off + i], s);
    red[lid] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k = RN_LS / 2; k > 0; k >>= 1) {
        if (lid < k) red[lid] += red[lid + k];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float scale = 1.0f / sqrt(red[0] / (float)n + eps);
    for (int i = lid; i < n; i += RN_LS) out[off + i] = x[off + i] * scale * w[i];
}
