/* The JSON tensor scanner's common ground (../_jsonscan.c includes it first): the limits
 * that decide what is read here and what is left to orjson, the datatypes handled, the
 * powers of ten, whitespace, the Outcome of reading a number or an array, and the
 * compile-time gates every other part tests (FAST_PATH: Clinger's fast path is exact;
 * SWAR: little-endian words). Nothing here depends on an instruction set.
 */
#ifndef INFERPOOL_JSONSCAN_COMMON_H
#define INFERPOOL_JSONSCAN_COMMON_H

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
 * JSON encoders: "0.1257302165031433") are Eisel-Lemire's, about 22 ns a number token by
 * token and half that in quick and wide runs (tier_ssse3.h's long_number, tier_avx2.h's
 * long_window). */
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

/* FAILED: a Python error is set. SLOW: orjson reads the array faster (SLOW_TRIAL), and the
 * whole body is left to it. */
typedef enum { CONVERTED, UNSUPPORTED, FAILED, SLOW } Outcome;

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define SWAR 1
#else
#define SWAR 0
#endif

#endif /* INFERPOOL_JSONSCAN_COMMON_H */
