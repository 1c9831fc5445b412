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
 * no loop over them), a quarter faster than AVX2's. Long decimals (16 to 31 characters, up
 * to 19 significant digits: the 17 digits of floats written through Python floats,
 * `ndarray.tolist()`) are read in quick runs and AVX2 windows too (long_number,
 * long_window: digits folded from a 32-byte frame, then Eisel-Lemire), about twice as fast
 * as token by token.
 *
 * The module is one translation unit: this file holds the Python glue (scan, the run
 * statistics and switches, the module's init, which detects the CPU) and includes the rest
 * from jsonscan/, as simdjson lays out its kernels -- the generic parts, then one header
 * per instruction set, each compiled with its own target attribute:
 *   jsonscan/common.h        limits, datatypes, powers of ten, whitespace, compile gates;
 *   jsonscan/numbers.h       one number token, scalar: grammar, Clinger, Eisel-Lemire
 *                            (_pow5.h), PyOS_string_to_double;
 *   jsonscan/dispatch.h      the SIMD tiers' gate (QUICK), CPU detection, the switches,
 *                            and what the tiers share;
 *   jsonscan/tier_ssse3.h    quick runs (SSSE3), long decimals one at a time;
 *   jsonscan/tier_avx2.h     wide runs (AVX2), windows of long decimals;
 *   jsonscan/tier_avx512.h   wide runs' AVX-512 windows (VBMI2);
 *   jsonscan/scan_generic.h  one data array, and the walk over the body.
 * setup.py lists every header in the extension's `depends`, and pyproject.toml ships them.
 */
#include "jsonscan/common.h"
#include "jsonscan/numbers.h"
#include "jsonscan/dispatch.h"
#if QUICK
#include "jsonscan/tier_ssse3.h"
#include "jsonscan/tier_avx2.h"
#include "jsonscan/tier_avx512.h"
#endif
#include "jsonscan/scan_generic.h"

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
