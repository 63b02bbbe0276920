// Matrix products with weights in GGML block layout, and get_rows.
// Prepended by dequant.cl (one weight type per program, W_<TYPE>).
//
// y f32 [n_tok, n_out] = x f32 [n_tok, n_in] @ W[n_out, n_in]^T
//
// mul_mv (n_tok == 1, decode): local size (MV_LS, MV_R): MV_LS work-items share
//   one output row, each streams blocks ib = lid, lid+MV_LS, ... (dot_block:
//   dequantized in registers, scales folded out of the inner products); partial
//   sums are reduced in local memory. MV_LS == 1 (CPU devices) is one row per
//   work-item with no reduction.
// mul_mm (n_tok > 1, prompt): local size (MM_TM): each work-item owns one output
//   row and MM_TN tokens, and each dequantized weight unit (32 values, in registers)
//   is reused for all MM_TN tokens. With MM_LOCAL (GPUs) the group stages a tile
//   x[MM_TN][MM_UC*32] in local memory; without it (CPUs) x is read through the cache.

__kernel void mul_mv(const global uchar *w, const global float *x, global float *y,
                     const int n_in, const int n_out) {
    const int lid = get_local_id(0);
    const int lr = get_local_id(1);
    const int row = get_global_id(1);
    const int nb = n_in / QKV;
#if MV_LS > 1
    local float red[MV_R][MV_LS];
#endif
    float16 acc = (float16)(0.0f);
    float tail = 0.0f;
    if (row < n_out) {
        const global uchar *wr = ROW_PTR(w, row, n_in);
        for (int ib = lid; ib < nb; ib += MV_LS) acc = DOT_BLOCK(wr, ROW_LANE(row), ib, x, acc);
#ifdef W_FLOAT
        for (int i = nb * QKV + lid; i < n_in; i += MV_LS) tail += deq_elem(wr, i) * x[i];
#endif
    }
#if MV_LS > 1
    red[lr][lid] = hsum16(acc) + tail;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = MV_LS / 2; s > 0; s >>= 1) {
        if (lid < s) red[lr][lid] += red[lr][lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0 && row < n_out) y[row] = red[lr][0];
#else
    if (row < n_out) y[row] = hsum16(acc) + tail;
#endif
}

#ifdef HAS_Q8
// mul_mv on 8-bit activations (dotq8.cl): xq char [n_in], xd float2 [n_in / 32]; same
// launch shape as mul_mv.
__kernel void mul_mv_q8(const global uchar *w, const global char *xq, const global float2 *xd,
                        global float *y, const int n_in, const int n_out) {
#ifdef Q8_ROWS16
    const int row = 16 * get_global_id(1);  // one row group of 16 (repacked Q4_0, dotq8.cl)
    if (row < n_out) q4r_rows16(ROW_PTR(w, row, n_in), n_in / QKV, xq, xd, y + row);
#else
    const int lid = get_local_id(0);
    const int lr = get_local_id(1);
    const int row = get_global_id(1);
    const int nb = n_in / QKV;
#if MV_LS > 1
    local float red[MV_R][MV_LS];
#endif
    Q8ACC acc = (Q8ACC)(0.0f);
    if (row < n_out) {
        const global uchar *wr = w + (size_t)row * ROW_BYTES(n_in);
        acc = dotq8_row(wr, nb, xq, xd, lid, acc);
    }
#if MV_LS > 1
    red[lr][lid] = Q8_HSUM(acc);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = MV_LS / 2; s > 0; s >>= 1) {
        if (lid < s) red[lr][lid] += red[lr][lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0 && row < n_out) y[row] = red[lr][0];
#else
    if (row < n_out) y[row] = Q8_HSUM(acc);
#endif
#endif  // Q8_ROWS16
}

// mul_mv_q8 of up to three matrices of one type and one input in one launch (Q/K/V, gate/up):
// global rows 0..n0-1 are w0's into y0, the next n1 w1's into y1, the next n2 w2's into y2
// (n2 = 0 for two). Each row gets exactly mul_mv_q8's sums; same launch shape.
__kernel void mul_mv_q8_3(const global uchar *w0, const global uchar *w1, const global uchar *w2,
                          const global char *xq, const global float2 *xd, global float *y0, global float *y1,
                          global float *y2, const int n_in, const int n0, const int n1, const int n2) {
#ifdef Q8_ROWS16
    const int g = 16 * get_global_id(1);  // row groups of 16 (n0, n1, n2 multiples of 16)
    const bool in0 = g < n0, in1 = !in0 && g < n0 + n1;
    const int row = in0 ? g : in1 ? g - n0 : g - n0 - n1;
    const global uchar *w = in0 ? w0 : in1 ? w1 : w2;
    global float *y = in0 ? y0 : in1 ? y1 : y2;
    if (g < n0 + n1 + n2) q4r_rows16(ROW_PTR(w, row, n_in), n_in / QKV, xq, xd, y + row);
#else
    const int lid = get_local_id(0);
    const int lr = get_local_id(1);
    const int g = get_global_id(1);
    const int nb = n_in / QKV;
    const bool in0 = g < n0, in1 = !in0 && g < n0 + n1;
    const int row = in0 ? g : in1 ? g - n0 : g - n0 - n1;
    const int n_out = in0 ? n0 : in1 ? n1 : n2;
    const global uchar *w = in0 ? w0 : in1 ? w1 : w2;
    global float *y = in0 ? y0 : in1 ? y1 : y2;
#if MV_LS > 1
    local float red[MV_R][MV_LS];
#endif
    Q8ACC acc = (Q8ACC)(0.0f);
    if (row < n_out) {
        const global uchar *wr = w + (size_t)row * ROW_BYTES(n_in);
        acc = dotq8_row(wr, nb, xq, xd, lid, acc);
    }
#if MV_LS > 1
    red[lr][lid] = Q8_HSUM(acc);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = MV_LS / 2; s > 0; s >>= 1) {
        if (lid < s) red[lr][lid] += red[lr][lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0 && row < n_out) y[row] = red[lr][0];
#else
    if (row < n_out) y[row] = Q8_HSUM(acc);
#endif
#endif  // Q8_ROWS16
}

// mul_mm on 8-bit activations for the weight types without a prompt kernel (mul_mm_q8):
// token t of the prompt gets exactly mul_mv_q8's sums for row xq + t * n_in (same blocks per
// work-item, same reduction order), so a prompt's logits are the one-token path's bit for
// bit. Launch (MV_LS, rows, ceil(n_tok / MVT_TN)) with local (MV_LS, MV_R, 1): a group runs
// MVT_TN tokens over its rows, which stay in the cache across them.
#ifndef MVT_TN
#define MVT_TN 16
#endif
__kernel void mul_mvt_q8(const global uchar *w, const global char *xq, const global float2 *xd,
                         global float *y, const int n_in, const int n_out, const int n_tok) {
#ifdef Q8_ROWS16
    const int row = 16 * get_global_id(1);  // one row group of 16 (repacked Q4_0, dotq8.cl)
    const int t0 = get_global_id(2) * MVT_TN;
    if (row < n_out)
        for (int t = t0; t < min(t0 + MVT_TN, n_tok); ++t)
            q4r_rows16(ROW_PTR(w, row, n_in), n_in / QKV, xq + (size_t)t * n_in, xd + (size_t)t * (n_in / 32),
                       y + (size_t)t * n_out + row);
#else
    const int lid = get_local_id(0);
    const int lr = get_local_id(1);
    const int row = get_global_id(1);
    const int t0 = get_global_id(2) * MVT_TN;
    const int t1 = min(t0 + MVT_TN, n_tok);
    const int nb = n_in / QKV;
#if MV_LS > 1
    local float red[MV_R][MV_LS];
#endif
    const global uchar *wr = w + (size_t)min(row, n_out - 1) * ROW_BYTES(n_in);
    for (int t = t0; t < t1; ++t) {
        Q8ACC acc = (Q8ACC)(0.0f);
        if (row < n_out) acc = dotq8_row(wr, nb, xq + (size_t)t * n_in, xd + (size_t)t * (n_in / 32), lid, acc);
#if MV_LS > 1
        red[lr][lid] = Q8_HSUM(acc);
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int s = MV_LS / 2; s > 0; s >>= 1) {
            if (lid < s) red[lr][lid] += red[lr][lid + s];
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        if (lid == 0 && row < n_out) y[(size_t)t * n_out + row] = red[lr][0];
        barrier(CLK_LOCAL_MEM_FENCE);
#else
        if (row < n_out) y[(size_t)t * n_out + row] = Q8_HSUM(acc);
#endif
    }
#endif  // Q8_ROWS16
}
#endif

#define MM_TW (MM_UC * 32)

#if MM_LOCAL
// GPU flavour: the group stages x[MM_TN][MM_UC*32] in local memory for all its rows.
__kernel void mul_mm(const global uchar *w, const global float *x, global float *y,
                     const int n_in, const int n_out, const int n_tok) {
    const int lid = get_local_id(0);
    const int row = get_global_id(0);
    const int t0 = get_group_id(1) * MM_TN;
    const int nu = n_in / 32;
    const int nt = min(MM_TN, n_tok - t0);
    local float xs[MM_TN * MM_TW];
    float16 acc[MM_TN];
    for (int t = 0; t < MM_TN; t++) acc[t] = (float16)(0.0f);
    const global uchar *wr = ROW_PTR(w, min(row, n_out - 1), n_in);

    for (int u0 = 0; u0 < nu; u0 += MM_UC) {
        const int nc = min(MM_UC, nu - u0) * 32;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int i = lid; i < MM_TN * MM_TW; i += MM_TM) {
            const int t = i / MM_TW, c = i % MM_TW;
            xs[i] = (t < nt && c < nc) ? x[(size_t)(t0 + t) * n_in + u0 * 32 + c] : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int uu = 0; uu < nc / 32; uu++) {
            float16 a, b;
            DEQ_UNIT(wr, ROW_LANE(min(row, n_out - 1)), u0 + uu, &a, &b);
            for (int t = 0; t < MM_TN; t++) {
                const local float *xt = xs + t * MM_TW + uu * 32;
                acc[t] = fma(a, vload16(0, xt), acc[t]);
                acc[t] = fma(b, vload16(1, xt), acc[t]);
            }
        }
    }
    if (row >= n_out) return;
    for (int t = 0; t < nt; t++) {
        float s = hsum16(acc[t]);
#ifdef W_FLOAT
        const global float *xt = x + (size_t)(t0 + t) * n_in;
        for (int i = nu * 32; i < n_in; i++) s += deq_elem(wr, i) * xt[i];
#endif
        y[(size_t)(t0 + t) * n_out + row] = s;
    }
}
#else
// CPU flavour: a work-item owns MM_R rows x MM_TN tokens, MM_R * MM_TN float16
// accumulators in registers. Each dequantized weight unit (32 values) is reused for the
// MM_TN tokens and each x unit for the MM_R rows, so x (re-read from L2 by every
// work-item) costs 1 / MM_R of what it does with one row per work-item. No barriers
// (PoCL would spill the accumulators to per-work-item context arrays across them).
// Rows past n_out re-read the last row, tokens past n_tok the last token.
__kernel void mul_mm(const global uchar *w, const global float *x, global float *y,
                     const int n_in, const int n_out, const int n_tok) {
    const int r0 = get_global_id(0) * MM_R;
    const int t0 = get_group_id(1) * MM_TN;
    const int nu = n_in / 32;
    const int nt = min(MM_TN, n_tok - t0);
    if (r0 >= n_out) return;
    float16 acc[MM_R][MM_TN];
    const global float *xr[MM_TN];
    const global uchar *wr[MM_R];
#pragma unroll
    for (int t = 0; t < MM_TN; t++) xr[t] = x + (size_t)(t0 + min(t, nt - 1)) * n_in;
#pragma unroll
    for (int r = 0; r < MM_R; r++) {
        wr[r] = ROW_PTR(w, min(r0 + r, n_out - 1), n_in);
#pragma unroll
        for (int t = 0; t < MM_TN; t++) acc[r][t] = (float16)(0.0f);
    }
#if defined(SB_UNITS)
    // K-quant super-blocks (SB_UNITS = 8 units): scales decoded once per row, units unrolled
    for (int ib = 0; ib < nu / SB_UNITS; ib++) {
        float16 scv[MM_R];
#pragma unroll
        for (int r = 0; r < MM_R; r++) scv[r] = block_scales(wr[r], ib);
#pragma unroll
        for (int s = 0; s < SB_UNITS; s++) {
            const int u = ib * SB_UNITS + s;
            float16 a[MM_R], b[MM_R];
#pragma unroll
            for (int r = 0; r < MM_R; r++) deq_sub(wr[r], ib, s, scv[r], &a[r], &b[r]);
#pragma unroll
            for (int t = 0; t < MM_TN; t++) {
                const float16 xa = vload16(2 * u, xr[t]), xb = vload16(2 * u + 1, xr[t]);
#pragma unroll
                for (int r = 0; r < MM_R; r++) acc[r][t] = fma(b[r], xb, fma(a[r], xa, acc[r][t]));
            }
        }
    }
#else
    for (int u = 0; u < nu; u++) {
        float16 a[MM_R], b[MM_R];
#pragma unroll
        for (int r = 0; r < MM_R; r++) DEQ_UNIT(wr[r], ROW_LANE(min(r0 + r, n_out - 1)), u, &a[r], &b[r]);
#pragma unroll
        for (int t = 0; t < MM_TN; t++) {
            const float16 xa = vload16(2 * u, xr[t]), xb = vload16(2 * u + 1, xr[t]);
#pragma unroll
            for (int r = 0; r < MM_R; r++) acc[r][t] = fma(b[r], xb, fma(a[r], xa, acc[r][t]));
        }
    }
#endif
    for (int r = 0; r < MM_R && r0 + r < n_out; r++) {
        for (int t = 0; t < nt; t++) {
            float s = hsum16(acc[r][t]);
#ifdef W_FLOAT
            const global float *xt = x + (size_t)(t0 + t) * n_in;
            for (int i = nu * 32; i < n_in; i++) s += deq_elem(wr[r], i) * xt[i];
#endif
            y[(size_t)(t0 + t) * n_out + r0 + r] = s;
        }
    }
}
#endif

// out f32 [n_ids, n_in]: out[i] = dequantize(table[ids[i]]); global (n_in/32 (+1 for float tails), n_ids).
// ids are clamped to [0, n_rows) so a bad id cannot read outside the table.
__kernel void get_rows(const global uchar *w, const global int *ids, global float *out,
                       const int n_in, const int n_rows, const int n_ids) {
    const int u = get_global_id(0);
    const int i = get_global_id(1);
    const int nu = n_in / 32;
    if (i >= n_ids) return;
    const int id = clamp(ids[i], 0, n_rows - 1);
    const global uchar *wr = ROW_PTR(w, id, n_in);
    global float *o = out + (size_t)i * n_in;
    if (u < nu) {
        float16 a, b;
        DEQ_UNIT(wr, ROW_LANE(id), u, &a, &b);
        vstore16(a, 2 * u, o);
        vstore16(b, 2 * u + 1, o);
    }
#ifdef W_FLOAT
    else if (u == nu) {
        for (int k = nu * 32; k < n_in; k++) o[k] = deq_elem(wr, k);
    }
#endif
}

// ggml_mul_mat_id, one output value per work-item: slot j of row i is row rs = i * k + j of
// y f32 [n_rows * k, n_out] = x_rs @ W[ids[rs]]^T, W [n_expert, n_out, n_in] (expert e's rows follow
// each other), x f32 [n_rows, n_in] (per_slot 0: one input per row, its k slots share it) or
// [n_rows * k, n_in]; ids i32 [n_rows * k] clamped to [0, n_expert). global (n_out, n_rows * k).
// Only the selected experts' rows are read; rows are not grouped by expert (one mat-vec per slot).
__kernel void mul_mv_id(const global uchar *w, const global float *x, const global int *ids, global float *y,
                        const int n_in, const int n_out, const int k, const int per_slot, const int n_expert) {
    const int o = get_global_id(0);
    const int rs = get_global_id(1);
    if (o >= n_out) return;
    const int e = clamp(ids[rs], 0, n_expert - 1);
    const global uchar *wr = ROW_PTR(w, e * n_out + o, n_in);
    const global float *xr = x + (size_t)(per_slot ? rs : rs / k) * n_in;
    const int nb = n_in / QKV;
    float16 acc = (float16)(0.0f);
    float tail = 0.0f;
    for (int ib = 0; ib < nb; ib++) acc = DOT_BLOCK(wr, ROW_LANE(e * n_out + o), ib, xr, acc);
#ifdef W_FLOAT
    for (int i = nb * QKV; i < n_in; i++) tail += deq_elem(wr, i) * xr[i];
#endif
    y[(size_t)rs * n_out + o] = hsum16(acc) + tail;
}

// The prompt form of mul_mv_id: the slots routed to each expert are processed together, so each
// weight block is read once per MMID_TN slots instead of once per slot. offs int [n_expert + 1]
// and order int [n_slots] (from moe_group: the slots of expert e are order[offs[e] .. offs[e+1]-1]);
// global (n_out, n_expert). Every slot gets exactly mul_mv_id's value, bit for bit: the same
// DOT_BLOCK per block in the same order into its own float16 accumulator, the same hsum16 + tail
// (the folded dot_blocks of Q8_0, Q4_0 and the K-quants round otherwise than deq_unit + fma; the
// weight decode inside DOT_BLOCK does not depend on the slot and is hoisted out of the slot loop).
#define MMID_TN 8
__kernel void mul_mm_id(const global uchar *w, const global float *x, const global int *offs,
                        const global int *order, global float *y, const int n_in, const int n_out, const int k,
                        const int per_slot) {
    const int o = get_global_id(0);
    const int e = get_global_id(1);
    if (o >= n_out) return;
    const int s0 = offs[e], s1 = offs[e + 1];
    const global uchar *wr = ROW_PTR(w, e * n_out + o, n_in);
    const int nb = n_in / QKV;
    for (int c0 = s0; c0 < s1; c0 += MMID_TN) {
        const int cnt = min(MMID_TN, s1 - c0);
        const global float *xr[MMID_TN];
        float16 acc[MMID_TN];
        for (int t = 0; t < MMID_TN; t++) {
            const int rs = order[c0 + min(t, cnt - 1)];
            xr[t] = x + (size_t)(per_slot ? rs : rs / k) * n_in;
            acc[t] = (float16)(0.0f);
        }
        for (int ib = 0; ib < nb; ib++)
            for (int t = 0; t < cnt; t++) acc[t] = DOT_BLOCK(wr, ROW_LANE(e * n_out + o), ib, xr[t], acc[t]);
        for (int t = 0; t < cnt; t++) {
            float tail = 0.0f;
#ifdef W_FLOAT
            for (int i = nb * QKV; i < n_in; i++) tail += deq_elem(wr, i) * xr[t][i];
#endif
            y[(size_t)order[c0 + t] * n_out + o] = hsum16(acc[t]) + tail;
        }
    }
}
