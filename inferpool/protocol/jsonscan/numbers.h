/* Number tokens, one at a time, with no instruction set beyond the C compiler's (the scalar
 * tier, and the fallback of every other): read_number checks the strict JSON number grammar
 * and converts the token to the datatype -- integers range-checked, floats correctly rounded
 * by Clinger's fast path, else Eisel-Lemire (../_pow5.h's table), else
 * PyOS_string_to_double on a copy of the token. Digits are read eight at a time as
 * little-endian words where SWAR (common.h) allows. Included by ../_jsonscan.c after
 * common.h. The SIMD tiers (tier_*.h) take only tokens whose value read_number would give
 * by Clinger's fast path or, long decimals (up to 19 significant digits), by eisel_lemire
 * below, and give that value bit for bit; what they do not take, this reads.
 */
#ifndef INFERPOOL_JSONSCAN_NUMBERS_H
#define INFERPOOL_JSONSCAN_NUMBERS_H

/* ---------------------------------------------------------------- digits ----------- */

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
#include "../_pow5.h"

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

/* ---------------------------------------------------------------- one token -------- */

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

#endif /* INFERPOOL_JSONSCAN_NUMBERS_H */
