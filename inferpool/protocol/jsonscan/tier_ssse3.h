/* SSSE3 tier: quick runs (quick_run), the tokens of a float array's plain decimals each
 * followed by a comma, read with no data-dependent branch per number. Owns quick_number
 * (one token: its digits shuffled into place and folded, then Clinger's fast path),
 * long_number and frame_value (a decimal of 16 to 31 characters: its digits folded from a
 * 32-byte frame, then Eisel-Lemire; tier_avx2.h's long_window uses frame_value too),
 * comma_bits (the 64-byte window of commas) and the loop (run_of: quick_run for quick
 * tokens, long_run for long decimals among them) that hands a compact run to the wide
 * tiers (dispatch.h's switches and wide_judge). Every function here is compiled with
 * target("ssse3") and only called where have_ssse3 (dispatch.h). Included by
 * ../_jsonscan.c after dispatch.h, where QUICK is 1.
 */
#ifndef INFERPOOL_JSONSCAN_TIER_SSSE3_H
#define INFERPOOL_JSONSCAN_TIER_SSSE3_H

/* Runs of plain decimals, the body of a float tensor's data as clients write it, read with
 * SSSE3 and without a data-dependent branch per number: a 64-byte bitmap of the commas
 * gives each token's end before the token is read, so the numbers' conversions overlap.
 * Only for tokens whose value read_number would give by Clinger's fast path; anything else
 * ends the run, and read_number reads it. Chosen at run time (have_ssse3), so the module
 * still loads on a CPU without SSSE3. */
#include <tmmintrin.h>
#define QUICK_TARGET __attribute__((target("ssse3")))

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

/* Places 0..31 of a 32-byte frame, for the masks of frame_value. */
static const int8_t FRAME_INDEX[32] __attribute__((aligned(16))) = {
    0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
    16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31};

/* The value of a checked token of up to 31 digits and point that ends just before `end`,
 * seen right-aligned in a 32-byte frame: its digits at places keep + 1 .. 31 once the
 * point, at place `at`, is dropped (at == keep: no point), times 10^q. 1 with *value the
 * correctly rounded double (read_number's value), 0 when it has more than 19 significant
 * digits or Eisel-Lemire leaves it to a slower reading (about one in 500 such tokens).
 * Reads the 33 bytes before `end`.
 *
 * The digits after the point come from the frame, those up to it from the frame one byte
 * earlier (so the point drops out and the digits are contiguous, right-aligned), the bytes
 * before the token are zeroed, and the 32 digits are folded as quick_number folds 16, into
 * four eight-digit groups: an integer of at most 19 digits, Eisel-Lemire's case. */
static inline __attribute__((always_inline)) QUICK_TARGET int
frame_value(const char *end, int at, int keep, int q, int neg, double *value) {
    const __m128i zero_char = _mm_set1_epi8('0');
    const __m128i lo = _mm_sub_epi8(_mm_loadu_si128((const __m128i *)(end - 32)), zero_char);
    const __m128i hi = _mm_sub_epi8(_mm_loadu_si128((const __m128i *)(end - 16)), zero_char);
    const __m128i lo_before = _mm_sub_epi8(_mm_loadu_si128((const __m128i *)(end - 33)), zero_char);
    const __m128i hi_before = _mm_sub_epi8(_mm_loadu_si128((const __m128i *)(end - 17)), zero_char);
    const __m128i index_lo = _mm_load_si128((const __m128i *)FRAME_INDEX);
    const __m128i index_hi = _mm_load_si128((const __m128i *)(FRAME_INDEX + 16));
    const __m128i point = _mm_set1_epi8((char)at), first = _mm_set1_epi8((char)keep);
    const __m128i take_lo = _mm_cmpgt_epi8(index_lo, point), take_hi = _mm_cmpgt_epi8(index_hi, point);
    const __m128i keep_lo = _mm_cmpgt_epi8(index_lo, first), keep_hi = _mm_cmpgt_epi8(index_hi, first);
    const __m128i digits_lo = _mm_and_si128(
        keep_lo, _mm_or_si128(_mm_and_si128(take_lo, lo), _mm_andnot_si128(take_lo, lo_before)));
    const __m128i digits_hi = _mm_and_si128(
        keep_hi, _mm_or_si128(_mm_and_si128(take_hi, hi), _mm_andnot_si128(take_hi, hi_before)));
    const __m128i fours_lo = _mm_madd_epi16(_mm_maddubs_epi16(digits_lo, _mm_set1_epi16(FOLD_PAIRS)),
                                            _mm_set1_epi32(FOLD_FOURS));
    const __m128i fours_hi = _mm_madd_epi16(_mm_maddubs_epi16(digits_hi, _mm_set1_epi16(FOLD_PAIRS)),
                                            _mm_set1_epi32(FOLD_FOURS));
    /* The frame's four eight-digit groups, most significant first. */
    const __m128i eights =
        _mm_madd_epi16(_mm_packs_epi32(fours_lo, fours_hi), _mm_set1_epi32(FOLD_EIGHTS));
    const uint64_t top = (uint64_t)_mm_cvtsi128_si64(eights);
    const uint64_t bottom = (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(eights, eights));
    /* At most 19 significant digits: none in the first group, three in the second. */
    if (((uint32_t)top != 0) | ((top >> 32) >= 1000)) return 0;
    const uint64_t w = (top >> 32) * UINT64_C(10000000000000000) +
                       (bottom & 0xFFFFFFFFu) * UINT64_C(100000000) + (bottom >> 32);
    if (w == 0) {
        /* A decimal keeps its sign; the integer 0 is +0.0 (a window's "-0" is refused). */
        *value = neg && at != keep ? -0.0 : 0.0;
        return 1;
    }
    return eisel_lemire(w, q, neg, value);
}

/* The token s[p..next) (next: the comma after it) when it is a decimal with a point,
 * -?(0|[1-9][0-9]*).[0-9]+, of 16 to 31 characters after its sign (past quick_number) and
 * at most 19 significant digits: its length, and in *value what read_number gives (the
 * correctly rounded double, by frame_value). These are the floats written through
 * Python's floats (`ndarray.tolist()`, 17 significant digits: "-0.13210485875606537").
 * 0 for any other token. Reads the 33 bytes before the comma, none after; next >= 33. */
static inline __attribute__((always_inline)) QUICK_TARGET int long_number(const char *s,
                                                                          Py_ssize_t p,
                                                                          Py_ssize_t next,
                                                                          double *value) {
    const int neg = s[p] == '-';
    const int len = (int)(next - p) - neg; /* digits and point */
    if (len < 16 || len > 31 || next < 33) return 0;
    const char *const end = s + next;
    const __m128i lo = _mm_loadu_si128((const __m128i *)(end - 32));
    const __m128i hi = _mm_loadu_si128((const __m128i *)(end - 16));
    const __m128i nine = _mm_set1_epi8(9), zero_char = _mm_set1_epi8('0');
    const __m128i lo_value = _mm_sub_epi8(lo, zero_char), hi_value = _mm_sub_epi8(hi, zero_char);
    /* Digits: the byte less '0' is 0..9 unsigned (min_epu8 keeps it). */
    const uint32_t digits =
        (uint32_t)_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_min_epu8(lo_value, nine), lo_value)) |
        (uint32_t)_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_min_epu8(hi_value, nine), hi_value))
            << 16;
    const __m128i point = _mm_set1_epi8('.');
    const uint32_t points = (uint32_t)_mm_movemask_epi8(_mm_cmpeq_epi8(lo, point)) |
                            (uint32_t)_mm_movemask_epi8(_mm_cmpeq_epi8(hi, point)) << 16;
    const int first = 32 - len; /* the token's first byte (after its sign) in the frame */
    const uint32_t token = ~UINT32_C(0) << first;
    const uint32_t dots = points & token;
    /* Bitwise, not ||: one branch for all of them. Every byte a digit or the point, one
     * point, a digit first and last, no leading zero ("01.5"). */
    const int other = (((digits | dots) & token) != token) | (dots == 0) |
                      ((dots & (dots - 1)) != 0) | !((digits >> first) & 1) |
                      !(digits >> 31) | ((end[-len] == '0') & (int)((digits >> (first + 1)) & 1));
    if (other) return 0;
    const int at = __builtin_ctz(dots); /* the point's place in the frame */
    return frame_value(end, at, first, at - 31, neg, value) ? neg + len : 0;
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

/* The tokens at s[p], each followed by a comma (then whitespace), into out[count...] as
 * FP32 (size 4) or FP64, none past `expected`. How many were read, *end where the first
 * one not read starts; -1 when that is the first and it is not of the quick form (nor,
 * `longs`, a long decimal). A quick token's value is finite as FP32 too (under 10^15), a
 * long decimal's too (under 10^19). `wide`: the array's WideState. `longs` (a constant:
 * quick_run, long_run): long decimals first, then quick tokens; else quick tokens alone,
 * so that their loop keeps its registers (no call, no conversion of another kind). */
static inline __attribute__((always_inline)) QUICK_TARGET Py_ssize_t
run_of(const char *s, Py_ssize_t p, Py_ssize_t n, int size, char *out, Py_ssize_t count,
       Py_ssize_t expected, WideState *wide, Py_ssize_t *end, const int longs) {
    const Py_ssize_t first = count;
    Py_ssize_t wide_read = -1; /* -1: no wide run tried */
    while (n - p >= QUICK_WINDOW + QUICK_READ) {
        const Py_ssize_t base = p;
        uint64_t commas = comma_bits(s + base);
        if (commas == 0) break;
        do {
            const Py_ssize_t next = base + __builtin_ctzll(commas);
            double d;
            int len = longs ? long_number(s, p, next, &d) : 0;
            if (len == 0) {
                len = quick_number(s + p, &d);
                if (len == 0 || p + len != next) {
                    if (len == 0 && count == first) return -1;
                    goto done;
                }
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
             * one (or a long decimal) followed by a comma: a run at a row's last value or
             * at a token of another form tells nothing of what wide runs read. */
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

/* Quick tokens alone (run_of). */
static QUICK_TARGET __attribute__((noinline)) Py_ssize_t
quick_run(const char *s, Py_ssize_t p, Py_ssize_t n, int size, char *out, Py_ssize_t count,
          Py_ssize_t expected, WideState *wide, Py_ssize_t *end) {
    return run_of(s, p, n, size, out, count, expected, wide, end, 0);
}

/* Long decimals and quick tokens (run_of): where quick_run stops at a long decimal. */
static QUICK_TARGET __attribute__((noinline)) Py_ssize_t
long_run(const char *s, Py_ssize_t p, Py_ssize_t n, int size, char *out, Py_ssize_t count,
         Py_ssize_t expected, WideState *wide, Py_ssize_t *end) {
    return run_of(s, p, n, size, out, count, expected, wide, end, 1);
}

#endif /* INFERPOOL_JSONSCAN_TIER_SSSE3_H */
