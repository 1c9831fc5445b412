/* inferpool's JSON tensor scanner: reads the numeric `data` arrays of a V2 REST request
 * straight into numpy buffers, so orjson never builds a Python list of floats for them.
 *
 * `scan` walks the request body once. For each `inputs[i].data` array whose tensor's
 * `datatype` and `shape` are plain (a known name, a list of small integers) it converts
 * the array's numbers into a buffer of that datatype, then cuts the array out of the body:
 * the rest (the "skeleton", with `0` in the array's place) is what orjson then parses.
 * inferpool/protocol/json_scan.py owns the Python side and the argument for why the
 * outcome is the one orjson + numpy give on the whole body.
 *
 * The rule that makes it exact: an array is cut out only when every token in it was read
 * here and is one orjson accepts with the value it gives (strict JSON number grammar, no
 * infinity after rounding), in a nesting numpy turns into an array of the same values.
 * Anything else -- strings, null, NaN, objects, ragged nesting, empty inner lists, long
 * integers, a value out of the datatype's range, a datatype not handled here -- leaves
 * the array in the skeleton, where orjson and the existing decoder see it as before. An
 * array whose numbers mostly are past the conversions below (over 19 digits, subnormal)
 * leaves the whole body to orjson, which reads those faster (SLOW_TRIAL).
 *
 * Floats are correctly rounded: a decimal whose digits make an integer w <= 2^53, times a
 * power of ten within 10^22, is one IEEE multiplication or division of two exact doubles
 * (Clinger's fast path, exact when the CPU rounds each double operation once:
 * FLT_EVAL_METHOD 0); one of up to 19 digits otherwise goes through Eisel and Lemire's
 * 128-bit multiplication (eisel_lemire); every other number (more digits, a subnormal or
 * infinite result) through PyOS_string_to_double, Python's own float() parser, on a copy of
 * the token. FP32 is that double cast to float, as numpy casts the float64 array orjson's
 * floats make.
 *
 * The commonest arrays, plain decimals separated by commas, are read in "quick runs"
 * (SSSE3, chosen at run time): the same values, about 1.7x faster than token by token;
 * compact ones (no whitespace) a 64-byte window at a time with AVX2 ("wide runs"), about
 * twice as fast again, and with AVX-512 where the CPU has VBMI2 (eight tokens a window with
 * no loop over them), a quarter faster than AVX2's.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Deeper data is left to orjson and numpy (numpy's own limit is 64 dimensions, the V2
 * shape's is 32: inferpool/protocol/datatypes.py MAX_DIMS). */
#define MAX_DATA_DEPTH 32
/* orjson refuses documents deeper than 1024 levels; deeper ones are left to it. */
#define MAX_STACK 1040
/* A number that neither Clinger's fast path nor Eisel-Lemire takes (over 19 digits, a
 * subnormal) is read by PyOS_string_to_double, about 130 ns here. orjson's list of numbers
 * and numpy's conversion cost about 41 ns a number, so an array where more than a quarter
 * of the numbers read so far took that path, once SLOW_TRIAL of them have, is left to
 * orjson. (No value changes: orjson's reading is the reference.) The 17 digits of a float
 * written through Python's floats (`ndarray.tolist()`, and so tritonclient's and MLServer's
 * JSON encoders: "0.1257302165031433") are Eisel-Lemire's, about 22 ns a number. */
#define SLOW_TRIAL 32
/* convert's outcome for such an array: the walk stops there, and orjson reads the body. */
#define GIVE_UP 2
/* A number token longer than this is left to orjson. */
#define MAX_TOKEN 512
/* Integers of up to 18 digits fit int64 whatever they are. */
#define MAX_INT_DIGITS 18
/* ... and up to 15 digits they are exact as doubles too (10^15 < 2^53), so an FP32 or FP64
 * tensor's integers cast the same whether numpy made an int64 or a float64 array. */
#define MAX_EXACT_FLOAT_INT_DIGITS 15

#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD == 0
#define FAST_PATH 1
#else
#define FAST_PATH 0
#endif

typedef enum { T_BOOL, T_INT, T_UINT, T_FLOAT } Family;

typedef struct {
    const char *name;
    Family family;
    int size;
    int64_t lo, hi; /* the range of an integer datatype */
} DType;

static const DType DTYPES[] = {
    {"BOOL", T_BOOL, 1, 0, 1},
    {"INT8", T_INT, 1, INT8_MIN, INT8_MAX},
    {"INT16", T_INT, 2, INT16_MIN, INT16_MAX},
    {"INT32", T_INT, 4, INT32_MIN, INT32_MAX},
    {"INT64", T_INT, 8, INT64_MIN, INT64_MAX},
    {"UINT8", T_UINT, 1, 0, UINT8_MAX},
    {"UINT16", T_UINT, 2, 0, UINT16_MAX},
    {"UINT32", T_UINT, 4, 0, UINT32_MAX},
    {"UINT64", T_UINT, 8, 0, INT64_MAX}, /* 18-digit integers never reach past int64 */
    {"FP32", T_FLOAT, 4, 0, 0},
    {"FP64", T_FLOAT, 8, 0, 0},
};
#define N_DTYPES (sizeof(DTYPES) / sizeof(DTYPES[0]))

static const double POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                 1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static inline int is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
static inline int is_digit(char c) { return c >= '0' && c <= '9'; }

static inline Py_ssize_t skip_ws(const char *s, Py_ssize_t p, Py_ssize_t n) {
    while (p < n && is_ws(s[p])) p++;
    return p;
}

/* ---------------------------------------------------------------- numbers ---------- */

/* FAILED: a Python error is set. SLOW: orjson reads the array faster (SLOW_TRIAL), and the
 * whole body is left to it. */
typedef enum { CONVERTED, UNSUPPORTED, FAILED, SLOW } Outcome;

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define SWAR 1
#else
#define SWAR 0
#endif

/* Digits eight bytes at a time (little-endian loads; a decimal float32 has about nine).
 * A byte is a digit when it XOR '0' is below 10; `non_digits` marks the others. */
static const uint64_t POW10_INT[9] = {1,      10,      100,      1000,     10000,
                                      100000, 1000000, 10000000, 100000000};

static inline uint64_t load8(const char *q) {
    uint64_t v;
    memcpy(&v, q, 8);
    return v;
}

static inline uint64_t non_digits(uint64_t word) {
    const uint64_t t = word ^ UINT64_C(0x3030303030303030);
    return (((t & UINT64_C(0x7F7F7F7F7F7F7F7F)) + UINT64_C(0x7676767676767676)) | t) &
           UINT64_C(0x8080808080808080);
}

/* The value of eight ASCII digits, the first in the lowest byte. */
static inline uint64_t eight_digits_value(uint64_t v) {
    v -= UINT64_C(0x3030303030303030);
    v = v * 10 + (v >> 8); /* pairs of digits, in every other byte */
    const uint64_t mask = UINT64_C(0x000000FF000000FF);
    const uint64_t mul1 = UINT64_C(100) + (UINT64_C(1000000) << 32);
    const uint64_t mul2 = UINT64_C(1) + (UINT64_C(10000) << 32);
    return ((v & mask) * mul1 + ((v >> 16) & mask) * mul2) >> 32;
}

/* Digits from q into w (w * 10 + digit each); where they stop. */
static inline const char *read_digits(const char *q, const char *stop, uint64_t *w) {
    uint64_t value = *w;
    if (SWAR) {
        while (stop - q >= 8) {
            if (!is_digit(q[1])) break; /* one digit or none: the loop below */
            const uint64_t word = load8(q);
            const uint64_t others = non_digits(word);
            if (others == 0) {
                value = value * POW10_INT[8] + eight_digits_value(word);
                q += 8;
                continue;
            }
            const int k = __builtin_ctzll(others) >> 3; /* the digits before the first other */
            if (k > 0) {
                /* The k digits moved to the top bytes, '0's below: the same value. */
                const uint64_t padded =
                    (word << (8 * (8 - k))) | (UINT64_C(0x3030303030303030) >> (8 * k));
                value = value * POW10_INT[k] + eight_digits_value(padded);
                q += k;
            }
            *w = value;
            return q;
        }
    }
    while (q < stop && is_digit(*q)) value = value * 10 + (uint64_t)(*q++ - '0');
    *w = value;
    return q;
}

/* The power of ten of a number's first non-zero digit (its exponent aside), or INT32_MIN
 * when every digit is zero; `digits` .. `stop` is "int[.frac]". */
static long leading_power(const char *digits, const char *stop) {
    const char *point = digits;
    while (point < stop && *point != '.') point++;
    for (const char *q = digits; q < stop; q++) {
        if (*q == '.' || *q == '0') continue;
        return q < point ? (long)(point - q) - 1 : -(long)(q - point);
    }
    return INT32_MIN;
}

/* ---------------------------------------------------------- Eisel-Lemire ---------- */

/* w * 10^q correctly rounded to a double, for any w < 2^64 (up to 19 digits) that Clinger's
 * fast path does not cover: the 17 digits of a float written through Python's floats above
 * all ("0.12573021650314331"). Eisel and Lemire's method (Lemire, "Number parsing at a
 * gigabyte per second", 2021): w, shifted so its top bit is set, times the 128-bit
 * significand of 5^q (_pow5.h, pow5_table.py) gives the double's 53 bits and one more to
 * round on, and the power of two comes from q * log2(10) in fixed point; the second 64 bits
 * of the table's entry are only needed when the first product's low bits are all ones.
 * Mushtak and Lemire proved ("Fast number parsing without fallback", 2023) that this
 * decides every such w and q; the one case the 2021 paper left to a slower parser (the
 * bits below still all ones after the second product) goes to PyOS_string_to_double here
 * all the same, as do subnormal and infinite results. 1 with *value set, else 0. */
#if defined(__SIZEOF_INT128__)
#include "_pow5.h"

static inline int eisel_lemire(uint64_t w, long q, int neg, double *value) {
    if (w == 0 || q < POW5_MIN_Q || q > POW5_MAX_Q) return 0;
    const int lz = __builtin_clzll(w);
    w <<= lz;
    const uint64_t *const entry = &POW5_128[2 * (q - POW5_MIN_Q)];
    const unsigned __int128 product = (unsigned __int128)w * entry[0];
    uint64_t high = (uint64_t)(product >> 64), low = (uint64_t)product;
    /* 64 - 52 - 3: the bits below the 53 kept, the rounding bit and the one that may lead. */
    const uint64_t below = 0x1FF;
    if ((high & below) == below) {
        const uint64_t carry = (uint64_t)(((unsigned __int128)w * entry[1]) >> 64);
        low += carry;
        if (low < carry) high++;
        if ((high & below) == below && low == UINT64_MAX) return 0;
    }
    const int upper = (int)(high >> 63);
    const int shift = upper + 9;
    uint64_t mantissa = high >> shift; /* 54 bits: the double's 53, then the rounding bit */
    /* floor(q * log2(10)) as (217706 * q) >> 16, plus the product's own exponent, biased. */
    long power2 = ((217706 * q) >> 16) + 63 + upper - lz + 1023;
    if (power2 <= 0) return 0; /* subnormal */
    /* Exactly halfway (the bits below the rounding bit all zero, which only 5^q of these
     * exponents can give): round to even, not up. */
    if (low <= 1 && q >= -4 && q <= 23 && (mantissa & 3) == 1 && (mantissa << shift) == high)
        mantissa &= ~UINT64_C(1);
    mantissa += mantissa & 1;
    mantissa >>= 1;
    if (mantissa >= (UINT64_C(2) << 52)) { /* rounding carried into a 54th bit */
        mantissa = UINT64_C(1) << 52;
        power2++;
    }
    if (power2 >= 0x7FF) return 0; /* infinite */
    const uint64_t bits = (mantissa & ~(UINT64_C(1) << 52)) | ((uint64_t)power2 << 52) |
                          ((uint64_t)neg << 63);
    memcpy(value, &bits, 8);
    return 1;
}
#else /* no 128-bit integers: PyOS_string_to_double reads them */
static inline int eisel_lemire(uint64_t w, long q, int neg, double *value) {
    (void)w, (void)q, (void)neg, (void)value;
    return 0;
}
#endif

/* ------------------------------------------------------------ quick runs ------------ */

/* Runs of plain decimals, the body of a float tensor's data as clients write it, read with
 * SSSE3 and without a data-dependent branch per number: a 64-byte bitmap of the commas
 * gives each token's end before the token is read, so the numbers' conversions overlap.
 * Only for tokens whose value read_number would give by Clinger's fast path; anything else
 * ends the run, and read_number reads it. Chosen at run time (have_ssse3), so the module
 * still loads on a CPU without SSSE3. */
#if SWAR && FAST_PATH && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <tmmintrin.h>
#define QUICK 1
#define QUICK_TARGET __attribute__((target("ssse3")))
/* The window of commas, and how far past a token's start quick_number reads (its sign,
 * then 16 bytes). */
#define QUICK_WINDOW 64
#define QUICK_READ 17

/* The multipliers that fold a token's sixteen digits (one a byte, most significant first)
 * into two eight-digit halves, shared by quick_number (SSE, one token) and wide_convert
 * (AVX2, four): adjacent digits x10 + x1 (maddubs), adjacent pairs x100 + x1 (madd), then
 * adjacent fours x10^4 + x1 (madd again). */
#define FOLD_PAIRS 0x010A       /* 10, 1 as two bytes */
#define FOLD_FOURS 0x00010064   /* 100, 1 as two 16-bit words */
#define FOLD_EIGHTS 0x00012710  /* 10^4, 1 as two 16-bit words */

static int have_ssse3;
/* AVX2 wide runs (see wide_run): whether the CPU has them, and whether they are taken. */
static int have_wide, wide_enabled = 1;
/* AVX-512 windows for wide runs (see wide512_run): whether the CPU has them, and whether
 * they are taken. */
static int have_wide512, wide512_enabled = 1;
/* Tokens read by quick runs since import: for the tests that the runs are taken. */
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

/* The token at q when it is -?(0|[1-9][0-9]*)(.[0-9]+)?, at most 15 characters after its
 * sign: its length, and in *value what read_number gives when a comma follows it (w <
 * 10^15, e10 >= -14: Clinger's fast path). 0 for any other token. Reads 17 bytes. */
static inline __attribute__((always_inline)) QUICK_TARGET int quick_number(const char *q,
                                                                            double *value) {
    const int neg = *q == '-';
    const char *const b = q + neg;
    const __m128i chunk = _mm_loadu_si128((const __m128i *)b);
    const __m128i digit = _mm_and_si128(_mm_cmpgt_epi8(chunk, _mm_set1_epi8('0' - 1)),
                                        _mm_cmplt_epi8(chunk, _mm_set1_epi8('9' + 1)));
    const unsigned digit_bits = (unsigned)_mm_movemask_epi8(digit);
    const unsigned dot_bits =
        (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(chunk, _mm_set1_epi8('.')));
    const int len = __builtin_ctz(~(digit_bits | dot_bits)); /* digits and points: 0..16 */
    const unsigned dot = dot_bits & ((1u << len) - 1);
    const int has_dot = dot != 0;
    const int int_len = __builtin_ctz(dot | (1u << len)); /* len when there is no point */
    const int frac_len = len - int_len - has_dot;
    /* Bitwise, not ||: one branch for all of them. (What follows the token is quick_run's
     * to check: a comma.) */
    const int other = (len > 15) | ((dot & (dot - 1)) != 0) | (int_len == 0) |
                      (has_dot & (frac_len == 0)) | ((b[0] == '0') & (int_len > 1));
    if (other) return 0;
    const __m128i digits =
        _mm_shuffle_epi8(_mm_sub_epi8(chunk, _mm_set1_epi8('0')),
                         _mm_load_si128((const __m128i *)DIGIT_SHUFFLE[len][int_len]));
    const __m128i pairs = _mm_maddubs_epi16(digits, _mm_set1_epi16(FOLD_PAIRS));
    const __m128i fours = _mm_madd_epi16(pairs, _mm_set1_epi32(FOLD_FOURS));
    const __m128i packed = _mm_packs_epi32(fours, fours);                     /* < 10^4 */
    const __m128i eights = _mm_madd_epi16(packed, _mm_set1_epi32(FOLD_EIGHTS));
    const uint64_t halves = (uint64_t)_mm_cvtsi128_si64(eights);
    const uint64_t w = (halves & 0xFFFFFFFFu) * 100000000u + (halves >> 32);
    double d = (double)w / POW10[frac_len];
    /* A negative integer zero is the int 0 (+0.0 as a float); a decimal keeps its sign. */
    uint64_t bits;
    memcpy(&bits, &d, 8);
    bits ^= (uint64_t)(neg & (has_dot | (w != 0))) << 63;
    memcpy(&d, &bits, 8);
    *value = d;
    return neg + len;
}

static inline QUICK_TARGET uint64_t comma_bits(const char *q) {
    const __m128i comma = _mm_set1_epi8(',');
    uint64_t bits = 0;
    for (int i = 0; i < QUICK_WINDOW / 16; i++) {
        const __m128i chunk = _mm_loadu_si128((const __m128i *)(q + 16 * i));
        bits |= (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(chunk, comma)) << (16 * i);
    }
    return bits;
}

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

/* The tokens at s[p], each followed by a comma (then whitespace), into out[count...] as
 * FP32 (size 4) or FP64, none past `expected`. How many were read, *end where the first
 * one not read starts; -1 when that is the first and it is not of the quick form. A quick
 * token's value is finite as FP32 too (under 10^15). `wide`: the array's WideState. */
static QUICK_TARGET __attribute__((noinline)) Py_ssize_t
quick_run(const char *s, Py_ssize_t p, Py_ssize_t n, int size, char *out, Py_ssize_t count,
          Py_ssize_t expected, WideState *wide, Py_ssize_t *end) {
    const Py_ssize_t first = count;
    Py_ssize_t wide_read = -1; /* -1: no wide run tried */
    while (n - p >= QUICK_WINDOW + QUICK_READ) {
        const Py_ssize_t base = p;
        uint64_t commas = comma_bits(s + base);
        if (commas == 0) break;
        do {
            const Py_ssize_t next = base + __builtin_ctzll(commas);
            double d;
            const int len = quick_number(s + p, &d);
            if (len == 0 || p + len != next) {
                if (len == 0 && count == first) return -1;
                goto done;
            }
            if (count < expected) {
                if (size == 4)
                    ((float *)out)[count] = (float)d;
                else
                    ((double *)out)[count] = d;
            }
            count++;
            p = skip_ws(s, next + 1, n);
            commas &= commas - 1;
            /* A wide run is tried after the first token, once it is known to be a quick
             * one followed by a comma: a run at a row's last value or at a token of
             * another form tells nothing of what wide runs read. */
            if (__builtin_expect(count == first + 1 && have_wide && wide_enabled, 0)) {
                if (wide->pause > 0) {
                    wide->pause--;
                    continue;
                }
                Py_ssize_t stop;
                wide_read = have_wide512 && wide512_enabled
                                ? wide512_run(s, p, n, size, out, count, expected, &stop)
                                : wide_run(s, p, n, size, out, count, expected, &stop);
                if (wide_read > 0) {
                    count += wide_read;
                    p = skip_ws(s, stop, n);
                    break; /* a new window of commas from there */
                }
            }
        } while (commas != 0);
    }
done:
    *end = p;
    if (wide_read >= 0) wide_judge(wide, wide_read, count - first);
    quick_tokens += (unsigned long long)(count - first);
    return count - first;
}

/* ------------------------------------------------------------- wide runs ------------ */

/* Quick runs of compact arrays (a comma and nothing else after each token), read with AVX2
 * a 64-byte window at a time where the CPU has it (have_wide), about twice as fast as
 * quick_run's loop: the window's bytes are classified at once (commas, points, minus signs,
 * digits and zeros as 64-bit maps), its tokens up to the first other byte (whitespace, an
 * exponent, a bracket) are taken when the maps show every one of them is of the quick form
 * (no branch per token), each token's digits are shuffled into place, and four tokens at a
 * time are made into doubles, divided by their powers of ten (the correctly rounded
 * division of quick_number) and stored. What a window does not take, quick_run's loop
 * reads as before. */
#include <immintrin.h>
#define WIDE_TARGET __attribute__((target("avx2,bmi,bmi2")))
/* Tokens converted at a time; a window adds at most 32 (each token and its comma); four
 * entries of padding for the last group of four. */
#define WIDE_BATCH 64
#define WIDE_ROOM (WIDE_BATCH + QUICK_WINDOW / 2 + 4)

static unsigned long long wide_tokens;

typedef struct {
    __m128i digits[WIDE_ROOM]; /* a token's ASCII digits right-aligned, zero bytes before */
    double scale[WIDE_ROOM];   /* 10^(digits after its point) */
    uint64_t sign[WIDE_ROOM];  /* its sign bit */
} WideBatch;

static inline WIDE_TARGET uint64_t bits64(__m256i low, __m256i high) {
    return (uint64_t)(uint32_t)_mm256_movemask_epi8(low) |
           ((uint64_t)(uint32_t)_mm256_movemask_epi8(high) << 32);
}

static inline WIDE_TARGET uint64_t byte_bits(__m256i low, __m256i high, char c) {
    const __m256i v = _mm256_set1_epi8(c);
    return bits64(_mm256_cmpeq_epi8(low, v), _mm256_cmpeq_epi8(high, v));
}

static inline WIDE_TARGET __m256i digit_bytes(__m256i v) {
    const __m256i d = _mm256_sub_epi8(v, _mm256_set1_epi8('0'));
    return _mm256_cmpeq_epi8(_mm256_min_epu8(d, _mm256_set1_epi8(9)), d);
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

/* The tokens at w (a token starts there) that end at a comma within 64 bytes, appended to
 * the batch from entry k: how many, with *taken the bytes they and their commas span; 0
 * when any of them is not of the quick form (quick_window_tokens), more than 15 characters
 * after the sign, or there is no comma. Reads 80 bytes. */
static inline WIDE_TARGET int wide_window(const char *w, WideBatch *batch, int k, int *taken) {
    const __m256i low = _mm256_loadu_si256((const __m256i *)w);
    const __m256i high = _mm256_loadu_si256((const __m256i *)(w + 32));
    WindowMaps m;
    m.commas = byte_bits(low, high, ',');
    if (m.commas == 0) return 0;
    m.points = byte_bits(low, high, '.');
    m.minus = byte_bits(low, high, '-');
    m.digits = bits64(digit_bytes(low), digit_bytes(high));
    m.zeros = byte_bits(low, high, '0');
    const int last = quick_window_tokens(&m);
    if (last < 0) return 0;
    const uint64_t commas = m.commas, points = m.points, minus = m.minus;
    const uint64_t ends = points | commas; /* a token's integer part ends at either */
    uint64_t rest = commas;
    int start = 0, i = k, lengths = 0;
    do {
        const int comma = __builtin_ctzll(rest);
        rest &= rest - 1;
        const int neg = (int)((minus >> start) & 1);
        const int b = start + neg;
        const int len = comma - b; /* digits and point */
        const int int_len = __builtin_ctzll(ends >> b);
        lengths |= len;
        /* (A token over 15 characters refuses the window below: & 15 keeps its reads
         * inside the tables until then.) */
        const int form = (len & 15) * 16 + (int_len & 15);
        const __m128i chunk = _mm_loadu_si128((const __m128i *)(w + b));
        batch->digits[i] = _mm_shuffle_epi8(chunk, ((const __m128i *)DIGIT_SHUFFLE)[form]);
        batch->scale[i] = (&DIGIT_SCALE[0][0])[form];
        batch->sign[i] = (uint64_t)neg << 63;
        i++;
        start = comma + 1;
    } while (rest != 0);
    if (lengths & ~15) return 0; /* a token longer than 15 characters */
    *taken = last + 1;
    return i - k;
}

/* The batch's `count` tokens as doubles into out (FP32: size 4, else FP64), four at a time. */
static inline WIDE_TARGET void wide_convert(WideBatch *batch, int count, int size, char *out) {
    for (int i = count; i < count + 4; i++) { /* the last group's padding */
        batch->digits[i] = _mm_setzero_si128();
        batch->scale[i] = 1.0;
        batch->sign[i] = 0;
    }
    const __m256i zero_char = _mm256_set1_epi8('0');
    const __m256i magic = _mm256_set1_epi64x(INT64_C(0x4330000000000000)); /* 2^52 */
    for (int i = 0; i < count; i += 4) {
        /* Tokens i, i+1 in the lanes of a; i+2, i+3 in b's. Padding bytes stay zero. */
        __m256i a = _mm256_loadu_si256((const __m256i *)&batch->digits[i]);
        __m256i b = _mm256_loadu_si256((const __m256i *)&batch->digits[i + 2]);
        a = _mm256_subs_epu8(a, zero_char);
        b = _mm256_subs_epu8(b, zero_char);
        a = _mm256_madd_epi16(_mm256_maddubs_epi16(a, _mm256_set1_epi16(FOLD_PAIRS)),
                              _mm256_set1_epi32(FOLD_FOURS));
        b = _mm256_madd_epi16(_mm256_maddubs_epi16(b, _mm256_set1_epi16(FOLD_PAIRS)),
                              _mm256_set1_epi32(FOLD_FOURS));
        /* Per lane: the high and low eight digits of tokens i and i+2 (i+1 and i+3). */
        const __m256i eights =
            _mm256_madd_epi16(_mm256_packs_epi32(a, b), _mm256_set1_epi32(FOLD_EIGHTS));
        const __m256i w = _mm256_add_epi64(_mm256_mul_epu32(eights, _mm256_set1_epi64x(100000000)),
                                           _mm256_srli_epi64(eights, 32));
        /* w < 10^15 < 2^52: exact as the double 2^52 + w, less 2^52. */
        __m256d d = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(w, magic)),
                                  _mm256_set1_pd(4503599627370496.0));
        d = _mm256_permute4x64_pd(d, _MM_SHUFFLE(3, 1, 2, 0)); /* i, i+1, i+2, i+3 */
        d = _mm256_div_pd(d, _mm256_loadu_pd(&batch->scale[i]));
        d = _mm256_xor_pd(d, _mm256_castsi256_pd(
                                 _mm256_loadu_si256((const __m256i *)&batch->sign[i])));
        const int left = count - i;
        if (size == 4) {
            const __m128 f = _mm256_cvtpd_ps(d);
            if (left >= 4)
                _mm_storeu_ps((float *)out + i, f);
            else
                _mm_maskstore_ps((float *)out + i,
                                 _mm_cmpgt_epi32(_mm_set1_epi32(left), _mm_setr_epi32(0, 1, 2, 3)),
                                 f);
        } else if (left >= 4) {
            _mm256_storeu_pd((double *)out + i, d);
        } else {
            _mm256_maskstore_pd((double *)out + i,
                                _mm256_cmpgt_epi64(_mm256_set1_epi64x(left),
                                                   _mm256_setr_epi64x(0, 1, 2, 3)),
                                d);
        }
    }
}

/* Windows of quick tokens from s[p], as quick_run reads them, into out[count...] (none past
 * `expected`): how many were read; *end where the first one not read starts. */
static WIDE_TARGET __attribute__((noinline)) Py_ssize_t
wide_run(const char *s, Py_ssize_t p, Py_ssize_t n, int size, char *out, Py_ssize_t count,
         Py_ssize_t expected, Py_ssize_t *end) {
    WideBatch batch;
    Py_ssize_t read = 0;
    int pending = 0;
    while (n - p >= QUICK_WINDOW + QUICK_READ) {
        int taken;
        const int got = wide_window(s + p, &batch, pending, &taken);
        if (got == 0 || count + read + pending + got > expected) break;
        pending += got;
        p += taken;
        if (pending >= WIDE_BATCH) {
            wide_convert(&batch, pending, size, out + (count + read) * size);
            read += pending;
            pending = 0;
        }
    }
    if (pending > 0) {
        wide_convert(&batch, pending, size, out + (count + read) * size);
        read += pending;
    }
    *end = p;
    wide_tokens += (unsigned long long)read;
    return read;
}

/* ---------------------------------------------------------- AVX-512 windows --------- */

/* Wide runs with AVX-512 (VBMI2's byte compress, VBMI's byte permute) where the CPU has
 * them (have_wide512): up to eight tokens a 64-byte window, with no loop over its tokens.
 * The window's digits are compressed together (points, signs dropped; commas kept between
 * tokens), each token's digits permuted right-aligned into a 16-byte lane from the
 * commas' places there, folded into integers four tokens a register, divided by their
 * powers of ten (the number of digits after their points, from the points' and commas'
 * places) and stored with one masked store: the values of wide_window's path, the same
 * division of exact integers under 10^15. */
#define WIDE512_TARGET \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx512vbmi2,bmi,bmi2")))
#define WIDE512_TOKENS 8

static unsigned long long wide512_tokens;

/* Byte i of a 64-byte register: i; the token of a group of four whose lane holds it
 * (i / 16); and its place in that lane less 16 (i % 16 - 16). */
static uint8_t BYTE_INDEX[64] __attribute__((aligned(64)));
static uint8_t LANE_TOKEN[64] __attribute__((aligned(64)));
static int8_t LANE_OFFSET[64] __attribute__((aligned(64)));

static void wide512_init(void) {
    for (int i = 0; i < 64; i++) {
        BYTE_INDEX[i] = (uint8_t)i;
        LANE_TOKEN[i] = (uint8_t)(i / 16);
        LANE_OFFSET[i] = (int8_t)(i % 16 - 16);
    }
}

/* The 16-byte lanes of tokens first to first + 3: each token's digits right-aligned, zero
 * bytes before them. `packed`: the window's digits and commas, packed; `ends`: each
 * token's comma place there; `before`: the place of the comma before it (-1: none). */
static inline WIDE512_TARGET __m512i lane_digits(__m512i packed, __m512i ends, __m512i before,
                                                 int first) {
    const __m512i token = _mm512_add_epi8(_mm512_load_si512((const void *)LANE_TOKEN),
                                          _mm512_set1_epi8((char)first));
    /* Byte j of a token's lane: the packed byte at its comma's place - 16 + j, when that
     * is after the comma before it. */
    const __m512i index = _mm512_add_epi8(_mm512_permutexvar_epi8(token, ends),
                                          _mm512_load_si512((const void *)LANE_OFFSET));
    const __mmask64 inside =
        _mm512_cmpgt_epi8_mask(index, _mm512_permutexvar_epi8(token, before));
    return _mm512_maskz_permutexvar_epi8(inside, index, packed);
}

/* Up to eight tokens at w (a token starts there) that end at a comma within 64 bytes, as
 * FP32 (size 4) or FP64 into out, none past `room` values: how many, with *taken the bytes
 * they and their commas span; 0 (nothing stored) when any of them is not of the quick form
 * (quick_window_tokens) or has more than 15 digits, when there is no comma, or when they
 * are more than `room`. Reads 64 bytes. */
static inline WIDE512_TARGET int wide512_window(const char *w, int size, char *out,
                                                Py_ssize_t room, int *taken) {
    const __m512i bytes = _mm512_loadu_si512((const void *)w);
    WindowMaps m;
    m.commas = _mm512_cmpeq_epi8_mask(bytes, _mm512_set1_epi8(','));
    if (m.commas == 0) return 0;
    /* At most eight tokens: the commas from the ninth on are dropped. */
    const uint64_t ninth = _pdep_u64(UINT64_C(1) << WIDE512_TOKENS, m.commas);
    if (ninth) m.commas &= ninth - 1;
    const __m512i values = _mm512_sub_epi8(bytes, _mm512_set1_epi8('0'));
    m.points = _mm512_cmpeq_epi8_mask(bytes, _mm512_set1_epi8('.'));
    m.minus = _mm512_cmpeq_epi8_mask(bytes, _mm512_set1_epi8('-'));
    m.digits = _mm512_cmple_epu8_mask(values, _mm512_set1_epi8(9));
    m.zeros = _mm512_cmpeq_epi8_mask(bytes, _mm512_set1_epi8('0'));
    const int last = quick_window_tokens(&m);
    if (last < 0) return 0;
    const uint64_t commas = m.commas, digits = m.digits;
    const int count = __builtin_popcountll(commas);
    if (count > room) return 0;
    /* The digits after a point (the carry of the bit after a point runs through them), and
     * where each token's integer part ends: at its point, else at its comma. */
    const uint64_t fraction = digits & ~((m.points << 1) + digits);
    const uint64_t int_ends = m.points | (commas & ~(fraction << 1));
    const __m512i index = _mm512_load_si512((const void *)BYTE_INDEX);
    const __m512i comma_at = _mm512_maskz_compress_epi8(commas, index);
    const __m512i int_end_at = _mm512_maskz_compress_epi8(int_ends, index);
    /* Digits after the point: comma - point - 1, none when the comma ends the integer. */
    const __m512i scale_of = _mm512_subs_epu8(_mm512_sub_epi8(comma_at, int_end_at),
                                              _mm512_set1_epi8(1));
    /* The digits and commas alone, packed; each comma's place there. */
    const uint64_t kept = digits | commas;
    const __m512i packed = _mm512_maskz_compress_epi8(kept, values);
    const __m512i ends = _mm512_maskz_compress_epi8(_pext_u64(commas, kept), index);
    const __m512i before = _mm512_mask_permutexvar_epi8(
        _mm512_set1_epi8(-1), ~UINT64_C(1),
        _mm512_sub_epi8(index, _mm512_set1_epi8(1)), ends);
    /* At most 15 digits a token: its integer is exact, under 10^15. */
    const __mmask64 tokens = (__mmask64)((UINT64_C(1) << count) - 1);
    const __m512i lengths = _mm512_sub_epi8(ends, before);  /* digits + 1 */
    if (_mm512_mask_cmpgt_epi8_mask(tokens, lengths, _mm512_set1_epi8(16))) return 0;
    /* Four tokens a register: pairs of digits, fours, then eights (as wide_convert). */
    __m512i a = lane_digits(packed, ends, before, 0);
    __m512i b = lane_digits(packed, ends, before, 4);
    a = _mm512_madd_epi16(_mm512_maddubs_epi16(a, _mm512_set1_epi16(FOLD_PAIRS)),
                          _mm512_set1_epi32(FOLD_FOURS));
    b = _mm512_madd_epi16(_mm512_maddubs_epi16(b, _mm512_set1_epi16(FOLD_PAIRS)),
                          _mm512_set1_epi32(FOLD_FOURS));
    /* Per 128-bit lane i: the high and low eight digits of tokens i and 4 + i. */
    const __m512i eights =
        _mm512_madd_epi16(_mm512_packs_epi32(a, b), _mm512_set1_epi32(FOLD_EIGHTS));
    __m512i whole = _mm512_add_epi64(_mm512_mul_epu32(eights, _mm512_set1_epi64(100000000)),
                                     _mm512_srli_epi64(eights, 32));
    whole = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), whole);
    __m512d d = _mm512_cvtepu64_pd(whole);
    const __m512i scale_index = _mm512_cvtepu8_epi64(_mm512_castsi512_si128(scale_of));
    d = _mm512_div_pd(d, _mm512_permutex2var_pd(_mm512_loadu_pd(POW10), scale_index,
                                                _mm512_loadu_pd(POW10 + 8)));
    /* The signs: one bit a token, from the minus signs at the tokens' starts. */
    const uint64_t starts = (commas << 1) | 1;
    const __mmask8 negative = (__mmask8)_pext_u64(m.minus, starts);
    d = _mm512_mask_xor_pd(d, negative, d, _mm512_set1_pd(-0.0));
    const __mmask8 stored = (__mmask8)tokens;
    if (size == 4)
        _mm256_mask_storeu_ps((float *)out, stored, _mm512_cvtpd_ps(d));
    else
        _mm512_mask_storeu_pd((double *)out, stored, d);
    *taken = last + 1;
    return count;
}

/* wide_run with AVX-512 windows. */
static WIDE512_TARGET __attribute__((noinline)) Py_ssize_t
wide512_run(const char *s, Py_ssize_t p, Py_ssize_t n, int size, char *out, Py_ssize_t count,
            Py_ssize_t expected, Py_ssize_t *end) {
    Py_ssize_t read = 0;
    while (n - p >= QUICK_WINDOW + QUICK_READ) {
        int taken;
        const int got = wide512_window(s + p, size, out + (count + read) * size,
                                       expected - count - read, &taken);
        if (got == 0) break;
        read += got;
        p += taken;
    }
    *end = p;
    wide512_tokens += (unsigned long long)read;
    wide_tokens += (unsigned long long)read;
    return read;
}
#else
#define QUICK 0
#endif

/* One number token at s[p] into out[index] as the datatype; *end is where it stops.
 * UNSUPPORTED for anything not exactly handled (the grammar included). */
static inline __attribute__((always_inline)) Outcome
read_number(const char *s, Py_ssize_t p, Py_ssize_t n, const DType dt, char *out, Py_ssize_t index,
            int store, Py_ssize_t *end, Py_ssize_t *slow) {
    const char *const token = s + p, *const stop = s + n;
    const char *q = token;
    const int neg = *q == '-';
    q += neg;
    /* Integer part: "0" or [1-9][0-9]*. */
    if (q >= stop || !is_digit(*q)) return UNSUPPORTED;
    const char *const int_start = q;
    uint64_t w = 0; /* the digits, int and fraction, as an integer (exact up to 19 of them) */
    if (*q == '0')
        q++;
    else
        q = read_digits(q, stop, &w);
    const Py_ssize_t int_len = q - int_start;
    Py_ssize_t digits = *int_start == '0' ? 0 : int_len; /* those that went into w */
    Py_ssize_t frac_len = 0;
    int is_float = 0;
    if (q < stop && *q == '.') {
        is_float = 1;
        const char *const frac_start = ++q;
        q = read_digits(q, stop, &w);
        frac_len = q - frac_start;
        if (frac_len == 0) return UNSUPPORTED;
        digits += frac_len;
    }
    const char *const digits_end = q;
    long exp = 0;
    if (q < stop && (*q == 'e' || *q == 'E')) {
        is_float = 1;
        q++;
        int exp_neg = 0;
        if (q < stop && (*q == '+' || *q == '-')) exp_neg = *q++ == '-';
        if (q >= stop || !is_digit(*q)) return UNSUPPORTED;
        while (q < stop && is_digit(*q)) {
            if (exp < 100000) exp = exp * 10 + (*q - '0');
            q++;
        }
        if (exp >= 100000) return UNSUPPORTED; /* left to orjson (it gives 0 or an error) */
        if (exp_neg) exp = -exp;
    }
    *end = q - s;

    if (!is_float) {
        /* An integer: orjson gives a Python int; numpy an int64 array (or float64 beside
         * floats, exact below 2^53). */
        if (dt.family == T_BOOL || int_len > MAX_INT_DIGITS) return UNSUPPORTED;
        const int64_t v = neg ? -(int64_t)w : (int64_t)w;
        if (dt.family == T_FLOAT) {
            if (int_len > MAX_EXACT_FLOAT_INT_DIGITS) return UNSUPPORTED;
            if (store) {
                if (dt.size == 4)
                    ((float *)out)[index] = (float)(double)v;
                else
                    ((double *)out)[index] = (double)v;
            }
            return CONVERTED;
        }
        if (v < dt.lo || v > dt.hi) return UNSUPPORTED; /* the decoder's range error */
        if (store) {
            switch (dt.size) {
            case 1: ((int8_t *)out)[index] = (int8_t)v; break;
            case 2: ((int16_t *)out)[index] = (int16_t)v; break;
            case 4: ((int32_t *)out)[index] = (int32_t)v; break;
            default: ((int64_t *)out)[index] = v; break;
            }
        }
        return CONVERTED;
    }

    if (dt.family != T_FLOAT) return UNSUPPORTED; /* the decoder's "must be integers" */
    double d;
    const long e10 = exp - (long)frac_len;
    if (FAST_PATH && digits <= 19 && w <= (UINT64_C(1) << 53) && e10 >= -22 && e10 <= 22) {
        /* w and 10^|e10| are exact doubles: one correctly rounded operation (w == 0 gives
         * a zero of the token's sign, as float() does). */
        d = e10 >= 0 ? (double)w * POW10[e10] : (double)w / POW10[-e10];
        if (neg) d = -d;
    } else if (!(digits <= 19 && eisel_lemire(w, e10, neg, &d))) {
        const long lead = leading_power(int_start, digits_end);
        if (lead == INT32_MIN) {
            d = neg ? -0.0 : 0.0; /* every digit is zero, whatever the exponent */
        } else {
            /* Past 10^308 the value is infinite or nearly so (orjson refuses infinity);
             * below 10^-400 it is zero: both left to orjson. */
            if (lead + exp > 308 || lead + exp < -400) return UNSUPPORTED;
            char buffer[MAX_TOKEN + 1];
            const Py_ssize_t len = q - token;
            if (len > MAX_TOKEN) return UNSUPPORTED;
            ++*slow;
            memcpy(buffer, token, (size_t)len);
            buffer[len] = '\0';
            char *parsed_to = NULL;
            d = PyOS_string_to_double(buffer, &parsed_to, NULL);
            if (d == -1.0 && PyErr_Occurred()) return FAILED;
            if (parsed_to != buffer + len) return UNSUPPORTED;
            if (isinf(d)) return UNSUPPORTED; /* orjson refuses it */
        }
    }
    if (dt.size == 4) {
        const float f = (float)d;
        if (isinf(f)) return UNSUPPORTED; /* the decoder's "out of range for FP32" */
        if (store) ((float *)out)[index] = f;
    } else if (store) {
        ((double *)out)[index] = d;
    }
    return CONVERTED;
}

/* ---------------------------------------------------------------- one array --------- */

typedef struct {
    Py_ssize_t end;   /* just after the array's closing bracket */
    Py_ssize_t count; /* numbers read (all of them, also past `expected`) */
} ArrayResult;

/* The array at s[p] == '[' into `out` (room for `expected` elements), row-major, as numpy
 * reads nested lists. CONVERTED only when the nesting is regular (every list at one level
 * as long as the others, all numbers at one depth, no empty inner list) and no deeper than
 * `max_ndim`: then numpy builds an array of `count` elements from it, and these are they. */
static inline __attribute__((always_inline)) Outcome
read_array_as(const char *s, Py_ssize_t p, Py_ssize_t n, const DType dt, char *out,
              Py_ssize_t expected, int max_ndim, ArrayResult *result) {
    Py_ssize_t dims[MAX_DATA_DEPTH + 1];
    Py_ssize_t counts[MAX_DATA_DEPTH + 1];
    int depth = 1, leaf_depth = -1;
    int quick_pause = 0; /* values to read before trying a quick run again */
    Py_ssize_t slow = 0; /* numbers read by PyOS_string_to_double */
#if QUICK
    WideState wide = {0, 0};
#endif
    for (int i = 0; i <= MAX_DATA_DEPTH; i++) dims[i] = -1;
    counts[1] = 0;
    Py_ssize_t count = 0;
    p++; /* the '[' */
    for (;;) {
        /* A value (or, right after '[', the closing ']' of an empty list). */
        p = skip_ws(s, p, n);
        if (p >= n) return UNSUPPORTED;
        char c = s[p];
        if (c == '[') {
            if (depth >= MAX_DATA_DEPTH || (leaf_depth >= 0 && depth + 1 > leaf_depth))
                return UNSUPPORTED;
            depth++;
            counts[depth] = 0;
            p++;
            continue;
        }
        if (c == ']') {
            /* Only the whole data may be empty: numpy reads [] as a 1-D array of none. */
            if (depth != 1 || counts[1] != 0) return UNSUPPORTED;
            result->end = p + 1;
            result->count = 0;
            return max_ndim >= 1 ? CONVERTED : UNSUPPORTED;
        }
        if (leaf_depth < 0) {
            if (depth > max_ndim) return UNSUPPORTED; /* the decoder's depth error */
            leaf_depth = depth;
        } else if (depth != leaf_depth) {
            return UNSUPPORTED; /* ragged */
        }
        const int store = count < expected;
        if (c == '-' || is_digit(c)) {
            if (dt.family == T_BOOL) return UNSUPPORTED;
#if QUICK
            if (dt.family == T_FLOAT && have_ssse3 && quick_pause == 0) {
                Py_ssize_t stop;
                const Py_ssize_t read =
                    quick_run(s, p, n, dt.size, out, count, expected, &wide, &stop);
                if (read > 0) {
                    /* Each one was followed by a comma: the next value starts at stop. */
                    count += read;
                    counts[depth] += read;
                    p = stop;
                    continue;
                }
                if (read < 0) quick_pause = 16; /* other forms: no quick runs for a while */
            } else if (quick_pause > 0) {
                quick_pause--;
            }
#endif
            Py_ssize_t stop;
            Outcome outcome = read_number(s, p, n, dt, out, count, store, &stop, &slow);
            if (outcome != CONVERTED) return outcome;
            if (slow > SLOW_TRIAL && 4 * slow > count) return SLOW;
            p = stop;
        } else if (c == 't' || c == 'f') {
            if (dt.family != T_BOOL) return UNSUPPORTED;
            const int truth = c == 't';
            const char *word = truth ? "true" : "false";
            const Py_ssize_t len = truth ? 4 : 5;
            if (n - p < len || memcmp(s + p, word, (size_t)len) != 0) return UNSUPPORTED;
            if (store) ((uint8_t *)out)[count] = (uint8_t)truth;
            p += len;
        } else {
            return UNSUPPORTED; /* strings, null, NaN, objects, garbage: orjson's to judge */
        }
        count++;
        counts[depth]++;
        /* After a value: ',' then another, or ']' closing one list or more. */
        for (;;) {
            p = skip_ws(s, p, n);
            if (p >= n) return UNSUPPORTED;
            c = s[p];
            if (c == ',') {
                p++;
                break;
            }
            if (c != ']') return UNSUPPORTED;
            p++;
            if (dims[depth] < 0)
                dims[depth] = counts[depth];
            else if (dims[depth] != counts[depth])
                return UNSUPPORTED; /* ragged */
            depth--;
            if (depth == 0) {
                result->end = p;
                result->count = count;
                return CONVERTED;
            }
            counts[depth]++;
        }
    }
}

/* read_array_as compiled for FP32 and FP64 apart: their datatype is a constant there. */
static Outcome read_array(const char *s, Py_ssize_t p, Py_ssize_t n, const DType *dt, char *out,
                          Py_ssize_t expected, int max_ndim, ArrayResult *result) {
    if (dt->family == T_FLOAT && dt->size == 4)
        return read_array_as(s, p, n, (DType){"FP32", T_FLOAT, 4, 0, 0}, out, expected,
                             max_ndim, result);
    if (dt->family == T_FLOAT)
        return read_array_as(s, p, n, (DType){"FP64", T_FLOAT, 8, 0, 0}, out, expected,
                             max_ndim, result);
    return read_array_as(s, p, n, *dt, out, expected, max_ndim, result);
}

/* Where a data array ends when its tensor's datatype and shape come after it: only the
 * bytes a numeric or boolean array can hold, brackets balanced within MAX_DATA_DEPTH.
 * -1 when it holds anything else (then it is walked as any other JSON). */
static Py_ssize_t numeric_array_end(const char *s, Py_ssize_t p, Py_ssize_t n) {
    int depth = 0;
    for (; p < n; p++) {
        const char c = s[p];
        if (c == '[') {
            if (++depth > MAX_DATA_DEPTH) return -1;
        } else if (c == ']') {
            if (--depth == 0) return p + 1;
        } else if (!(is_digit(c) || is_ws(c) || c == ',' || c == '-' || c == '+' || c == '.' ||
                     c == 'e' || c == 'E' || c == 't' || c == 'r' || c == 'u' || c == 'f' ||
                     c == 'a' || c == 'l' || c == 's')) {
            return -1;
        }
    }
    return -1;
}

/* ---------------------------------------------------------------- the body --------- */

typedef enum { R_TOP, R_INPUTS, R_TENSOR, R_OTHER } Role;
typedef enum { K_NONE, K_INPUTS, K_DATA, K_DATATYPE, K_SHAPE } Key;

typedef struct {
    Py_ssize_t index;
    int tainted;         /* an escaped or repeated key: leave this tensor to orjson */
    int seen_data, seen_datatype, seen_shape;
    const DType *dtype;  /* NULL unless the datatype is a plain name handled here */
    int shape_ok;
    int ndims;
    Py_ssize_t dims[MAX_DATA_DEPTH];
    Py_ssize_t data_start, data_end; /* the data array, once its end is known */
    int data_done;                   /* converted when it was met */
    PyObject *values;                /* the converted array or the count it held */
} TensorState;

typedef struct {
    const char *s;
    Py_ssize_t n;
    PyObject *allocate;
    Py_ssize_t max_elements, max_bytes, spent;
    int max_ndim;
    PyObject *found; /* list of (index, datatype, shape, values, start, end) */
    TensorState tensor; /* the tensor object being walked */
} Scan;

/* A string at s[p] == '"': its end (after the closing quote), whether it has escapes. */
static Py_ssize_t string_end(const char *s, Py_ssize_t p, Py_ssize_t n, int *escaped) {
    *escaped = 0;
    for (p++; p < n; p++) {
        if (s[p] == '"') return p + 1;
        if (s[p] == '\\') {
            *escaped = 1;
            p++;
        }
    }
    return -1;
}

static Key key_of(const char *s, Py_ssize_t len) {
    if (len == 4 && memcmp(s, "data", 4) == 0) return K_DATA;
    if (len == 8 && memcmp(s, "datatype", 8) == 0) return K_DATATYPE;
    if (len == 5 && memcmp(s, "shape", 5) == 0) return K_SHAPE;
    return K_NONE;
}

/* A shape written as a list of plain non-negative integers; 0 otherwise. */
static int read_shape(const char *s, Py_ssize_t p, Py_ssize_t n, TensorState *t,
                      Py_ssize_t *end) {
    int ndims = 0;
    p = skip_ws(s, p + 1, n);
    if (p < n && s[p] == ']') {
        t->ndims = 0;
        *end = p + 1;
        return 1;
    }
    for (;;) {
        p = skip_ws(s, p, n);
        if (p >= n || !is_digit(s[p]) || ndims >= MAX_DATA_DEPTH) return 0;
        const Py_ssize_t start = p;
        Py_ssize_t v = 0;
        while (p < n && is_digit(s[p])) {
            if (p - start >= MAX_INT_DIGITS) return 0;
            v = v * 10 + (s[p++] - '0');
        }
        if (s[start] == '0' && p - start > 1) return 0;
        t->dims[ndims++] = v;
        p = skip_ws(s, p, n);
        if (p >= n) return 0;
        if (s[p] == ']') break;
        if (s[p] != ',') return 0;
        p++;
    }
    t->ndims = ndims;
    *end = p + 1;
    return 1;
}

static const DType *dtype_named(const char *s, Py_ssize_t len) {
    for (size_t i = 0; i < N_DTYPES; i++)
        if ((Py_ssize_t)strlen(DTYPES[i].name) == len && memcmp(DTYPES[i].name, s, len) == 0)
            return &DTYPES[i];
    return NULL;
}

static PyObject *shape_tuple(const TensorState *t) {
    PyObject *shape = PyTuple_New(t->ndims);
    if (shape == NULL) return NULL;
    for (int i = 0; i < t->ndims; i++) {
        PyObject *dim = PyLong_FromSsize_t(t->dims[i]);
        if (dim == NULL) {
            Py_DECREF(shape);
            return NULL;
        }
        PyTuple_SET_ITEM(shape, i, dim);
    }
    return shape;
}

/* Convert the tensor's data array at s[start] with its declared datatype and shape.
 * 1: converted (t->values set, *end after the array); 0: left to orjson; GIVE_UP: the
 * whole body left to orjson; -1: error. */
static int convert(Scan *scan, TensorState *t, Py_ssize_t start, Py_ssize_t *end) {
    if (t->dtype == NULL || !t->shape_ok || t->tainted) return 0;
    Py_ssize_t expected = 1;
    for (int i = 0; i < t->ndims; i++) {
        /* Over the limits the decoder refuses the tensor before reading its data. */
        if (t->dims[i] > scan->max_elements) return 0;
        if (__builtin_mul_overflow(expected, t->dims[i], &expected)) return 0;
    }
    Py_ssize_t bytes;
    if (expected > scan->max_elements ||
        __builtin_mul_overflow(expected, (Py_ssize_t)t->dtype->size, &bytes) ||
        bytes > scan->max_bytes - scan->spent)
        return 0;
    PyObject *array = PyObject_CallFunction(scan->allocate, "ns", expected, t->dtype->name);
    if (array == NULL) return -1;
    Py_buffer view;
    if (PyObject_GetBuffer(array, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        Py_DECREF(array);
        return -1;
    }
    if (view.len != bytes) {
        PyBuffer_Release(&view);
        Py_DECREF(array);
        PyErr_SetString(PyExc_ValueError, "allocate returned a buffer of the wrong size");
        return -1;
    }
    ArrayResult result;
    const Outcome outcome = read_array(scan->s, start, scan->n, t->dtype, (char *)view.buf,
                                       expected, scan->max_ndim, &result);
    PyBuffer_Release(&view);
    if (outcome != CONVERTED) {
        Py_DECREF(array);
        return outcome == FAILED ? -1 : outcome == SLOW ? GIVE_UP : 0;
    }
    if (result.count != expected) {
        /* The decoder's "shape needs N values, got M": the count is all it needs. */
        Py_DECREF(array);
        array = PyLong_FromSsize_t(result.count);
        if (array == NULL) return -1;
    } else {
        scan->spent += bytes;
    }
    t->values = array;
    *end = result.end;
    return 1;
}

/* A tensor object closed: keep its converted data, converting it now if it came before
 * the datatype and shape. 0, GIVE_UP, or -1 on error. */
static int finish_tensor(Scan *scan, TensorState *t) {
    if (t->data_end > 0 && !t->data_done && !t->tainted) {
        Py_ssize_t end;
        const int done = convert(scan, t, t->data_start, &end);
        if (done < 0 || done == GIVE_UP) return done;
        if (done == 1 && end != t->data_end) Py_CLEAR(t->values); /* cannot happen */
    }
    if (t->values == NULL || t->tainted) {
        Py_CLEAR(t->values);
        return 0;
    }
    PyObject *shape = shape_tuple(t);
    if (shape == NULL) return -1;
    PyObject *entry = Py_BuildValue("(nsNOnn)", t->index, t->dtype->name, shape, t->values,
                                    t->data_start, t->data_end);
    Py_CLEAR(t->values);
    if (entry == NULL) return -1;
    const int status = PyList_Append(scan->found, entry);
    Py_DECREF(entry);
    return status;
}

/* Walk the body; 1 when done, 0 to give up on it (then orjson reads all of it), -1 on
 * error. The walk trusts the body to be JSON: where it is not, orjson refuses the
 * skeleton at the same place, and the caller falls back to the whole body. */
static int walk(Scan *scan) {
    const char *s = scan->s;
    const Py_ssize_t n = scan->n;
    uint8_t roles[MAX_STACK];
    uint8_t is_object[MAX_STACK];
    int d = 0;
    int expect_key = 0, seen_inputs = 0;
    Key pending = K_NONE;
    Py_ssize_t inputs_seen = 0;
    TensorState *tensor = &scan->tensor;
    int in_tensor = 0;

    Py_ssize_t p = skip_ws(s, 0, n);
    if (p >= n || s[p] != '{') return 0;
    while (p < n) {
        const char c = s[p];
        if (is_ws(c)) {
            p++;
            continue;
        }
        if (c == ',') {
            expect_key = d > 0 && is_object[d - 1];
            p++;
            continue;
        }
        if (c == ':') {
            expect_key = 0;
            p++;
            continue;
        }
        if (c == '}' || c == ']') {
            if (d == 0) return 0;
            d--;
            if (roles[d] == R_TENSOR) {
                const int status = c == '}' ? finish_tensor(scan, tensor) : 0;
                Py_CLEAR(tensor->values);
                in_tensor = 0;
                if (status < 0) return -1;
                if (status == GIVE_UP) return 0;
            }
            expect_key = 0;
            pending = K_NONE;
            p++;
            if (d == 0) return 1; /* the top-level object: orjson judges what follows */
            continue;
        }
        const Role parent = d > 0 ? (Role)roles[d - 1] : R_TOP;
        if (c == '"' && d > 0 && is_object[d - 1] && expect_key) {
            int escaped;
            const Py_ssize_t end = string_end(s, p, n, &escaped);
            if (end < 0) return 0;
            const char *key = s + p + 1;
            const Py_ssize_t len = end - p - 2;
            pending = K_NONE;
            if (parent == R_TOP && d == 1) {
                if (escaped) return 0; /* it might spell "inputs" */
                if (len == 6 && memcmp(key, "inputs", 6) == 0) {
                    if (seen_inputs) return 0; /* a repeated key: orjson keeps the last */
                    seen_inputs = 1;
                    pending = K_INPUTS;
                }
            } else if (parent == R_TENSOR) {
                if (escaped) {
                    tensor->tainted = 1;
                } else {
                    pending = key_of(key, len);
                    int *seen = pending == K_DATA       ? &tensor->seen_data
                                : pending == K_DATATYPE ? &tensor->seen_datatype
                                : pending == K_SHAPE    ? &tensor->seen_shape
                                                        : NULL;
                    if (seen != NULL && (*seen)++) tensor->tainted = 1;
                }
            }
            expect_key = 0;
            p = end;
            continue;
        }
        /* A value starts here. */
        const Key key = pending;
        pending = K_NONE;
        Py_ssize_t element = -1;
        if (parent == R_INPUTS && d > 0 && !is_object[d - 1]) element = inputs_seen++;
        if (parent == R_TENSOR && in_tensor) {
            if (key == K_DATATYPE && c == '"') {
                int escaped;
                const Py_ssize_t end = string_end(s, p, n, &escaped);
                if (end < 0) return 0;
                tensor->dtype = escaped ? NULL : dtype_named(s + p + 1, end - p - 2);
                p = end;
                continue;
            }
            if (key == K_SHAPE && c == '[') {
                Py_ssize_t end;
                if (read_shape(s, p, n, tensor, &end)) {
                    tensor->shape_ok = 1;
                    p = end;
                    continue;
                }
            }
            if (key == K_DATA && c == '[') {
                Py_ssize_t end = -1;
                if (tensor->dtype != NULL && tensor->shape_ok) {
                    const int done = convert(scan, tensor, p, &end);
                    if (done < 0) return -1;
                    if (done == GIVE_UP) return 0;
                    if (done == 1) tensor->data_done = 1;
                    else end = -1;
                } else {
                    end = numeric_array_end(s, p, n);
                }
                if (end > 0) {
                    tensor->data_start = p;
                    tensor->data_end = end;
                    p = end;
                    continue;
                }
            }
        }
        if (c == '{' || c == '[') {
            if (d >= MAX_STACK) return 0;
            Role role = R_OTHER;
            if (c == '{' && d == 0) role = R_TOP;
            else if (c == '[' && key == K_INPUTS && d == 1) role = R_INPUTS;
            else if (c == '{' && element >= 0) role = R_TENSOR;
            if (role == R_TENSOR) {
                Py_CLEAR(tensor->values);
                memset(tensor, 0, sizeof *tensor);
                tensor->index = element;
                in_tensor = 1;
            }
            roles[d] = (uint8_t)role;
            is_object[d] = c == '{';
            d++;
            expect_key = c == '{';
            p++;
            continue;
        }
        if (d == 0) return 0;
        if (c == '"') {
            int escaped;
            const Py_ssize_t end = string_end(s, p, n, &escaped);
            if (end < 0) return 0;
            p = end;
            continue;
        }
        /* A number or a literal: up to the next delimiter. */
        while (p < n && !is_ws(s[p]) && s[p] != ',' && s[p] != ']' && s[p] != '}' &&
               s[p] != ':' && s[p] != '"' && s[p] != '[' && s[p] != '{')
            p++;
    }
    return 0; /* truncated */
}

PyDoc_STRVAR(scan_doc,
"scan(body, allocate, max_elements, max_bytes, max_ndim)\n\n"
"Read the numeric data arrays of a V2 JSON request body. Returns None when none was\n"
"read, else (skeleton, found): the body with each such array replaced by 0, and a list\n"
"of (input index, datatype, shape, values, start, end), values being the flat array\n"
"(allocate(count, datatype) made it) or, when the array held another number of values\n"
"than the shape declares, that number. max_elements and max_bytes bound what is\n"
"allocated (a tensor and the request); max_ndim is the deepest nesting read.");

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer body;
    PyObject *allocate;
    Py_ssize_t max_elements, max_bytes;
    int max_ndim;
    if (!PyArg_ParseTuple(args, "y*Onni", &body, &allocate, &max_elements, &max_bytes,
                          &max_ndim))
        return NULL;
    Scan state;
    memset(&state, 0, sizeof state);
    state.s = body.buf;
    state.n = body.len;
    state.allocate = allocate;
    state.max_elements = max_elements;
    state.max_bytes = max_bytes;
    state.max_ndim = max_ndim;
    PyObject *result = NULL;
    state.found = PyList_New(0);
    if (state.found == NULL) goto done;
    const int status = walk(&state);
    if (status < 0) goto done;
    const Py_ssize_t found = PyList_GET_SIZE(state.found);
    if (status == 0 || found == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    /* The skeleton: the body without the converted arrays, a 0 in each one's place. */
    Py_ssize_t size = body.len;
    for (Py_ssize_t i = 0; i < found; i++) {
        PyObject *entry = PyList_GET_ITEM(state.found, i);
        size -= PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 5)) -
                PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 4)) - 1;
    }
    PyObject *skeleton = PyBytes_FromStringAndSize(NULL, size);
    if (skeleton == NULL) goto done;
    char *to = PyBytes_AS_STRING(skeleton);
    Py_ssize_t from = 0;
    for (Py_ssize_t i = 0; i < found; i++) {
        PyObject *entry = PyList_GET_ITEM(state.found, i);
        const Py_ssize_t start = PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 4));
        const Py_ssize_t end = PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 5));
        memcpy(to, (const char *)body.buf + from, (size_t)(start - from));
        to += start - from;
        *to++ = '0';
        from = end;
    }
    memcpy(to, (const char *)body.buf + from, (size_t)(body.len - from));
    result = Py_BuildValue("(NO)", skeleton, state.found);
done:
    Py_XDECREF(state.tensor.values);
    Py_XDECREF(state.found);
    PyBuffer_Release(&body);
    return result;
}

PyDoc_STRVAR(quick_stats_doc,
"quick_stats()\n\n"
"(available, tokens): whether quick runs are taken on this CPU (SSSE3), and how many\n"
"number tokens they have read since import.");

static PyObject *quick_stats(PyObject *self, PyObject *unused) {
#if QUICK
    return Py_BuildValue("(OK)", have_ssse3 ? Py_True : Py_False, quick_tokens);
#else
    return Py_BuildValue("(OK)", Py_False, 0ULL);
#endif
}

PyDoc_STRVAR(wide_stats_doc,
"wide_stats(enable=None)\n\n"
"(available, taken, tokens): whether wide runs can be taken on this CPU (AVX2), whether\n"
"they are (after setting it to enable when given: for tests and benchmarks), and how many\n"
"number tokens they have read since import (also counted by quick_stats).");

/* (available, taken, tokens) of a kind of run that tests and benchmarks switch, once set
 * to `enable` when it is given (args); `enabled` is NULL where the module has no such runs. */
static PyObject *run_stats(PyObject *args, int available, int *enabled,
                           unsigned long long tokens) {
    PyObject *enable = Py_None;
    if (!PyArg_ParseTuple(args, "|O", &enable)) return NULL;
    if (enabled == NULL) return Py_BuildValue("(OOK)", Py_False, Py_False, 0ULL);
    if (enable != Py_None) {
        const int truth = PyObject_IsTrue(enable);
        if (truth < 0) return NULL;
        *enabled = truth;
    }
    return Py_BuildValue("(OOK)", available ? Py_True : Py_False,
                         available && *enabled ? Py_True : Py_False, tokens);
}

static PyObject *wide_stats(PyObject *self, PyObject *args) {
#if QUICK
    return run_stats(args, have_wide, &wide_enabled, wide_tokens);
#else
    return run_stats(args, 0, NULL, 0);
#endif
}

PyDoc_STRVAR(wide512_stats_doc,
"wide512_stats(enable=None)\n\n"
"(available, taken, tokens): whether wide runs can take AVX-512 windows on this CPU (VBMI2),\n"
"whether they do (after setting it to enable when given: for tests and benchmarks; wide\n"
"runs then take AVX2 windows), and how many number tokens AVX-512 windows have read since\n"
"import (also counted by wide_stats and quick_stats).");

static PyObject *wide512_stats(PyObject *self, PyObject *args) {
#if QUICK
    return run_stats(args, have_wide512, &wide512_enabled, wide512_tokens);
#else
    return run_stats(args, 0, NULL, 0);
#endif
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, scan_doc},
    {"quick_stats", quick_stats, METH_NOARGS, quick_stats_doc},
    {"wide_stats", wide_stats, METH_VARARGS, wide_stats_doc},
    {"wide512_stats", wide512_stats, METH_VARARGS, wide512_stats_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jsonscan",
    "inferpool's JSON tensor scanner (numeric data arrays straight into numpy buffers).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__jsonscan(void) {
#if QUICK
    quick_init();
    wide512_init();
#endif
    return PyModule_Create(&module);
}
