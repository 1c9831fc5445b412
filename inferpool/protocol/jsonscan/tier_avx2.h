/* AVX2 tier: wide runs (wide_run), compact arrays read a 64-byte window at a time. Owns the
 * window's byte maps (wide_maps, checked by dispatch.h's quick_window_tokens), the batch
 * of shuffled tokens (wide_window) and its conversion four tokens at a time
 * (wide_convert), and windows with long decimals (long_window). Every
 * function here is compiled with target("avx2,bmi,bmi2") and only called from quick_run
 * (tier_ssse3.h) where have_wide and wide_enabled (dispatch.h). Included by ../_jsonscan.c
 * after tier_ssse3.h.
 */
#ifndef INFERPOOL_JSONSCAN_TIER_AVX2_H
#define INFERPOOL_JSONSCAN_TIER_AVX2_H

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

/* The window at w's maps (a token starts there), cut by quick_window_tokens: the last
 * comma's place, or -1 when no token of the quick form ends at a comma in it. Reads 64
 * bytes. */
static inline WIDE_TARGET int wide_maps(const char *w, WindowMaps *m) {
    const __m256i low = _mm256_loadu_si256((const __m256i *)w);
    const __m256i high = _mm256_loadu_si256((const __m256i *)(w + 32));
    m->commas = byte_bits(low, high, ',');
    if (m->commas == 0) return -1;
    m->points = byte_bits(low, high, '.');
    m->minus = byte_bits(low, high, '-');
    m->digits = bits64(digit_bytes(low), digit_bytes(high));
    m->zeros = byte_bits(low, high, '0');
    return quick_window_tokens(m);
}

/* A token of a window (its maps m, cut by quick_window_tokens), the one that starts at
 * `start` and ends at the first comma left in *rest (which loses it): the comma's place,
 * its sign, where its digits start (b), their length with the point's (len), and where its
 * integer part ends (point: the point's place, else the comma's). */
typedef struct {
    int comma, neg, b, len, point;
} WindowToken;

static inline __attribute__((always_inline)) WindowToken window_token(const WindowMaps *m,
                                                                      uint64_t *rest, int start) {
    WindowToken token;
    token.comma = __builtin_ctzll(*rest);
    *rest &= *rest - 1;
    token.neg = (int)((m->minus >> start) & 1);
    token.b = start + token.neg;
    token.len = token.comma - token.b;
    token.point = token.b + __builtin_ctzll((m->points | m->commas) >> token.b);
    return token;
}

/* The window at w's tokens (its maps m), appended to the batch from entry k: how many; 0
 * when any of them is more than 15 characters after the sign. Reads 80 bytes. */
static inline WIDE_TARGET int wide_window(const char *w, const WindowMaps *m, WideBatch *batch,
                                          int k) {
    uint64_t rest = m->commas;
    int start = 0, i = k, lengths = 0;
    do {
        const WindowToken token = window_token(m, &rest, start);
        lengths |= token.len;
        /* (A token over 15 characters refuses the window below: & 15 keeps its reads
         * inside the tables until then.) */
        const int form = (token.len & 15) * 16 + ((token.point - token.b) & 15);
        const __m128i chunk = _mm_loadu_si128((const __m128i *)(w + token.b));
        batch->digits[i] = _mm_shuffle_epi8(chunk, ((const __m128i *)DIGIT_SHUFFLE)[form]);
        batch->scale[i] = (&DIGIT_SCALE[0][0])[form];
        batch->sign[i] = (uint64_t)token.neg << 63;
        i++;
        start = token.comma + 1;
    } while (rest != 0);
    if (lengths & ~15) return 0; /* a token longer than 15 characters */
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

/* The window at w's tokens (its maps m) when one of them is longer than quick tokens (the
 * 17 digits of floats written through Python floats): each converted by frame_value
 * (tier_ssse3.h: its digits folded from a 32-byte frame, then Eisel-Lemire) and stored
 * into out as FP32 (size 4) or FP64. How many; 0 (values may be stored, none past `room`)
 * when they are more than `room`, or one of them is over 31 characters after its sign, an
 * integer over 15 digits (an int to orjson) or past frame_value. Reads the 33 bytes before
 * each comma: w - 33 on. */
static inline WIDE_TARGET int long_window(const char *w, const WindowMaps *m, int size,
                                          char *out, Py_ssize_t room) {
    const int count = __builtin_popcountll(m->commas);
    if (count > room) return 0;
    uint64_t rest = m->commas;
    int start = 0, i = 0, taken = 1;
    do {
        const WindowToken token = window_token(m, &rest, start);
        const int comma = token.comma, neg = token.neg, len = token.len, point = token.point;
        const int decimal = point < comma;
        /* In the frame ending at the comma: the first digit's place, the point's. */
        const int first = 32 - len, at = point - comma + 32;
        double d = 0.0;
        taken &= (len <= 31) & (decimal | (len <= 15)) &
                 frame_value(w + comma, decimal ? at : first - 1, decimal ? first : first - 1,
                             decimal ? at - 31 : 0, neg, &d);
        if (size == 4)
            ((float *)out)[i] = (float)d;
        else
            ((double *)out)[i] = d;
        i++;
        start = comma + 1;
    } while (rest != 0);
    return taken ? count : 0;
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
        WindowMaps m;
        const int last = wide_maps(s + p, &m);
        if (last < 0) break;
        /* A first token over 16 characters (sign included) is past the batch: a window of
         * long decimals, most likely, not tried as one of quick tokens first. */
        const int got = __builtin_ctzll(m.commas) > 16 ? 0 : wide_window(s + p, &m, &batch, pending);
        if (got > 0) {
            if (count + read + pending + got > expected) break;
            pending += got;
            if (pending >= WIDE_BATCH) {
                wide_convert(&batch, pending, size, out + (count + read) * size);
                read += pending;
                pending = 0;
            }
        } else {
            /* A token longer than 15 characters (long_window reads any token of the
             * quick form): the batch's tokens come first in out. */
            if (pending > 0) {
                wide_convert(&batch, pending, size, out + (count + read) * size);
                read += pending;
                pending = 0;
            }
            const int taken = p >= 33 ? long_window(s + p, &m, size, out + (count + read) * size,
                                                    expected - count - read)
                                      : 0;
            if (taken == 0) break;
            read += taken;
        }
        p += last + 1;
    }
    if (pending > 0) {
        wide_convert(&batch, pending, size, out + (count + read) * size);
        read += pending;
    }
    *end = p;
    wide_tokens += (unsigned long long)read;
    return read;
}

#endif /* INFERPOOL_JSONSCAN_TIER_AVX2_H */
