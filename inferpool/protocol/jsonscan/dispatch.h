/* The SIMD tiers' runtime dispatch and shared ground. Included by ../_jsonscan.c after
 * numbers.h; it defines QUICK: 1 where the tiers are compiled (x86-64 with GCC or Clang,
 * FAST_PATH and SWAR), else 0 and the scalar reading (numbers.h) is all there is.
 *
 * The tiers, each in its own header and compiled with its own target attribute so the
 * module loads on any x86-64 CPU:
 *   tier_ssse3.h   quick runs: plain decimals followed by commas, one token at a time
 *                  (long ones, up to 31 characters, by long_number);
 *   tier_avx2.h    wide runs: compact arrays a 64-byte window at a time, four tokens a
 *                  conversion (windows with long decimals: long_window);
 *   tier_avx512.h  wide runs' windows with AVX-512 VBMI2: up to eight tokens, no loop.
 * The CPU is detected once at import (quick_init): have_ssse3, have_wide (AVX2, BMI, BMI2)
 * and have_wide512 (AVX-512 F/BW/VL/DQ/VBMI/VBMI2), each implying the one before. The array
 * reader (scan_generic.h) starts a quick run where have_ssse3; a quick run hands a compact
 * array to a wide run after its first token where have_wide and wide_enabled (wide_judge
 * pauses that when it does not pay), with AVX-512 windows where have_wide512 and
 * wide512_enabled. The two switches are the module's wide_stats(enable) and
 * wide512_stats(enable), for tests and benchmarks.
 *
 * Shared here: the window sizes, the digit-folding multipliers, the digit shuffle and scale
 * tables (SSSE3 and AVX2) and the windows' token check on 64-bit maps (AVX2 and AVX-512).
 */
#ifndef INFERPOOL_JSONSCAN_DISPATCH_H
#define INFERPOOL_JSONSCAN_DISPATCH_H

#if SWAR && FAST_PATH && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define QUICK 1
/* The window of commas, and how far past a token's start quick_number reads (its sign,
 * then 16 bytes). */
#define QUICK_WINDOW 64
#define QUICK_READ 17

/* The multipliers that fold a token's sixteen digits (one a byte, most significant first)
 * into two eight-digit halves, shared by quick_number (SSE, one token), wide_convert
 * (AVX2, four) and wide512_window (AVX-512, eight): adjacent digits x10 + x1 (maddubs),
 * adjacent pairs x100 + x1 (madd), then adjacent fours x10^4 + x1 (madd again). */
#define FOLD_PAIRS 0x010A       /* 10, 1 as two bytes */
#define FOLD_FOURS 0x00010064   /* 100, 1 as two 16-bit words */
#define FOLD_EIGHTS 0x00012710  /* 10^4, 1 as two 16-bit words */

static int have_ssse3;
/* AVX2 wide runs (see wide_run): whether the CPU has them, and whether they are taken. */
static int have_wide, wide_enabled = 1;
/* AVX-512 windows for wide runs (see wide512_run): whether the CPU has them, and whether
 * they are taken. */
static int have_wide512, wide512_enabled = 1;
/* Tokens read by quick runs (tier_ssse3.h) since import: for the tests that the runs are taken. */
static unsigned long long quick_tokens;

/* pshufb masks that put a token's digits, the point skipped, right-aligned in 16 bytes
 * with zeros before them; by the token's length and the point's place (its length when it
 * has none). */
static uint8_t DIGIT_SHUFFLE[16][16][16] __attribute__((aligned(16)));
/* The power of ten a token's digits are divided by, by the same two indices: 10^(digits
 * after the point). */
static double DIGIT_SCALE[16][16];

static void quick_init(void) {
    __builtin_cpu_init();
    have_ssse3 = __builtin_cpu_supports("ssse3");
    have_wide = have_ssse3 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi") &&
                __builtin_cpu_supports("bmi2");
    have_wide512 = have_wide && __builtin_cpu_supports("avx512f") &&
                   __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                   __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vbmi") &&
                   __builtin_cpu_supports("avx512vbmi2");
    for (int len = 0; len < 16; len++)
        for (int point = 0; point <= len; point++) {
            const int count = len - (point < len);
            DIGIT_SCALE[len][point] = POW10[point < len ? len - point - 1 : 0];
            for (int j = 0; j < 16; j++) {
                const int t = j - (16 - count);
                DIGIT_SHUFFLE[len][point][j] = t < 0 ? 0x80 : (uint8_t)(t < point ? t : t + 1);
            }
        }
}

/* The wider tiers' entry points (tier_avx2.h, tier_avx512.h), which quick_run
 * (tier_ssse3.h) hands compact runs to. */
static Py_ssize_t wide_run(const char *s, Py_ssize_t p, Py_ssize_t n, int size, char *out,
                           Py_ssize_t count, Py_ssize_t expected, Py_ssize_t *end);
static Py_ssize_t wide512_run(const char *s, Py_ssize_t p, Py_ssize_t n, int size, char *out,
                              Py_ssize_t count, Py_ssize_t expected, Py_ssize_t *end);

/* Whether an array's quick runs take a wide run (after their first token). A wide run
 * pays for itself from about eight tokens: after one that read fewer (tokens of other
 * forms close together) or less than half of its quick run (spaced tokens), the next
 * `pause` quick runs go without, a pause that doubles (to 1024) while they keep reading
 * little, so that data wide runs do not suit costs about what it did without them. */
typedef struct {
    int pause, backoff;
} WideState;
#define WIDE_WORTH 8
#define WIDE_MAX_PAUSE 1024

static inline void wide_judge(WideState *wide, Py_ssize_t wide_read, Py_ssize_t run_read) {
    if (wide_read >= WIDE_WORTH && 2 * wide_read >= run_read) {
        wide->backoff = 0;
        return;
    }
    wide->backoff = wide->backoff == 0 ? 16 : wide->backoff * 2;
    if (wide->backoff > WIDE_MAX_PAUSE) wide->backoff = WIDE_MAX_PAUSE;
    wide->pause = wide->backoff;
}

/* A 64-byte window's byte maps (bit i: byte i is one), cut to the tokens a window takes. */
typedef struct {
    uint64_t commas, points, minus, digits, zeros;
} WindowMaps;

/* Cut the maps to the window's tokens up to the first byte of no number (whitespace, 'e', a
 * bracket ...): the last comma's place, or -1 when no token ends at a comma before it or
 * any of those tokens is not of the quick form, -?(0|[1-9][0-9]*)(.[0-9]+)? and not "-0"
 * (which is the integer 0). Its length is the caller's to check. Where the next window
 * starts comes from the commas alone, so the next window's loads need not wait for the
 * rest of the maps. */
static inline __attribute__((always_inline)) int quick_window_tokens(WindowMaps *m) {
    uint64_t commas = m->commas;
    if (commas == 0) return -1;
    int last = 63 - __builtin_clzll(commas);
    uint64_t span = ~UINT64_C(0) >> (63 - last); /* up to the last comma */
    const uint64_t others = ~(m->digits | m->points | commas | m->minus) & span;
    if (__builtin_expect(others != 0, 0)) {
        commas &= (others & (0 - others)) - 1;
        if (commas == 0) return -1;
        last = 63 - __builtin_clzll(commas);
        span = ~UINT64_C(0) >> (63 - last);
    }
    const uint64_t points = m->points & span, minus = m->minus & span;
    const uint64_t digits = m->digits & span, zeros = m->zeros & span;
    const uint64_t starts = ((commas << 1) | 1) & span;
    const uint64_t digit_starts = (starts & ~minus) | ((starts & minus) << 1);
    const uint64_t bad = (minus & ~starts)            /* a sign inside a token */
        | (digit_starts & ~digits)                    /* no digit first: "", "-", ".5" */
        | (points & ~(digits << 1))                   /* no digit before a point */
        | (points & ~(digits >> 1))                   /* nor after it */
        | (((digit_starts & zeros) << 1) & digits)    /* a leading zero: "01" */
        | ((minus << 2) & (zeros << 1) & commas)      /* "-0" */
        /* A point's fraction ending at another point: "1.2.3". (The carry of the bit
         * after a point runs through the fraction's digits to the byte after them.) */
        | ((((points << 1) + digits) & ~digits) & points);
    if (bad) return -1;
    m->commas = commas, m->points = points, m->minus = minus, m->digits = digits;
    m->zeros = zeros;
    return last;
}
#else
#define QUICK 0
#endif

#endif /* INFERPOOL_JSONSCAN_DISPATCH_H */
