/* The builtin engine's CPU kernels: decode attention that reads each sequence only up to its own length
 * (writing the iteration's new keys and values into the cache first), RMSNorm in one pass, rotary
 * embedding turning the packed queries and keys in place, the gated MLP activation silu(gate) * up, and
 * one decode step's sampling (processed logprobs, the seeded inverse-CDF draw).
 *
 * float32 arithmetic (the KV cache may also hold float16 or bfloat16, converted to float32 as it is read and
 * rounded to nearest-even as the new keys and values are written, as torch converts), no torch headers:
 * rft_runtime.serve.native builds this file at run time with the machine's C compiler (GCC or Clang: it uses their portable vector extension, which becomes AVX, SSE or
 * NEON instructions) and calls it through ctypes, which releases the GIL. Built with OpenMP, a large
 * attention call splits its (row, KV head) pairs over `threads` threads (torch's intra-op count). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

typedef float v8 __attribute__((vector_size(32)));

static inline v8 load8(const float *p)
{
    v8 x;
    memcpy(&x, p, sizeof x);
    return x;
}

static inline void store8(float *p, v8 x) { memcpy(p, &x, sizeof x); }

/* The KV cache's element types: KV_F32 (float), KV_F16 (IEEE half: F16C's vcvtph2ps where -march=native has
 * it, else the compiler's _Float16, else the bit manipulations below) and KV_BF16 (bfloat16: the upper 16 bits
 * of a float). The attention's helpers take the kind as a constant argument and are inlined, so each kind
 * gets its own loops and no branch is left in them. */
enum { KV_F32 = 0, KV_F16 = 1, KV_BF16 = 2 };
/* RFT_PORTABLE_HALF (tests define it): the bit manipulations even where the compiler converts itself */
#if defined(__FLT16_MAX__) && !defined(RFT_PORTABLE_HALF) /* GCC 12+, Clang: the type; GCC 11 has none on x86 */
#define HAVE_FLOAT16 1
typedef _Float16 v8h __attribute__((vector_size(16)));
#else
#define HAVE_FLOAT16 0
#endif
typedef uint16_t v8u16 __attribute__((vector_size(16)));
typedef uint32_t v8u32 __attribute__((vector_size(32)));

/* IEEE half -> float, exactly (subnormals normalised, infinities and NaN kept). */
static inline float half_to_float(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, u;
    if (exp == 0x1fu) {
        u = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {
        u = sign;
    } else { /* mant x 2^-24: shift its leading 1 to bit 10 */
        uint32_t e = 0;
        while (!(mant & 0x400u)) {
            mant <<= 1;
            e++;
        }
        u = sign | ((113u - e) << 23) | ((mant & 0x3ffu) << 13);
    }
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* float -> IEEE half, rounding to nearest-even (65520 and above become infinity; a NaN a quiet NaN). */
static inline uint16_t float_to_half(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return sign | 0x7e00u;
    if (a >= 0x477ff000u)
        return sign | 0x7c00u;
    if (a >= 0x38800000u) { /* a normal half: rebias the exponent (127 - 15), round the 13 bits dropped */
        const uint32_t r = a - 0x38000000u;
        return sign | (uint16_t)((r + 0xfffu + ((r >> 13) & 1u)) >> 13);
    }
    float f; /* a subnormal half: a multiple of 2^-24, rounded to nearest-even (1024 is the smallest normal) */
    memcpy(&f, &a, sizeof f);
    return sign | (uint16_t)nearbyintf(f * 16777216.0f);
}

static inline __attribute__((always_inline)) size_t kv_size(const int kind)
{
    return kind == KV_F32 ? sizeof(float) : sizeof(uint16_t);
}

/* Eight cache elements from element i of p, as floats. */
static inline __attribute__((always_inline)) v8 kv_load8(const void *p, int64_t i, const int kind)
{
    if (kind == KV_F16) {
#if defined(__F16C__) && !defined(RFT_PORTABLE_HALF) /* GCC 12 turns __builtin_convertvector of a half vector
                                                       into eight scalar conversions */
        const __m256 f = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
        v8 x;
        memcpy(&x, &f, sizeof x);
        return x;
#elif HAVE_FLOAT16
        v8h h;
        memcpy(&h, (const uint16_t *)p + i, sizeof h);
        return __builtin_convertvector(h, v8);
#else
        v8 x;
        for (int c = 0; c < 8; c++)
            x[c] = half_to_float(((const uint16_t *)p)[i + c]);
        return x;
#endif
    }
    if (kind == KV_BF16) {
#if defined(__AVX2__) /* as above: widen the eight halves in one instruction, not eight */
        const __m256i u = _mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i))), 16);
#else
        v8u16 h;
        memcpy(&h, (const uint16_t *)p + i, sizeof h);
        const v8u32 u = __builtin_convertvector(h, v8u32) << 16;
#endif
        v8 x;
        memcpy(&x, &u, sizeof x);
        return x;
    }
    return load8((const float *)p + i);
}

static inline __attribute__((always_inline)) float kv_load1(const void *p, int64_t i, const int kind)
{
    if (kind == KV_F16)
#if HAVE_FLOAT16
        return (float)((const _Float16 *)p)[i];
#else
        return half_to_float(((const uint16_t *)p)[i]);
#endif
    if (kind == KV_BF16) {
        const uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
        float x;
        memcpy(&x, &u, sizeof x);
        return x;
    }
    return ((const float *)p)[i];
}

/* float -> bfloat16, rounding to nearest-even; a NaN stays a (quiet) NaN. */
static inline uint16_t to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* n floats of src into the cache at element i of dst, converted to its kind. */
static inline __attribute__((always_inline)) void kv_store(void *dst, int64_t i, const float *src, int64_t n,
                                                            const int kind)
{
    if (kind == KV_F16) {
#if HAVE_FLOAT16
        _Float16 *d = (_Float16 *)dst + i;
        for (int64_t t = 0; t < n; t++)
            d[t] = (_Float16)src[t];
#else
        uint16_t *d = (uint16_t *)dst + i;
        for (int64_t t = 0; t < n; t++)
            d[t] = float_to_half(src[t]);
#endif
    } else if (kind == KV_BF16) {
        uint16_t *d = (uint16_t *)dst + i;
        for (int64_t t = 0; t < n; t++)
            d[t] = to_bf16(src[t]);
    } else {
        memcpy((float *)dst + i, src, sizeof(float) * (size_t)n);
    }
}

static inline float sum8(v8 x)
{
    return ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7]));
}

/* e^x for x <= 0 (softmax subtracts the maximum first): x = n ln2 + r, |r| <= ln2 / 2, e^r by its
 * degree-7 Taylor polynomial, 2^n by building the float's exponent. x below -87
 * counts as -87 (e^-87 is 1.6e-38: nothing beside the maximum's 1, and no subnormal). The same steps
 * hold for x up to 88 (2^127 is still a float), which exp_clamped relies on. */
static inline float exp_nonpositive(float x)
{
    x = x < -87.0f ? -87.0f : x;
    const float n = __builtin_roundf(x * 1.44269504088896341f);
    const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723212e-6f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union { uint32_t u; float f; } two_n = { .u = (uint32_t)((int32_t)n + 127) << 23 };
    return p * two_n.f;
}

/* e^x for any x: x is clamped to [-87, 88] (e^88 is 1.7e38, below float's largest; e^-87 is 1.6e-38), then
 * as exp_nonpositive. */
static inline float exp_clamped(float x)
{
    x = x > 88.0f ? 88.0f : x;
    return exp_nonpositive(x);
}

/* s[t] <- e^(s[t] - max s) over [0, len); returns their sum (the caller divides once, at the end). */
static float exp_shifted(float *restrict s, int64_t len)
{
    float top = -INFINITY, total = 0.0f;
#pragma omp simd reduction(max : top)
    for (int64_t t = 0; t < len; t++)
        top = s[t] > top ? s[t] : top;
#pragma omp simd reduction(+ : total)
    for (int64_t t = 0; t < len; t++) {
        s[t] = exp_nonpositive(s[t] - top);
        total += s[t];
    }
    return total;
}

/* The sums of 8 vectors at once, out[i] = sum of x_i's lanes: three rounds of pairing lanes and adding, 21
 * operations where eight sum8 take about 48. */
#if defined(__clang__)
#define SHUFFLE(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
typedef int32_t v8i __attribute__((vector_size(32)));
#define SHUFFLE(a, b, ...) __builtin_shuffle(a, b, (v8i){__VA_ARGS__})
#endif

static inline v8 pair_sums(v8 x, v8 y)
{
    return SHUFFLE(x, y, 0, 8, 2, 10, 4, 12, 6, 14) + SHUFFLE(x, y, 1, 9, 3, 11, 5, 13, 7, 15);
}

static inline v8 sums8(const v8 *x)
{
    /* a_i: [x_2i lanes 0+1, x_2i+1 lanes 0+1, x_2i 2+3, x_2i+1 2+3 | the same for lanes 4-7] */
    const v8 a0 = pair_sums(x[0], x[1]), a1 = pair_sums(x[2], x[3]);
    const v8 a2 = pair_sums(x[4], x[5]), a3 = pair_sums(x[6], x[7]);
    /* b0: [x0 0-3, x1 0-3, x2 0-3, x3 0-3 | x0 4-7, x1 4-7, x2 4-7, x3 4-7], b1 likewise for x4-x7 */
    const v8 b0 = SHUFFLE(a0, a1, 0, 1, 8, 9, 4, 5, 12, 13) + SHUFFLE(a0, a1, 2, 3, 10, 11, 6, 7, 14, 15);
    const v8 b1 = SHUFFLE(a2, a3, 0, 1, 8, 9, 4, 5, 12, 13) + SHUFFLE(a2, a3, 2, 3, 10, 11, 6, 7, 14, 15);
    return SHUFFLE(b0, b1, 0, 1, 2, 3, 8, 9, 10, 11) + SHUFFLE(b0, b1, 4, 5, 6, 7, 12, 13, 14, 15);
}

/* The (row, KV head) pair a thread attends next, whose keys and values it prefetches while it attends this one:
 * each block of this pair's columns read brings the same columns of the next pair's into the core's cache
 * (the L2; `k` NULL: none). The hardware prefetcher follows a stream only a few lines ahead, which a kernel
 * doing this much arithmetic per byte outruns: without it a batch's caches larger than the last-level cache
 * came at half the memory's bandwidth. Where a call's rows are too long for that (see l2_bytes), the "next
 * pair" is the pair itself, PREFETCH_AHEAD columns on: each block read brings the columns that far ahead of
 * it, up to the row's length. */
typedef struct {
    const char *k, *v; /* the next pair's keys and values, NULL for none */
    int64_t len;       /* its length (columns) */
} next_pair;

#define PREFETCH_LINE 64
#define PREFETCH_AHEAD 32 /* columns: 8 KiB ahead in a row of 64 floats */

/* The core's L2 in bytes (sysconf where the C library knows it; else 512 KiB): a pair is prefetched only while
 * four times its keys (this pair's keys and values, then the next pair's, between a column's prefetch and its
 * use) fit, so that the prefetched lines are still there when read, not fetched twice. */
static int64_t l2_bytes(void)
{
    static int64_t size = 0;
    if (size == 0) {
        long v = -1;
#ifdef _SC_LEVEL2_CACHE_SIZE
        v = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
        size = v > 0 ? v : 512 * 1024;
    }
    return size;
}

/* Prefetch columns [t0, t1) (clamped to its length) of the next pair's keys or values (`base`), each column
 * `hd` elements of `es` bytes. */
static inline __attribute__((always_inline)) void prefetch_columns(const char *base, int64_t len, int64_t t0,
                                                                    int64_t t1, int64_t hd, size_t es)
{
    if (base == NULL || t0 >= len)
        return;
    const int64_t end = (t1 < len ? t1 : len) * hd * (int64_t)es;
    for (int64_t b = t0 * hd * (int64_t)es; b < end; b += PREFETCH_LINE)
        __builtin_prefetch(base + b, 0, 1);
}

/* scores[j * len + t] = scale * q_j . k_t for G query heads j0 .. j0 + G - 1 (G 1 or 2, a constant), eight
 * columns at a time: each key vector is loaded (and converted) once for the G heads, whose 8 G sums stay in
 * registers (16 for a pair: with the 8 keys, what 32 vector registers hold). */
static inline __attribute__((always_inline)) void scores_block(const float *restrict q, const void *restrict k,
                                                                int64_t len, int64_t hd, float scale,
                                                                float *restrict scores, next_pair next,
                                                                const int G, const int kind)
{
    int64_t t = 0;
    for (; t + 8 <= len; t += 8) {
        const int64_t kt = t * hd;
        prefetch_columns(next.k, next.len, t, t + 8, hd, kv_size(kind));
        v8 a[2][8];
        for (int j = 0; j < G; j++)
            for (int c = 0; c < 8; c++)
                a[j][c] = (v8){0};
        for (int64_t d = 0; d < hd; d += 8) {
            v8 x[8];
            for (int c = 0; c < 8; c++)
                x[c] = kv_load8(k, kt + c * hd + d, kind);
            for (int j = 0; j < G; j++) {
                const v8 qd = load8(q + j * hd + d);
                for (int c = 0; c < 8; c++)
                    a[j][c] += qd * x[c];
            }
        }
        for (int j = 0; j < G; j++)
            store8(scores + j * len + t, sums8(a[j]) * scale);
    }
    prefetch_columns(next.k, next.len, t, next.len, hd, kv_size(kind)); /* and the rest of its columns */
    for (; t < len; t++) {
        for (int j = 0; j < G; j++) {
            v8 a = {0};
            for (int64_t d = 0; d < hd; d += 8)
                a += load8(q + j * hd + d) * kv_load8(k, t * hd + d, kind);
            scores[j * len + t] = sum8(a) * scale;
        }
    }
}

/* out_j[0, 8 nb) = inv[j] * sum_t p_j[t] v_t[0, 8 nb) for G query heads (p_j = p + j * len, out_j = out + j *
 * hd) in one pass over the values, v_t = element t * hd of v (of `kind`). Inlined with G, nb and kind
 * constants, the G nb sums stay in registers (an array indexed up to a run-time bound is kept in memory:
 * loaded and stored for every t). */
static inline __attribute__((always_inline)) void weighted_block(const float *restrict p, const void *restrict v,
                                                                 int64_t len, int64_t hd, const float *inv,
                                                                 float *restrict out, next_pair next, const int G,
                                                                 const int nb, const int kind)
{
    v8 o[2][8];
    for (int j = 0; j < G; j++)
        for (int b = 0; b < nb; b++)
            o[j][b] = (v8){0};
    for (int64_t t = 0; t < len; t++) {
        v8 x[8];
        prefetch_columns(next.v, next.len, t, t + 1, hd, kv_size(kind));
        for (int b = 0; b < nb; b++)
            x[b] = kv_load8(v, t * hd + 8 * b, kind);
        for (int j = 0; j < G; j++) {
            const v8 w = (v8){0} + p[j * len + t];
            for (int b = 0; b < nb; b++)
                o[j][b] += w * x[b];
        }
    }
    prefetch_columns(next.v, next.len, len, next.len, hd, kv_size(kind));
    for (int j = 0; j < G; j++)
        for (int b = 0; b < nb; b++)
            store8(out + j * hd + 8 * b, o[j][b] * inv[j]);
}

/* The weighted values of G (1 or 2) query heads, in blocks of 8 vectors of each head, then one of the rest
 * (v: the values of `kind` from element 0 of the head). */
static inline __attribute__((always_inline)) void weighted_values(const float *restrict p, const void *restrict v,
                                                                  int64_t len, int64_t hd, const float *inv,
                                                                  float *restrict out, next_pair next, const int G,
                                                                  const int kind)
{
    const char *vb = v;
    const size_t es = kv_size(kind);
    int64_t d0 = 0;
    for (; d0 + 64 <= hd; d0 += 64, next.v = NULL) /* the first pass over the columns prefetches */
        weighted_block(p, vb + d0 * es, len, hd, inv, out + d0, next, G, 8, kind);
    switch ((hd - d0) / 8) {
    case 1: weighted_block(p, vb + d0 * es, len, hd, inv, out + d0, next, G, 1, kind); break;
    case 2: weighted_block(p, vb + d0 * es, len, hd, inv, out + d0, next, G, 2, kind); break;
    case 3: weighted_block(p, vb + d0 * es, len, hd, inv, out + d0, next, G, 3, kind); break;
    case 4: weighted_block(p, vb + d0 * es, len, hd, inv, out + d0, next, G, 4, kind); break;
    case 5: weighted_block(p, vb + d0 * es, len, hd, inv, out + d0, next, G, 5, kind); break;
    case 6: weighted_block(p, vb + d0 * es, len, hd, inv, out + d0, next, G, 6, kind); break;
    case 7: weighted_block(p, vb + d0 * es, len, hd, inv, out + d0, next, G, 7, kind); break;
    default: break;
    }
}

/* A pair of query heads in one pass over the values: 16 sums and 8 values in registers, which only 32
 * vector registers hold (AVX-512VL); with 16 (AVX2) they would spill, and each head takes its own pass. */
#if defined(__AVX512VL__)
#define PAIRED 1
#else
#define PAIRED 0
#endif

/* Scores, softmax and weighted values of one KV head's `group` query heads (k, v: the head's cache, of
 * `kind`). */
static inline __attribute__((always_inline)) void head_vec(const float *q, float *out, const void *k, const void *v,
                                                            int64_t len, int64_t group, int64_t hd, float scale,
                                                            float *scores, next_pair next, const int kind)
{
    /* the first pass over the keys prefetches the next pair's keys, the first over the values its values */
    next_pair nk = {next.k, NULL, next.len}, nv = {NULL, next.v, next.len};
    const next_pair none = {NULL, NULL, 0};
    int64_t j = 0;
#if PAIRED
    for (; j + 2 <= group; j += 2, nk = none)
        scores_block(q + j * hd, k, len, hd, scale, scores + j * len, nk, 2, kind);
#endif
    for (; j < group; j++, nk = none)
        scores_block(q + j * hd, k, len, hd, scale, scores + j * len, nk, 1, kind);
    j = 0;
#if PAIRED
    for (; j + 2 <= group; j += 2, nv = none) {
        float *s = scores + j * len;
        const float inv[2] = {1.0f / exp_shifted(s, len), 1.0f / exp_shifted(s + len, len)};
        weighted_values(s, v, len, hd, inv, out + j * hd, nv, 2, kind);
    }
#endif
    for (; j < group; j++, nv = none) {
        float *s = scores + j * len;
        const float inv[1] = {1.0f / exp_shifted(s, len)};
        weighted_values(s, v, len, hd, inv, out + j * hd, nv, 1, kind);
    }
}

static inline __attribute__((always_inline)) void head_scalar(const float *q, float *out, const void *k,
                                                               const void *v, int64_t len, int64_t group, int64_t hd,
                                                               float scale, float *scores, const int kind)
{
    for (int64_t j = 0; j < group; j++) {
        const float *qj = q + j * hd;
        float *s = scores + j * len, *oj = out + j * hd;
        for (int64_t t = 0; t < len; t++) {
            float acc = 0.0f;
            for (int64_t d = 0; d < hd; d++)
                acc += qj[d] * kv_load1(k, t * hd + d, kind);
            s[t] = acc * scale;
        }
        const float inv = 1.0f / exp_shifted(s, len);
        for (int64_t d = 0; d < hd; d++)
            oj[d] = 0.0f;
        for (int64_t t = 0; t < len; t++)
            for (int64_t d = 0; d < hd; d++)
                oj[d] += s[t] * kv_load1(v, t * hd + d, kind);
        for (int64_t d = 0; d < hd; d++)
            oj[d] *= inv;
    }
}

/* One (row, KV head) pair of rft_decode_attention, its cache of `kind`: the new key and value written,
 * then the heads attended. */
static inline __attribute__((always_inline)) void attend_pair(const float *q, float *out, void *keys, void *values,
                                                               const float *k_new, const float *v_new, int64_t base,
                                                               int64_t len, int64_t group, int64_t hd, float scale,
                                                               float *scores, int vector, next_pair next,
                                                               const int kind)
{
    const size_t es = kv_size(kind);
    kv_store(keys, base + (len - 1) * hd, k_new, hd, kind);
    kv_store(values, base + (len - 1) * hd, v_new, hd, kind);
    const char *k = (const char *)keys + base * es, *v = (const char *)values + base * es;
    if (vector)
        head_vec(q, out, k, v, len, group, hd, scale, scores, next, kind);
    else
        head_scalar(q, out, k, v, len, group, hd, scale, scores, kind);
}

/* Decode attention over a per-slot KV cache, each row read only up to its own length (varlen).
 *
 * One query token per decoding sequence ("row"). Row i's keys and values are columns [0, lengths[i]) of
 * slot slots[i] in the cache, laid out [slot][kv_head][column][head_dim] of `kv_kind` elements (KV_F32,
 * KV_F16 or KV_BF16; slot_stride and head_stride are the cache's strides in elements, so its column
 * capacity can be anything). Its own new key and value (kv_heads vectors of head_dim floats each, at
 * k_new + i * kn_row + h * kn_head, likewise v_new) are first written into column lengths[i] - 1,
 * converted to the cache's kind. Queries and the output are float32 [row][kv_head][group][head_dim], the
 * `group` query heads sharing one KV head (grouped-query attention) side by side; row i of q starts
 * q_row_stride floats after row i - 1, its heads contiguous; the output is contiguous:
 *
 *     out[i,h,j] = softmax_t(scale * q[i,h,j] . K[slot_i,h,t]) . V[slot_i,h,t],   t < lengths[i]
 *
 * with K and V read as float32 and every sum in float32. Head sizes that are a multiple of 8 take the
 * vector path, others a scalar one. exp() is a polynomial the compiler vectorises (relative error at most
 * 1.1e-7 against double-precision exp on [-87, 0], about one float ulp). Returns 0; -1 when a thread could
 * not allocate its scratch; -2, having touched nothing, when a slot is not in [0, n_slots), a length not in
 * [1, capacity] or kv_kind unknown. */
int rft_decode_attention(const float *q, int64_t q_row_stride, float *out, void *keys, void *values,
                         const float *k_new, int64_t kn_row, int64_t kn_head, const float *v_new, int64_t vn_row,
                         int64_t vn_head, const int64_t *slots, const int64_t *lengths, int64_t rows,
                         int64_t kv_heads, int64_t group, int64_t head_dim, int64_t slot_stride,
                         int64_t head_stride, float scale, int threads, int64_t n_slots, int64_t capacity,
                         int kv_kind)
{
    if (kv_kind != KV_F32 && kv_kind != KV_F16 && kv_kind != KV_BF16)
        return -2;
    int64_t longest = 1;
    for (int64_t i = 0; i < rows; i++) {
        if (slots[i] < 0 || slots[i] >= n_slots || lengths[i] < 1 || lengths[i] > capacity)
            return -2;
        longest = lengths[i] > longest ? lengths[i] : longest;
    }
    const int vector = head_dim % 8 == 0;
    const int64_t work = rows * kv_heads, es = (int64_t)kv_size(kv_kind);
    const int prefetch = vector && 4 * longest * head_dim * es <= l2_bytes();
    int failed = 0;
#pragma omp parallel if (threads > 1 && work > 1 && work * longest * group * head_dim > 65536) \
    num_threads(threads) reduction(| : failed)
    {
        float *scores = malloc(sizeof(float) * (size_t)(group * longest));
        if (scores == NULL) {
            failed = 1;
        } else {
#pragma omp for schedule(static)
            for (int64_t w = 0; w < work; w++) {
                const int64_t i = w / kv_heads, h = w % kv_heads;
                const float *qi = q + i * q_row_stride + h * group * head_dim;
                float *o = out + w * group * head_dim;
                const float *kn = k_new + i * kn_row + h * kn_head, *vn = v_new + i * vn_row + h * vn_head;
                const int64_t base = slots[i] * slot_stride + h * head_stride;
                next_pair next = {NULL, NULL, 0};
                /* (at the end of a thread's share, w + 1 is the next thread's first pair: one wasted prefetch) */
                if (prefetch && w + 1 < work) {
                    const int64_t i2 = (w + 1) / kv_heads, h2 = (w + 1) % kv_heads;
                    const int64_t b2 = (slots[i2] * slot_stride + h2 * head_stride) * es;
                    next = (next_pair){(const char *)keys + b2, (const char *)values + b2, lengths[i2]};
                } else if (vector && !prefetch && lengths[i] > PREFETCH_AHEAD) {
                    const int64_t b2 = (base + PREFETCH_AHEAD * head_dim) * es;
                    next = (next_pair){(const char *)keys + b2, (const char *)values + b2, lengths[i] - PREFETCH_AHEAD};
                }
                if (kv_kind == KV_F16)
                    attend_pair(qi, o, keys, values, kn, vn, base, lengths[i], group, head_dim, scale, scores,
                                vector, next, KV_F16);
                else if (kv_kind == KV_BF16)
                    attend_pair(qi, o, keys, values, kn, vn, base, lengths[i], group, head_dim, scale, scores,
                                vector, next, KV_BF16);
                else
                    attend_pair(qi, o, keys, values, kn, vn, base, lengths[i], group, head_dim, scale, scores,
                                vector, next, KV_F32);
            }
            free(scores);
        }
    }
    return failed ? -1 : 0;
}

/* The cache's conversions alone, as the attention stores and reads: n floats of src stored as `kind` into
 * dst, then read back into back (eight at a time as far as n allows, as the attention reads, the rest one
 * by one), for tests to compare with torch's conversions bit for bit. Returns 0, or -2 for an unknown kind. */
static inline __attribute__((always_inline)) void convert_all(const float *src, void *dst, float *back, int64_t n,
                                                               const int kind)
{
    kv_store(dst, 0, src, n, kind);
    int64_t t = 0;
    for (; t + 8 <= n; t += 8)
        store8(back + t, kv_load8(dst, t, kind));
    for (; t < n; t++)
        back[t] = kv_load1(dst, t, kind);
}

int rft_kv_convert(const float *src, void *dst, float *back, int64_t n, int kind)
{
    if (kind == KV_F16)
        convert_all(src, dst, back, n, KV_F16);
    else if (kind == KV_BF16)
        convert_all(src, dst, back, n, KV_BF16);
    else if (kind == KV_F32)
        convert_all(src, dst, back, n, KV_F32);
    else
        return -2;
    return 0;
}

/* RMSNorm of `rows` rows of n floats (contiguous): out = x / sqrt(mean(x^2) + eps) * weight, the
 * normalised value rounded to float before the weight multiplies, as transformers' Llama/Qwen2 RMSNorm
 * does in float32. */
void rft_rms_norm(const float *x, const float *weight, float *out, int64_t rows, int64_t n, float eps)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *o = out + r * n;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t i = 0; i < n; i++)
            acc += xr[i] * xr[i];
        const float inv = 1.0f / sqrtf(acc / (float)n + eps);
#pragma omp simd
        for (int64_t i = 0; i < n; i++)
            o[i] = weight[i] * (xr[i] * inv);
    }
}

/* Rotary embedding in place, as transformers' apply_rotary_pos_emb computes it (x * cos + rotate_half(x) *
 * sin, rotate_half(x) = [-x2, x1] for the halves x1, x2 of a head): token t's `heads` heads of head_dim
 * floats start at x + t * row_stride, one after another; cos and sin are tables [position][head_dim]
 * (contiguous, `table` rows), read at positions[t]. The runner turns the query and key heads of its packed
 * q/k/v rows (the value heads follow them and are left alone). Returns 0, or -1 (and changes nothing) when
 * a position lies outside the tables. */
int rft_rope(float *x, int64_t tokens, int64_t row_stride, int64_t heads, int64_t head_dim, const float *cos,
             const float *sin, const int64_t *positions, int64_t table)
{
    const int64_t half = head_dim / 2;
    for (int64_t t = 0; t < tokens; t++)
        if (positions[t] < 0 || positions[t] >= table)
            return -1;
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cos + positions[t] * head_dim, *s = sin + positions[t] * head_dim;
        for (int64_t h = 0; h < heads; h++) {
            float *restrict x1 = x + t * row_stride + h * head_dim, *restrict x2 = x1 + half;
#pragma omp simd
            for (int64_t d = 0; d < half; d++) {
                const float a = x1[d], b = x2[d];
                x1[d] = a * c[d] - b * s[d];
                x2[d] = b * c[half + d] + a * s[half + d];
            }
        }
    }
    return 0;
}

/* The gated MLP's activation: out[r, i] = silu(g) * u, g = gate_up[r, i], u = gate_up[r, inter + i] (each
 * row holds its gate projection, then its up projection, as one fused matrix multiplication gives them;
 * rows are row_stride floats apart), out contiguous [rows, inter]. silu(g) = g / (1 + e^-g), computed as
 * g * (1 / (1 + e^-g)) with the vectorised polynomial exp. */
void rft_silu_mul(const float *gate_up, int64_t row_stride, float *out, int64_t rows, int64_t inter)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict g = gate_up + r * row_stride, *restrict u = g + inter;
        float *restrict o = out + r * inter;
#pragma omp simd
        for (int64_t i = 0; i < inter; i++) {
            const float s = 1.0f / (1.0f + exp_clamped(-g[i]));
            o[i] = u[i] * g[i] * s;
        }
    }
}

/* splitmix64's finaliser (rft_runtime.serve.sampler._mix_int, in unsigned 64-bit arithmetic). */
static inline uint64_t mix64(uint64_t x)
{
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* One decode step's sampling, as rft_runtime.serve.sampler.sample_step computes it without top-k or top-p
 * (to float rounding; the draw itself is the same arithmetic). Row r of logits [rows][vocab] (contiguous):
 *   logprobs[r] = log_softmax(logits[r] / temps[r])                     (temps[r] 1 for a greedy row)
 *   greedy[r]:  tokens[r] = the first index of the largest logprob
 *   otherwise:  u = (top 40 bits of mix64(seed * golden + step * step_constant + 1) + 0.5) / 2^40, and
 *               tokens[r] = the number of prefix sums (in double) of e^logprobs[r] at most u times their
 *               total: the first token whose cumulative probability exceeds u (one of probability 0 is
 *               never chosen);
 *   chosen[r] = logprobs[r][tokens[r]].
 * Returns 0, or -1 when the scratch of prefix sums could not be allocated. */
int rft_sample(const float *logits, int64_t rows, int64_t vocab, const float *temps, const uint8_t *greedy,
               const int64_t *seeds, const int64_t *steps, float *logprobs, int64_t *tokens, float *chosen)
{
    double *cum = malloc(sizeof(double) * (size_t)vocab);
    float *probs = malloc(sizeof(float) * (size_t)vocab);
    if (cum == NULL || probs == NULL) {
        free(cum);
        free(probs);
        return -1;
    }
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits + r * vocab;
        float *lp = logprobs + r * vocab;
        const float t = temps[r];
        float top = -INFINITY;
        for (int64_t i = 0; i < vocab; i++) {
            lp[i] = x[i] / t;
            top = lp[i] > top ? lp[i] : top;
        }
        double total = 0.0;
#pragma omp simd reduction(+ : total)
        for (int64_t i = 0; i < vocab; i++)
            total += (double)exp_nonpositive(lp[i] - top);
        const float shift = top + (float)log(total);
#pragma omp simd
        for (int64_t i = 0; i < vocab; i++)
            lp[i] = lp[i] - shift;
        int64_t token = 0;
        if (greedy[r]) {
            for (int64_t i = 1; i < vocab; i++)
                token = lp[i] > lp[token] ? i : token;
        } else {
            const uint64_t key = mix64((uint64_t)seeds[r] * 0x9E3779B97F4A7C15ull +
                                       (uint64_t)steps[r] * 0xD1B54A32D192ED03ull + 1ull);
            const double u = ((double)(key >> 24) + 0.5) * (1.0 / 1099511627776.0);
#pragma omp simd
            for (int64_t i = 0; i < vocab; i++)
                probs[i] = exp_nonpositive(lp[i]);
            double acc = 0.0;
            for (int64_t i = 0; i < vocab; i++) {
                acc += (double)probs[i];
                cum[i] = acc;
            }
            const double target = u * acc;
            int64_t lo = 0, hi = vocab;  /* the first i with cum[i] > target */
            while (lo < hi) {
                const int64_t mid = lo + (hi - lo) / 2;
                if (cum[mid] > target)
                    hi = mid;
                else
                    lo = mid + 1;
            }
            token = lo < vocab ? lo : vocab - 1;
            while (token > 0 && probs[token] == 0.0f)  /* only past the end: u * total rounds below total */
                token--;
        }
        tokens[r] = token;
        chosen[r] = lp[token];
    }
    free(cum);
    free(probs);
    return 0;
}
