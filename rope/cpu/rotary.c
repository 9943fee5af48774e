/* The torch path's rotation in one pass on the CPU: rope.cpu.rotary's kernel.
 *
 * For every row (one head of one token) of x and the float64 cos c_i and sin s_i of its pairs:
 *
 *     y_a = x_a c_i - x_b s_i,    y_b = x_b c_i + x_a s_i    (RoFormer eq. 34),
 *
 * each product and the sum rounded to float64 (no fused multiply-add: -ffp-contract=off), then the
 * result rounded once, to nearest even, to x's dtype. The rotated block is the rotary_dim
 * coordinates from rotary_start (0, or head_dim - rotary_dim for rope's rotated="last": DeepSeek-V4);
 * the coordinates outside it are copied.
 * This is the arithmetic of rope.rotation's torch operations, in one pass over memory.
 *
 * Rounding float64 to float16 and bfloat16 once (to_bfloat16, to_float16). Where y lies in
 * float32's normal range (|y| >= 2^-126, which holds all of float16's normal numbers), y is first
 * rounded to float32 *to odd* (truncated, the last bit set if anything was dropped), then to the
 * narrow format to nearest even: one correct rounding, because float32 carries more than two bits
 * beyond the narrow format's (Boldo and Melquiond, "When double rounding is odd", 2005). Below the
 * narrow format's smallest normal number 2^e_min its spacing is the constant 2^q (q = -133 for
 * bfloat16, -24 for float16): there, with C = 1.5 * 2^(q + 52), y + C lies in [2^(q+52), 2^(q+53))
 * where float64's spacing is 2^q, so fl(y + C) - C is y rounded to the nearest multiple of 2^q,
 * ties to an even multiple (C is one), and the subtraction is exact: one rounding again.
 *
 * Decoding (rope_rotate_few): the cos and sin of a few tokens are computed here from the float64
 * product m theta_i, exact for |m| < 2^29 (theta_i is float32: 24 + 29 bits), by the C library's
 * cos and sin (within an ulp, after a full argument reduction, as torch's are), then scaled by the
 * attention factor, as rope.angles' fast case computes them.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { FLOAT32 = 0, FLOAT16 = 1, BFLOAT16 = 2 };

static inline uint64_t bits64(double v) { uint64_t b; memcpy(&b, &v, 8); return b; }
static inline double from_bits64(uint64_t b) { double v; memcpy(&v, &b, 8); return v; }
static inline uint32_t bits32(float v) { uint32_t b; memcpy(&b, &v, 4); return b; }
static inline float from_bits32(uint32_t b) { float v; memcpy(&v, &b, 4); return v; }

/* Narrow values to float64, exactly. */
static inline double from_bfloat16(uint16_t h) { return (double)from_bits32((uint32_t)h << 16); }

static inline double from_float16(uint16_t h) {
    /* The 15 low bits placed at float64's exponent and significand: 2^(e - 1023) (1 + m/1024),
     * times 2^1008 is 2^(e - 15) (1 + m/1024); a subnormal (e = 0) becomes m 2^-24 the same way. */
    double magnitude = from_bits64((uint64_t)(h & 0x7fff) << 42) * 0x1p1008;
    if ((h & 0x7c00) == 0x7c00)  /* infinity or NaN */
        magnitude = (h & 0x3ff) ? NAN : INFINITY;
    return (h & 0x8000) ? -magnitude : magnitude;
}

/* y rounded to float32 to odd: its 29 dropped bits folded into the last kept one, then an exact
 * conversion (in float32's normal range). */
static inline uint32_t to_odd_float32(double y) {
    uint64_t b = bits64(y), dropped = (1ull << 29) - 1;
    return bits32((float)from_bits64((b & ~dropped) | (((b & dropped) + dropped) & (1ull << 29))));
}

/* y rounded once to bfloat16. In float32's normal range: to float32 to odd, then to nearest even
 * on the float32 pattern, exact as float32 keeps more than two bits beyond bfloat16's (Boldo and
 * Melquiond 2005). Below 2^-126 (bfloat16's subnormals, spacing 2^-133): fl(y + C) - C with the
 * constant C = 1.5 * 2^-81 rounds y once to that spacing (the proof at the top). */
static inline uint16_t to_bfloat16(double y) {
    uint32_t u = to_odd_float32(y), magnitude = u & 0x7fffffffu;
    uint16_t r = (uint16_t)((magnitude + 0x7fffu + ((magnitude >> 16) & 1u)) >> 16);
    r = (y != y) ? (uint16_t)0x7fc0u : r;
    double t = (y + 0x1.8p-81) - 0x1.8p-81;
    uint16_t tiny = (uint16_t)(int64_t)(fabs(t) * 0x1p133);
    return (uint16_t)((fabs(y) < 0x1p-126 ? tiny : r) | ((u >> 16) & 0x8000u));
}

/* y rounded once to float16. In its normal range: to float32 to odd, then to nearest even on the
 * float32 pattern (exponent rebiased; results past 65504 become infinite). Below 2^-14 (spacing
 * 2^-24): fl(y + C) - C with C = 1.5 * 2^28, as for bfloat16. */
static inline uint16_t to_float16(double y) {
    uint32_t u = to_odd_float32(y), magnitude = u & 0x7fffffffu;
    uint32_t rounded = ((magnitude + 0xfffu + ((magnitude >> 13) & 1u)) >> 13) - (112u << 10);
    uint16_t r = (uint16_t)(magnitude >= (143u << 23) ? 0x7c00u : rounded);  /* 2^16 and past: infinite */
    r = (y != y) ? (uint16_t)0x7e00u : r;
    double t = (y + 0x1.8p28) - 0x1.8p28;
    uint16_t tiny = (uint16_t)(int64_t)(fabs(t) * 0x1p24);
    return (uint16_t)((fabs(y) < 0x1p-14 ? tiny : r) | ((u >> 16) & 0x8000u));
}

typedef struct {
    const char *x;            /* input, element strides xs[4] */
    char *out;                /* output, contiguous [batch, seq, heads, head_dim] */
    const double *cos, *sin;  /* tables, element strides ts[3] over (batch, seq, heads), pairs contiguous */
    int64_t shape[4], xs[4], ts[3];
    int64_t rotary_dim, rotary_start;  /* the rotated block: [rotary_start, rotary_start + rotary_dim) */
    int dtype, interleaved;
    int64_t first, last;      /* the rows of this worker */
} Job;

/* One row: the pairs of the rotated block (half layout: i and i + half; interleaved: 2i and
 * 2i + 1, counted from the block's start) rotated, the coordinates before and after it copied.
 * Rows of contiguous coordinates have a loop for each layout, which the compiler vectorizes;
 * other strides take the general loop. The block's start moves both pointers once per row, so
 * the loops are those of a block at 0 (rotated="first" pays one empty copy loop). */
#define ROTATE_ROW(NAME, T, LOAD, STORE)                                                         \
    static void NAME(const Job *j, const char *xr, char *orow, const double *c, const double *s) { \
        const T *xrow = (const T *)xr;                                                           \
        T *orow_t = (T *)orow;                                                                   \
        int64_t half = j->rotary_dim / 2, d = j->shape[3], st = j->xs[3], r0 = j->rotary_start;  \
        for (int64_t i = 0; i < r0; i++) orow_t[i] = xrow[i * st];                               \
        const T *x = xrow + r0 * st;                                                             \
        T *restrict o = orow_t + r0;                                                             \
        if (!j->interleaved && st == 1) {                                                        \
            for (int64_t i = 0; i < half; i++) {                                                 \
                double xa = LOAD(x[i]), xb = LOAD(x[i + half]);                                 \
                o[i] = STORE(xa * c[i] - xb * s[i]);                                               \
                o[i + half] = STORE(xb * c[i] + xa * s[i]);                                        \
            }                                                                                    \
        } else if (st == 1) {                                                                    \
            for (int64_t i = 0; i < half; i++) {                                                 \
                double xa = LOAD(x[2 * i]), xb = LOAD(x[2 * i + 1]);                             \
                o[2 * i] = STORE(xa * c[i] - xb * s[i]);                                         \
                o[2 * i + 1] = STORE(xb * c[i] + xa * s[i]);                                     \
            }                                                                                    \
        } else {                                                                                 \
            int64_t ia = j->interleaved ? 2 : 1, ib = j->interleaved ? 1 : half;                  \
            for (int64_t i = 0; i < half; i++) {                                                 \
                int64_t pa = i * ia, pb = i * ia + ib;                                           \
                double xa = LOAD(x[pa * st]), xb = LOAD(x[pb * st]);                           \
                o[pa] = STORE(xa * c[i] - xb * s[i]);                                              \
                o[pb] = STORE(xb * c[i] + xa * s[i]);                                              \
            }                                                                                    \
        }                                                                                        \
        for (int64_t i = r0 + j->rotary_dim; i < d; i++) orow_t[i] = xrow[i * st];               \
    }

#define LOAD_FLOAT32(v) ((double)(v))
#define STORE_FLOAT32(v) ((float)(v))
ROTATE_ROW(row_float32, float, LOAD_FLOAT32, STORE_FLOAT32)
ROTATE_ROW(row_float16, uint16_t, from_float16, to_float16)
ROTATE_ROW(row_bfloat16, uint16_t, from_bfloat16, to_bfloat16)

static void run_rows(const Job *j) {
    int64_t heads = j->shape[2], seq = j->shape[1], d = j->shape[3];
    int64_t size = j->dtype == FLOAT32 ? 4 : 2;
    for (int64_t r = j->first; r < j->last; r++) {
        int64_t h = r % heads, t = (r / heads) % seq, b = r / (heads * seq);
        const char *xr = j->x + (b * j->xs[0] + t * j->xs[1] + h * j->xs[2]) * size;
        const double *c = j->cos + b * j->ts[0] + t * j->ts[1] + h * j->ts[2];
        const double *s = j->sin + b * j->ts[0] + t * j->ts[1] + h * j->ts[2];
        char *orow = j->out + r * d * size;
        if (j->dtype == FLOAT32) row_float32(j, xr, orow, c, s);
        else if (j->dtype == BFLOAT16) row_bfloat16(j, xr, orow, c, s);
        else row_float16(j, xr, orow, c, s);
    }
}

static void fill_job(Job *j, const void *x, void *out, const double *cos, const double *sin, const int64_t *shape,
                     const int64_t *x_strides, const int64_t *table_strides, int64_t rotary_dim,
                     int64_t rotary_start, int dtype, int interleaved) {
    j->x = (const char *)x; j->out = (char *)out; j->cos = cos; j->sin = sin;
    for (int i = 0; i < 4; i++) { j->shape[i] = shape[i]; j->xs[i] = x_strides[i]; }
    for (int i = 0; i < 3; i++) j->ts[i] = table_strides[i];
    j->rotary_dim = rotary_dim; j->rotary_start = rotary_start; j->dtype = dtype; j->interleaved = interleaved;
    j->first = 0; j->last = shape[0] * shape[1] * shape[2];
}

/* Rotate x [batch, seq, heads, head_dim] into out (the block of rotary_dim coordinates from
 * rotary_start; the rest copied), its rows split into `threads` equal runs. Built
 * with OpenMP against the runtime torch's own threads use (rope.cpu.build), the runs go to those
 * threads; a second pool would compete with them for the cores while they wait. Built without
 * OpenMP, the runs go one after the other. Returns 0. */
int rope_rotate(const void *x, void *out, const double *cos, const double *sin, const int64_t *shape,
                const int64_t *x_strides, const int64_t *table_strides, int64_t rotary_dim,
                int64_t rotary_start, int dtype, int interleaved, int threads) {
    enum { MAX_THREADS = 256 };
    Job jobs[MAX_THREADS];
    int64_t rows = shape[0] * shape[1] * shape[2];
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    for (int w = 0; w < threads; w++) {
        fill_job(&jobs[w], x, out, cos, sin, shape, x_strides, table_strides, rotary_dim, rotary_start, dtype,
                 interleaved);
        jobs[w].first = rows * w / threads;
        jobs[w].last = rows * (w + 1) / threads;
    }
#pragma omp parallel for num_threads(threads) schedule(static, 1) if (threads > 1)
    for (int w = 0; w < threads; w++) run_rows(&jobs[w]);
    return 0;
}

/* Decoding: q and k [batch, seq, heads, head_dim] rotated on the calling thread by the angles of
 * `positions` ([position_rows = 1 or batch, seq], |m| < 2^29) and the float32 frequencies `theta`
 * (rotary_dim / 2 of them): cos_factor cos(m theta_i) and sin_factor sin(m theta_i), the block of
 * rotary_dim coordinates from rotary_start rotated, the rest copied. Returns 0, or
 * 1 without writing anything where a theta_i is not finite, 2 where memory runs out. */
int rope_rotate_few(const int64_t *positions, int64_t position_rows, const float *theta, double cos_factor,
                    double sin_factor, const void *q, void *q_out, const int64_t *q_shape,
                    const int64_t *q_strides, const void *k, void *k_out, const int64_t *k_shape,
                    const int64_t *k_strides, int64_t rotary_dim, int64_t rotary_start, int dtype,
                    int interleaved) {
    int64_t pairs = rotary_dim / 2, seq = q_shape[1], count = position_rows * seq * pairs;
    for (int64_t i = 0; i < pairs; i++)
        if (!isfinite(theta[i])) return 1;
    double *table = malloc(2 * (size_t)(count > 0 ? count : 1) * sizeof(double));
    if (!table) return 2;
    for (int64_t t = 0; t < position_rows * seq; t++)
        for (int64_t i = 0; i < pairs; i++) {
            double angle = (double)positions[t] * (double)theta[i];  /* exact: |m| < 2^29 */
            table[t * pairs + i] = cos_factor * cos(angle);
            table[count + t * pairs + i] = sin_factor * sin(angle);
        }
    int64_t table_strides[3] = {position_rows > 1 ? seq * pairs : 0, pairs, 0};
    Job j;
    fill_job(&j, q, q_out, table, table + count, q_shape, q_strides, table_strides, rotary_dim, rotary_start, dtype,
             interleaved);
    run_rows(&j);
    fill_job(&j, k, k_out, table, table + count, k_shape, k_strides, table_strides, rotary_dim, rotary_start, dtype,
             interleaved);
    run_rows(&j);
    free(table);
    return 0;
}
