/* inferpool's tree-ensemble kernel: adds the leaf values a batch of rows reaches in every
 * tree of a forest. The layout is built by inferpool/runtimes/trees/forest.py.
 *
 * Why it is faster than the libraries' own predictors: a tree walk is a chain of
 * unpredictable branches. Here a block of rows walks each tree together, level by level,
 * with no branch on the data: the next node is `left + goes_right` and a leaf points at
 * itself, so a row that reached its leaf early just stays there until the tree's depth is
 * done. The block's walks are independent, so the CPU overlaps their memory loads.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    double threshold;        /* x <= threshold goes left */
    uint32_t feature_flags;  /* the feature's column in the low 24 bits, the flags above */
    int32_t left;            /* the left child; the right one is left + 1; a leaf: itself */
} Node;

typedef struct {
    int32_t root;
    int32_t depth;   /* the longest path from the root to a leaf */
    int32_t column;  /* the first output column this tree adds to */
} Tree;

#define FEATURE_MASK 0x00FFFFFFu
#define NAN_LEFT (1u << 24)     /* a NaN goes left (else right) */
#define ZERO_MISSING (1u << 25) /* |x| <= 1e-35 is missing and goes as ZERO_RIGHT says */
#define ZERO_RIGHT (1u << 26)
#define ZERO_SNAP (1u << 27)    /* |x| <= 1e-35 counts as 0.0 (LightGBM drops such values) */
#define BLOCK 64

/* LightGBM's kZeroThreshold, a float widened to double as LightGBM compares it. */
static const double ZERO_THRESHOLD = (double)1e-35f;

/* The next node of a row at `node` with feature value `v`: every rule of the flags. Most
 * values are neither NaN nor tiny, and for them a plain compare decides: that case is the
 * likely branch. */
static inline int32_t step_full(const Node *node, double v) {
    const double threshold = node->threshold;
    if (__builtin_expect(fabs(v) > ZERO_THRESHOLD, 1)) /* false for NaN */
        return node->left + (int32_t) !(v <= threshold);
    const uint32_t flags = node->feature_flags;
    if (v != v) return node->left + !((flags >> 24) & 1u);
    if ((flags >> 25) & 1u) return node->left + (int32_t)((flags >> 26) & 1u);
    if ((flags >> 27) & 1u) v = 0.0;
    return node->left + (int32_t) !(v <= threshold);
}

/* The same when no feature of the rows is NaN or within 1e-35 of zero: a plain compare. */
static inline int32_t step_plain(const Node *node, double v) {
    return node->left + (int32_t) !(v <= node->threshold);
}

/* One block of rows (at most BLOCK, as doubles) through every tree, in tree order, adding
 * each leaf's values to the row's sums in SUM precision (XGBoost adds in float32). */
#define WALK(NAME, STEP, SUM)                                                              \
    static void NAME(const Node *nodes, const double *leaves, const Tree *trees,          \
                     Py_ssize_t n_trees, Py_ssize_t width, const double *block,            \
                     Py_ssize_t rows, Py_ssize_t n_columns, SUM *sums,                      \
                     Py_ssize_t out_columns) {                                              \
        int32_t at[BLOCK];                                                                 \
        for (Py_ssize_t t = 0; t < n_trees; t++) {                                         \
            const Tree tree = trees[t];                                                    \
            for (Py_ssize_t r = 0; r < rows; r++) at[r] = tree.root;                       \
            for (int32_t level = 0; level < tree.depth; level++) {                         \
                for (Py_ssize_t r = 0; r < rows; r++) {                                    \
                    const Node *node = &nodes[at[r]];                                      \
                    const double *row = block + r * n_columns;                             \
                    at[r] = STEP(node, row[node->feature_flags & FEATURE_MASK]);           \
                }                                                                          \
            }                                                                              \
            for (Py_ssize_t r = 0; r < rows; r++) {                                        \
                const double *leaf = leaves + (Py_ssize_t)at[r] * width;                   \
                SUM *sum = sums + r * out_columns + tree.column;                           \
                for (Py_ssize_t k = 0; k < width; k++) sum[k] += (SUM)leaf[k];             \
            }                                                                              \
        }                                                                                  \
    }

WALK(walk_full_double, step_full, double)
WALK(walk_plain_double, step_plain, double)
WALK(walk_full_float, step_full, float)
WALK(walk_plain_float, step_plain, float)

/* Copy n values into doubles (float32 is widened as the libraries widen it); return
 * whether any is NaN or within 1e-35 of zero, the values the plain compare gets wrong. */
#define WIDEN(NAME, TYPE)                                                                  \
    static int NAME(const void *source, Py_ssize_t n, double *target) {                    \
        const TYPE *x = (const TYPE *)source;                                              \
        int special = 0;                                                                   \
        for (Py_ssize_t i = 0; i < n; i++) {                                               \
            const double v = (double)x[i];                                                 \
            target[i] = v;                                                                 \
            special |= !(fabs(v) > ZERO_THRESHOLD);                                        \
        }                                                                                  \
        return special;                                                                    \
    }

WIDEN(widen_float, float)
WIDEN(widen_double, double)

typedef int (*Widen)(const void *, Py_ssize_t, double *);

/* Every row of x through the forest, a block at a time; `block` holds BLOCK rows. */
#define PREDICT_ROWS(NAME, SUM)                                                            \
    static void NAME(const Node *nodes, const double *leaves, const Tree *trees,          \
                     Py_ssize_t n_trees, Py_ssize_t width, const char *x,                  \
                     Py_ssize_t itemsize, Widen widen, Py_ssize_t n_rows,                  \
                     Py_ssize_t n_columns, void *out, Py_ssize_t out_columns,              \
                     double *block) {                                                      \
        for (Py_ssize_t first = 0; first < n_rows; first += BLOCK) {                       \
            const Py_ssize_t rows = n_rows - first < BLOCK ? n_rows - first : BLOCK;       \
            const int special =                                                            \
                widen(x + first * n_columns * itemsize, rows * n_columns, block);          \
            SUM *sums = (SUM *)out + first * out_columns;                                  \
            if (special)                                                                   \
                walk_full_##SUM(nodes, leaves, trees, n_trees, width, block, rows,         \
                                n_columns, sums, out_columns);                             \
            else                                                                           \
                walk_plain_##SUM(nodes, leaves, trees, n_trees, width, block, rows,        \
                                 n_columns, sums, out_columns);                            \
        }                                                                                  \
    }

PREDICT_ROWS(predict_rows_double, double)
PREDICT_ROWS(predict_rows_float, float)

/* The struct-module type letter of a buffer holding native-order numbers ('f' for "<f"
 * on a little-endian machine, numpy's spelling of an explicitly little-endian float32),
 * or 0 for anything else. */
static char native_kind(const char *format) {
    if (format == NULL) return 'B';
    const uint16_t probe = 1;
    const int little = *(const uint8_t *)&probe == 1;
    if (format[0] == '@' || format[0] == '=' || (format[0] == '<' && little) ||
        (format[0] == '>' && !little))
        format++;
    return (format[0] != '\0' && format[1] == '\0') ? format[0] : 0;
}

static int contiguous(PyObject *obj, Py_buffer *view, int flags, const char *what) {
    if (PyObject_GetBuffer(obj, view, flags | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous buffer", what);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(accumulate_doc,
"accumulate(nodes, leaves, trees, width, n_features, x, out)\n\n"
"Add to out[row, tree.column:tree.column + width] the leaf values every row of x reaches\n"
"in every tree, tree by tree in order. x: rows x n_features, float32 or float64, C order;\n"
"out: rows x columns, float64 or float32 (the precision of the sums), C order, in place.");

static PyObject *accumulate(PyObject *self, PyObject *args) {
    PyObject *nodes_obj, *leaves_obj, *trees_obj, *x_obj, *out_obj;
    Py_ssize_t width, n_features;
    if (!PyArg_ParseTuple(args, "OOOnnOO", &nodes_obj, &leaves_obj, &trees_obj, &width,
                          &n_features, &x_obj, &out_obj))
        return NULL;
    Py_buffer nodes = {0}, leaves = {0}, trees = {0}, x = {0}, out = {0};
    PyObject *result = NULL;
    if (contiguous(nodes_obj, &nodes, PyBUF_SIMPLE, "nodes") < 0) goto done;
    if (contiguous(leaves_obj, &leaves, PyBUF_SIMPLE, "leaves") < 0) goto done;
    if (contiguous(trees_obj, &trees, PyBUF_SIMPLE, "trees") < 0) goto done;
    if (contiguous(x_obj, &x, PyBUF_ND | PyBUF_FORMAT, "x") < 0) goto done;
    if (contiguous(out_obj, &out, PyBUF_ND | PyBUF_FORMAT | PyBUF_WRITABLE, "out") < 0) goto done;

    Py_ssize_t n_nodes = nodes.len / (Py_ssize_t)sizeof(Node);
    Py_ssize_t n_trees = trees.len / (Py_ssize_t)sizeof(Tree);
    if (nodes.len % (Py_ssize_t)sizeof(Node) || trees.len % (Py_ssize_t)sizeof(Tree) ||
        width < 1 || leaves.len != n_nodes * width * (Py_ssize_t)sizeof(double)) {
        PyErr_SetString(PyExc_ValueError, "inconsistent forest layout");
        goto done;
    }
    const char kind = native_kind(x.format);
    const int is_float = kind == 'f', is_double = kind == 'd';
    if (x.ndim != 2 || !(is_float || is_double) || x.shape[1] < n_features) {
        PyErr_Format(PyExc_ValueError, "x must be a 2-D float32 or float64 array of %zd columns",
                     n_features);
        goto done;
    }
    const char out_kind = native_kind(out.format);
    if (out.ndim != 2 || (out_kind != 'd' && out_kind != 'f') || out.shape[0] != x.shape[0]) {
        PyErr_SetString(PyExc_ValueError,
                        "out must be a float64 or float32 array with a row per row of x");
        goto done;
    }
    const Tree *tree_table = (const Tree *)trees.buf;
    for (Py_ssize_t t = 0; t < n_trees; t++) {
        const Tree tree = tree_table[t];
        if (tree.root < 0 || tree.root >= n_nodes || tree.depth < 0 || tree.column < 0 ||
            tree.column + width > out.shape[1]) {
            PyErr_SetString(PyExc_ValueError, "a tree lies outside the forest layout");
            goto done;
        }
    }
    double *block = PyMem_RawMalloc(sizeof(double) * BLOCK * (size_t)(x.shape[1] ? x.shape[1] : 1));
    if (block == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    (out_kind == 'd' ? predict_rows_double : predict_rows_float)(
        (const Node *)nodes.buf, (const double *)leaves.buf, tree_table, n_trees, width,
        (const char *)x.buf, x.itemsize, is_float ? widen_float : widen_double, x.shape[0],
        x.shape[1], out.buf, out.shape[1], block);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(block);
    result = Py_NewRef(Py_None);
done:
    if (nodes.obj) PyBuffer_Release(&nodes);
    if (leaves.obj) PyBuffer_Release(&leaves);
    if (trees.obj) PyBuffer_Release(&trees);
    if (x.obj) PyBuffer_Release(&x);
    if (out.obj) PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"accumulate", accumulate, METH_VARARGS, accumulate_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kernel", "inferpool's tree-ensemble kernel.", -1, methods,
};

PyMODINIT_FUNC PyInit__kernel(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "NODE_SIZE", (long)sizeof(Node)) < 0 ||
        PyModule_AddIntConstant(m, "TREE_SIZE", (long)sizeof(Tree)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
