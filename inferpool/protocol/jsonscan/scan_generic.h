/* The generic scan: the JSON grammar around the numbers. read_array walks one data array
 * (nesting, regular shape, booleans), taking quick runs (tier_ssse3.h: quick_run, and
 * long_run where a token of 16 characters or more stops it) where dispatch.h allows and
 * read_number (numbers.h) for every other token; walk goes over the whole body,
 * finds each inputs[i]'s datatype, shape and data, and converts the data (convert) into
 * the buffer `allocate` gives. Included by ../_jsonscan.c after the tiers; nothing here
 * depends on an instruction set (the tiers are behind QUICK and have_ssse3).
 */
#ifndef INFERPOOL_JSONSCAN_SCAN_GENERIC_H
#define INFERPOOL_JSONSCAN_SCAN_GENERIC_H

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
                Py_ssize_t read = quick_run(s, p, n, dt.size, out, count, expected, &wide, &stop);
                /* A token of 16 characters or more: long decimals, most likely (Python's
                 * floats, tier_ssse3.h's long_run). */
                if (read <= 0 && n - p > 16 && memchr(s + p, ',', 16) == NULL)
                    read = long_run(s, p, n, dt.size, out, count, expected, &wide, &stop);
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

#endif /* INFERPOOL_JSONSCAN_SCAN_GENERIC_H */
