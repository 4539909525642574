/* One decoding step of the serving engine (attnlab/inference/engine.py) for B rows at once, every layer in one
 * call: the batched, paged sibling of `llama_decode_step` (ggml_blocks.c). Part of attnlab; built with the
 * other kernels and called through the door of attnlab/nn/kernels.py (`call_bound`: the pointer table is
 * bound once, inference/block_step.py).
 *
 * Why: through the modules a decoding step of SmolLM2 is ~30 x 15 operations dispatched from Python, and at
 * a few rows (the end of a serving run, where the longest requests finish) that dispatch cost more than the
 * arithmetic: a one-row engine step took ~39 ms where `generate`'s one C call per token takes ~15. Here the
 * products (ggml_matmul_cols_par) and the attention (paged_decode_attention_par) keep their thread split;
 * the norms, rotary, SwiGLU and residuals of B rows are a few thousand flops a layer, done in place.
 *
 * Same math as the modules, fp32 (pre-RMSNorm, "rotate half" rotary, grouped-query attention, SwiGLU):
 *   h = x + W_o attn(rope(W_q n1), rope(W_k n1), W_v n1),  n1 = rmsnorm(x)
 *   x' = h + W_down (silu(W_gate n2) * W_up n2),            n2 = rmsnorm(h)
 * x (B, hidden) in place. ptrs: 11 per layer as llama_decode_step's (attn_norm, ffn_norm, the blocks of
 * q, k, v, o, gate, up, down, then the layer's key and value slots, each (S, kv_heads, hd), fp32 or with
 * f16 = 1 fp16: the new keys and values rounded to nearest even as torch's cast does; F16C only); kinds: 7
 * GGML types per layer. Row b is at position positions[b] (< cap; cos / sin are (cap, hd) tables), writes
 * its new key and value to slot write[b] and attends to slots[offsets[b] .. offsets[b+1]) (its own slot
 * among them). scratch: B * (2 * hidden + 2 * heads * hd + 2 * kv_heads * hd + 2 * ffn) floats.
 * Returns -1 (before writing anything) for a bad position, slot or offset, or the kernels' status.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

int ggml_matmul_cols_par(int kind, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *out,
                         int64_t start, int64_t end, int parts);
int paged_decode_attention_par(const float *q, const float *keys, const float *values, int64_t S, int64_t B,
                               int64_t Hq, int64_t Hk, int64_t D, const int64_t *slots, const int64_t *offsets,
                               int64_t N, float scale, float *out, int64_t start, int64_t end, int parts);
int paged_decode_attention_f16_par(const float *q, const uint16_t *keys, const uint16_t *values, int64_t S,
                                   int64_t B, int64_t Hq, int64_t Hk, int64_t D, const int64_t *slots,
                                   const int64_t *offsets, int64_t N, float scale, float *out, int64_t start,
                                   int64_t end, int parts);

/* one row each, from ggml_blocks.c (llama_decode_step's): RMSNorm, and "rotate half" rotary (the layout of
 * Hugging Face's LLaMA: pairs (i, i + hd/2) of each head) */
void attnlab_rmsnorm(const float *x, const float *w, float eps, int n, float *out);
void attnlab_rope(float *v, int nh, int hd, const float *cs, const float *sn);

/* n floats into the pool's slot: as they are, or as fp16 (f16 = 1, only where F16C converts them) */
static int store(void *slot, const float *src, int n, int f16) {
    if (!f16) {
        memcpy(slot, src, n * sizeof(float));
        return 0;
    }
#if defined(__F16C__)
    uint16_t *h = slot;
    for (int i = 0; i < n; i++) h[i] = _cvtss_sh(src[i], 0); /* 0: round to nearest even */
    return 0;
#else
    return -1;
#endif
}

static int product(int kind, const float *x, int64_t B, int64_t K, const void *w, int64_t N, float *out, int parts) {
    return ggml_matmul_cols_par(kind, x, B, K, (const uint8_t *)w, N, out, 0, N, parts);
}

int paged_decode_layers(int n_layers, int64_t B, float *x, void **ptrs, const int *kinds, int hidden, int heads,
                        int kv_heads, int hd, int ffn, float eps, float scale, int64_t S, int64_t cap,
                        const int64_t *positions, const float *cos, const float *sin, const int64_t *write,
                        const int64_t *slots, const int64_t *offsets, int64_t nslots, int f16, float *scratch,
                        int parts) {
#if !defined(__F16C__)
    if (f16) return -1;
#endif
    if (B < 1 || n_layers < 0 || kv_heads < 1 || heads % kv_heads || hd % 2 || offsets[0] != 0 || offsets[B] != nslots)
        return -1;
    for (int64_t b = 0; b < B; b++)
        if (positions[b] < 0 || positions[b] >= cap || write[b] < 0 || write[b] >= S || offsets[b + 1] <= offsets[b])
            return -1;
    for (int64_t i = 0; i < nslots; i++)
        if (slots[i] < 0 || slots[i] >= S) return -1;
    const int qn = heads * hd, kn = kv_heads * hd;
    float *n1 = scratch, *q = n1 + B * hidden, *k = q + B * qn, *v = k + B * kn, *att = v + B * kn,
          *o = att + B * qn, *g = o + B * hidden, *u = g + B * ffn;
    for (int l = 0; l < n_layers; l++) {
        void **P = ptrs + 11 * l;
        const int *K = kinds + 7 * l;
        char *kc = P[9], *vc = P[10];
        const size_t row = (size_t)kn * (f16 ? 2 : 4);
        for (int64_t b = 0; b < B; b++) attnlab_rmsnorm(x + b * hidden, (const float *)P[0], eps, hidden, n1 + b * hidden);
        int rc = product(K[0], n1, B, hidden, P[2], qn, q, parts);
        if (!rc) rc = product(K[1], n1, B, hidden, P[3], kn, k, parts);
        if (!rc) rc = product(K[2], n1, B, hidden, P[4], kn, v, parts);
        if (rc) return rc;
        for (int64_t b = 0; b < B; b++) {
            const float *cs = cos + positions[b] * hd, *sn = sin + positions[b] * hd;
            attnlab_rope(q + b * qn, heads, hd, cs, sn);
            attnlab_rope(k + b * kn, kv_heads, hd, cs, sn);
            if (store(kc + write[b] * row, k + b * kn, kn, f16) || store(vc + write[b] * row, v + b * kn, kn, f16))
                return -1;
        }
        rc = f16 ? paged_decode_attention_f16_par(q, (const uint16_t *)kc, (const uint16_t *)vc, S, B, heads, kv_heads,
                                                  hd, slots, offsets, nslots, scale, att, 0, B * kv_heads, parts)
                 : paged_decode_attention_par(q, (const float *)kc, (const float *)vc, S, B, heads, kv_heads, hd,
                                              slots, offsets, nslots, scale, att, 0, B * kv_heads, parts);
        if (!rc) rc = product(K[3], att, B, qn, P[5], hidden, o, parts);
        if (rc) return rc;
        for (int64_t i = 0; i < B * hidden; i++) x[i] += o[i];
        for (int64_t b = 0; b < B; b++) attnlab_rmsnorm(x + b * hidden, (const float *)P[1], eps, hidden, n1 + b * hidden);
        rc = product(K[4], n1, B, hidden, P[6], ffn, g, parts);
        if (!rc) rc = product(K[5], n1, B, hidden, P[7], ffn, u, parts);
        if (rc) return rc;
        for (int64_t i = 0; i < B * ffn; i++) g[i] = g[i] / (1.f + expf(-g[i])) * u[i];
        rc = product(K[6], g, B, ffn, P[8], hidden, o, parts);
        if (rc) return rc;
        for (int64_t i = 0; i < B * hidden; i++) x[i] += o[i];
    }
    return 0;
}
