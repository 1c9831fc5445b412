/* inferpool's tree-ensemble kernel: adds the leaf values a batch of rows reaches in every
 * tree of a forest. The layout is built by inferpool/runtimes/trees/forest.py.
 *
 * Why it is faster than the libraries' own predictors: a tree walk is a chain of
 * unpredictable branches. Here a block of rows walks each tree together, level by level,
 * with no branch on the data: the next node is `left + goes_right` and a leaf points at
 * itself, so a row that reached its leaf early just stays there until the tree's depth is
 * done, or, in a tree whose leaves lie at many depths, until the level where the walk
 * leaves such rows out (`settle_level`). The block's walks are independent, so the CPU
 * overlaps their memory loads; a block of one to three rows (a batch-1 request) walks
 * eight trees at once for the same reason.
 *
 * It also lays a forest out (`lay_out`, a tree at a time from its library's node arrays)
 * and, for a large batch, splits the rows between a few threads (`accumulate`'s
 * `threads`): every row is walked exactly as on one thread, so the sums are the same.
 * `contributions` walks the same layout for explanations (Saabas: each split's change of
 * the node's value credited to its feature), given every node's value alongside.
 * `libm` applies the C library's exp or log1p (or LightGBM's sigmoid around exp) to an array,
 * as LightGBM's link functions do. `oblivious` walks CatBoost's oblivious trees
 * (oblivious.h).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* -ffast-math would let the compiler call vectorised exp and log1p (libmvec) in `libm`,
 * whose last bits differ from the C library's, and would drop the NaN checks of the walk. */
#ifdef __FAST_MATH__
#error "the tree kernel must not be built with -ffast-math"
#endif

typedef struct {
    double threshold;        /* x <= threshold goes left */
    uint32_t feature_flags;  /* the feature's column in the low 24 bits, the flags above */
    int32_t left;            /* the left child; the right one is left + 1; a leaf: itself */
} Node;

typedef struct {
    int32_t root;
    int32_t depth;   /* the longest path from the root to a leaf */
    int32_t column;  /* the first output column this tree adds to */
    int32_t settle;  /* the level after which rows at their leaves drop out (depth: never) */
} Tree;

#define FEATURE_MASK 0x00FFFFFFu
#define NAN_LEFT (1u << 24)     /* a NaN goes left (else right) */
#define ZERO_MISSING (1u << 25) /* |x| <= 1e-35 is missing and goes as ZERO_RIGHT says */
#define ZERO_RIGHT (1u << 26)
#define ZERO_SNAP (1u << 27)    /* |x| <= 1e-35 counts as 0.0 (LightGBM drops such values) */
#define CATEGORICAL (1u << 28)  /* a category split: `threshold` is where its bitset starts */
#define FLAG_MASK (NAN_LEFT | ZERO_MISSING | ZERO_RIGHT | ZERO_SNAP | CATEGORICAL)
#define BLOCK 64
_Static_assert(BLOCK <= 256, "the walk keeps a block's row indices in bytes");

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

/* A category split (LightGBM's rule): the value, truncated to an integer, goes left when
 * its bit is set in the node's bitset (bits[offset] words after the count at `offset`).
 * NaN, a value that truncates below 0 or past INT32_MAX goes as NAN_LEFT says (LightGBM:
 * right); a category past the bitset's end goes right. Numeric splits as step_full. */
static inline int32_t step_cat(const Node *node, double v, const uint32_t *bits) {
    const uint32_t flags = node->feature_flags;
    if (__builtin_expect(!(flags & CATEGORICAL), 1)) return step_full(node, v);
    if (!(v > -1.0 && v < 2147483648.0)) return node->left + !((flags >> 24) & 1u);
    const uint32_t category = (uint32_t)(int32_t)v; /* truncates toward zero, as C++ does */
    const uint32_t *set = bits + (size_t)node->threshold;
    const uint32_t word = category >> 5;
    if (word >= set[0]) return node->left + 1;
    return node->left + !((set[1 + word] >> (category & 31u)) & 1u);
}

#define STEP_FULL(node, v) step_full(node, v)
#define STEP_PLAIN(node, v) step_plain(node, v)
#define STEP_CAT(node, v) step_cat(node, v, bits)

/* The values of the leaves `reached` (one per row of the block) added to the rows' sums
 * from output column `column`, in SUM precision (XGBoost adds in float32). */
#define ADD_LEAVES(SUM, reached, column)                                                   \
    for (Py_ssize_t r = 0; r < rows; r++) {                                                \
        const double *leaf = leaves + (Py_ssize_t)(reached)[r] * width;                    \
        SUM *sum = sums + r * out_columns + (column);                                      \
        for (Py_ssize_t k = 0; k < width; k++) sum[k] += (SUM)leaf[k];                     \
    }

/* Row r of the block one step down from node `here` (where the row is: updated). */
#define STEP_ROW(STEP, here, r)                                                            \
    do {                                                                                   \
        const Node *node = &nodes[here];                                                   \
        const double *row = block + (r) * n_columns;                                       \
        (here) = STEP(node, row[node->feature_flags & FEATURE_MASK]);                      \
    } while (0)

/* A walk's signature: a block of `rows` rows (as doubles) through every tree. Inlined
 * into `predict_rows`: called apart, the block walk ran 6 to 9% slower on the benchmark's
 * forests (RESULTS.md, "The settle level of the tree walk"). */
#define WALK_FUNCTION(NAME, SUM)                                                           \
    static Py_ALWAYS_INLINE inline void NAME(                                              \
        const Node *nodes, const double *leaves, const uint32_t *bits, const Tree *trees,  \
        Py_ssize_t n_trees, Py_ssize_t width, const double *block, Py_ssize_t rows,         \
        Py_ssize_t n_columns, SUM *sums, Py_ssize_t out_columns)

/* One block of rows (at most BLOCK) through every tree, in tree order. The first
 * `tree.settle` levels walk every row; then the rows already at their leaves drop out, and
 * the rest walk the remaining levels through a list of their indices. A tree whose leaves
 * lie at many depths (LightGBM grows a tree leaf by leaf) keeps most rows from stepping
 * in place at their leaves that way; `settle_level` decides where, from the training
 * rows each node saw. The list costs a load a step, so a tree with settle == depth walks
 * as before. A row's path is the same either way, so are the sums.
 * UNROLLED: the row loops four rows an iteration; gcc leaves them rolled at -O3, and
 * unrolled the walk of 256 rows is 6 to 9% faster on the benchmark's forests (RESULTS.md,
 * "The settle level of the tree walk"; clang reads GCC's pragma too). */
#define WALK(NAME, STEP, SUM)                                                              \
    WALK_FUNCTION(NAME, SUM) {                                                             \
        int32_t at[BLOCK];                                                                 \
        uint8_t walking[BLOCK]; /* the rows not yet at their leaves, after `settle` */     \
        (void)bits; /* read by the categorical walk alone */                               \
        for (Py_ssize_t t = 0; t < n_trees; t++) {                                         \
            const Tree tree = trees[t];                                                    \
            for (Py_ssize_t r = 0; r < rows; r++) at[r] = tree.root;                       \
            for (int32_t level = 0; level < tree.settle; level++) {                        \
                _Pragma("GCC unroll 4") /* see UNROLLED */                                 \
                for (Py_ssize_t r = 0; r < rows; r++) STEP_ROW(STEP, at[r], r);            \
            }                                                                              \
            if (tree.settle < tree.depth) {                                                \
                Py_ssize_t n = 0;                                                          \
                for (Py_ssize_t r = 0; r < rows; r++) {                                    \
                    walking[n] = (uint8_t)r;                                               \
                    n += nodes[at[r]].left != at[r]; /* a leaf points at itself */         \
                }                                                                          \
                for (int32_t level = tree.settle; level < tree.depth; level++) {           \
                    _Pragma("GCC unroll 4")                                                \
                    for (Py_ssize_t i = 0; i < n; i++) {                                   \
                        const Py_ssize_t r = walking[i];                                   \
                        STEP_ROW(STEP, at[r], r);                                          \
                    }                                                                      \
                }                                                                          \
            }                                                                              \
            ADD_LEAVES(SUM, at, tree.column);                                              \
        }                                                                                  \
    }

/* The same for a block of fewer than FEW_ROWS rows, TREE_GROUP trees at a time. One row's
 * walk down a tree is a chain of dependent loads; the walks of the group's other trees give
 * the CPU independent loads to overlap (one row of the benchmark's 100-tree models: 1.4 to
 * 2.2x faster in `Forest.accumulate`).
 * The leaves are still added tree by tree, so the sums are the same bits. */
#define FEW_ROWS 4
#define TREE_GROUP 8
#define WALK_FEW(NAME, STEP, SUM)                                                          \
    WALK_FUNCTION(NAME, SUM) {                                                             \
        int32_t at[TREE_GROUP][FEW_ROWS]; /* at[g]: where the rows are in tree g */        \
        (void)bits; /* read by the categorical walk alone */                               \
        for (Py_ssize_t first = 0; first < n_trees; first += TREE_GROUP) {                 \
            const Tree *group = trees + first;                                             \
            const Py_ssize_t n = n_trees - first < TREE_GROUP ? n_trees - first : TREE_GROUP; \
            int32_t depth = 0;                                                             \
            for (Py_ssize_t g = 0; g < n; g++) {                                           \
                if (group[g].depth > depth) depth = group[g].depth;                        \
                for (Py_ssize_t r = 0; r < rows; r++) at[g][r] = group[g].root;            \
            }                                                                              \
            /* A tree shallower than the group's deepest leaves its rows at their leaves,  \
             * which point at themselves: the extra steps change nothing. */               \
            for (int32_t level = 0; level < depth; level++) {                              \
                for (Py_ssize_t g = 0; g < n; g++) {                                       \
                    for (Py_ssize_t r = 0; r < rows; r++) {                                \
                        STEP_ROW(STEP, at[g][r], r);                                       \
                    }                                                                      \
                }                                                                          \
            }                                                                              \
            for (Py_ssize_t g = 0; g < n; g++) ADD_LEAVES(SUM, at[g], group[g].column);    \
        }                                                                                  \
    }

/* Both walks of a step rule, with sums in either precision. */
#define WALKS(RULE, STEP)                                                                  \
    WALK(walk_##RULE##_double, STEP, double)                                               \
    WALK(walk_##RULE##_float, STEP, float)                                                 \
    WALK_FEW(walk_few_##RULE##_double, STEP, double)                                       \
    WALK_FEW(walk_few_##RULE##_float, STEP, float)

WALKS(full, STEP_FULL)
WALKS(plain, STEP_PLAIN)
WALKS(cat, STEP_CAT)

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

/* What a batch walks through, and where its rows and sums are. */
typedef struct {
    const Node *nodes;
    const double *leaves;
    const uint32_t *bits; /* NULL: no category splits */
    const Tree *trees;
    Py_ssize_t n_trees, width;
    const char *x;
    Py_ssize_t itemsize, n_columns;
    Widen widen;
    void *out;
    Py_ssize_t out_columns;
    int sum_double; /* the sums' precision: double, else float */
} Batch;

/* The walk of a block by the rules its rows need: category splits, NaN or tiny values
 * (the full step), or neither (the plain compare). */
#define WALK_BY_RULES(PREFIX, SUM)                                                         \
    do {                                                                                   \
        if (b->bits != NULL)                                                               \
            PREFIX##_cat_##SUM(b->nodes, b->leaves, b->bits, b->trees, b->n_trees,         \
                               b->width, block, rows, b->n_columns, sums, b->out_columns); \
        else if (special)                                                                  \
            PREFIX##_full_##SUM(b->nodes, b->leaves, b->bits, b->trees, b->n_trees,        \
                                b->width, block, rows, b->n_columns, sums,                 \
                                b->out_columns);                                           \
        else                                                                               \
            PREFIX##_plain_##SUM(b->nodes, b->leaves, b->bits, b->trees, b->n_trees,       \
                                 b->width, block, rows, b->n_columns, sums,                \
                                 b->out_columns);                                          \
    } while (0)

/* Rows [first, last) of the batch through the forest, a block at a time; `block` holds
 * BLOCK rows. */
#define PREDICT_ROWS(NAME, SUM)                                                            \
    static void NAME(const Batch *b, Py_ssize_t first_row, Py_ssize_t last_row,           \
                     double *block) {                                                      \
        for (Py_ssize_t first = first_row; first < last_row; first += BLOCK) {             \
            const Py_ssize_t rows = last_row - first < BLOCK ? last_row - first : BLOCK;   \
            const int special = b->widen(b->x + first * b->n_columns * b->itemsize,        \
                                         rows * b->n_columns, block);                      \
            SUM *sums = (SUM *)b->out + first * b->out_columns;                            \
            if (rows < FEW_ROWS)                                                           \
                WALK_BY_RULES(walk_few, SUM);                                              \
            else                                                                           \
                WALK_BY_RULES(walk, SUM);                                                  \
        }                                                                                  \
    }

PREDICT_ROWS(predict_rows_double, double)
PREDICT_ROWS(predict_rows_float, float)

static void predict_rows(const Batch *b, Py_ssize_t first, Py_ssize_t last, double *block) {
    (b->sum_double ? predict_rows_double : predict_rows_float)(b, first, last, block);
}

/* One thread's share of a batch: whole blocks of consecutive rows. */
typedef struct {
    const Batch *batch;
    Py_ssize_t first, last;
    double *block;
} Share;

static void *predict_share(void *arg) {
    const Share *share = (const Share *)arg;
    predict_rows(share->batch, share->first, share->last, share->block);
    return NULL;
}

#define MAX_THREADS 16

/* The threads worth starting for a batch of n_blocks blocks: 1 to MAX_THREADS, at most
 * one a block. */
static int thread_count(int threads, Py_ssize_t n_blocks) {
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > n_blocks) threads = (int)n_blocks;
    return threads < 1 ? 1 : threads;
}

/* Thread t's rows [first, last) of n_rows: a contiguous run of whole blocks. */
static void share_rows(Py_ssize_t n_rows, int t, int threads, Py_ssize_t *first,
                       Py_ssize_t *last) {
    const Py_ssize_t n_blocks = (n_rows + BLOCK - 1) / BLOCK;
    *first = n_blocks * t / threads * BLOCK;
    const Py_ssize_t end = n_blocks * (t + 1) / threads * BLOCK;
    *last = end < n_rows ? end : n_rows;
}

/* `work` on each of `threads` shares (`size` bytes apart from `shares`): the first on this
 * thread, the others on threads of their own; a thread that cannot be started leaves its
 * share to this one. */
static void run_shares(int threads, void *(*work)(void *), void *shares, size_t size) {
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    char *at = shares;
    for (int t = 1; t < threads; t++)
        started[t] = pthread_create(&ids[t], NULL, work, at + (size_t)t * size) == 0;
    work(at);
    for (int t = 1; t < threads; t++) {
        if (started[t])
            pthread_join(ids[t], NULL);
        else
            work(at + (size_t)t * size);
    }
}

/* The batch on up to `threads` threads (this one included), each taking a contiguous run
 * of whole blocks. A row is walked the same way whichever thread takes it, so the sums
 * do not depend on the split. A thread that cannot be started leaves its share to this
 * one. Returns -1 (nothing done) when out of memory. */
static int predict_batch(const Batch *b, Py_ssize_t n_rows, int threads) {
    const Py_ssize_t n_blocks = (n_rows + BLOCK - 1) / BLOCK;
    threads = thread_count(threads, n_blocks);
    const size_t block_size = sizeof(double) * BLOCK * (size_t)(b->n_columns ? b->n_columns : 1);
    double *blocks = malloc(block_size * (size_t)threads);
    if (blocks == NULL) return -1;
    Share shares[MAX_THREADS];
    for (int t = 0; t < threads; t++) {
        shares[t].batch = b;
        share_rows(n_rows, t, threads, &shares[t].first, &shares[t].last);
        shares[t].block = blocks + (size_t)t * (block_size / sizeof(double));
    }
    run_shares(threads, predict_share, shares, sizeof(Share));
    free(blocks);
    return 0;
}

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
"accumulate(nodes, leaves, trees, width, n_features, x, out, bits=None, threads=1)\n\n"
"Add to out[row, tree.column:tree.column + width] the leaf values every row of x reaches\n"
"in every tree, tree by tree in order. x: rows x n_features, float32 or float64, C order;\n"
"out: rows x columns, float64 or float32 (the precision of the sums), C order, in place.\n"
"bits: the category bitsets (uint32) of a forest with category splits, else None.\n"
"threads: split the rows between this many threads (the sums are the same).");

/* The buffers of a call on a laid-out forest (open_call acquires them, close_call
 * releases them): the nodes, the values per node (accumulate's leaves, contributions'
 * values), the trees, the rows x, the sums out and the category bitsets. */
typedef struct {
    Py_buffer nodes, values, trees, x, out, bits;
    Py_ssize_t n_trees;
    int x_is_float;
} ForestCall;

static void close_call(ForestCall *c) {
    Py_buffer *views[6] = {&c->nodes, &c->values, &c->trees, &c->x, &c->out, &c->bits};
    for (int i = 0; i < 6; i++)
        if (views[i]->obj) PyBuffer_Release(views[i]);
}

/* Acquire a call's buffers (objs: nodes, values, trees, x, out, bits or None) and check
 * what every walk relies on: the layout's sizes, x (rows x at least n_features, float32
 * or float64), out (`out_ndim` dimensions, a row per row of x) and every tree inside the
 * layout and inside out's columns. -1 with an exception set on failure (close_call
 * releases what was acquired). */
static int open_call(ForestCall *c, PyObject *const objs[6], const char *values_name,
                     Py_ssize_t width, Py_ssize_t n_features, int out_ndim) {
    if (contiguous(objs[0], &c->nodes, PyBUF_SIMPLE, "nodes") < 0) return -1;
    if (contiguous(objs[1], &c->values, PyBUF_SIMPLE, values_name) < 0) return -1;
    if (contiguous(objs[2], &c->trees, PyBUF_SIMPLE, "trees") < 0) return -1;
    if (contiguous(objs[3], &c->x, PyBUF_ND | PyBUF_FORMAT, "x") < 0) return -1;
    if (contiguous(objs[4], &c->out, PyBUF_ND | PyBUF_FORMAT | PyBUF_WRITABLE, "out") < 0)
        return -1;
    if (objs[5] != Py_None && contiguous(objs[5], &c->bits, PyBUF_SIMPLE, "bits") < 0)
        return -1;
    const Py_ssize_t n_nodes = c->nodes.len / (Py_ssize_t)sizeof(Node);
    c->n_trees = c->trees.len / (Py_ssize_t)sizeof(Tree);
    if (c->nodes.len % (Py_ssize_t)sizeof(Node) || c->trees.len % (Py_ssize_t)sizeof(Tree) ||
        width < 1 || n_features < 1 ||
        c->values.len != n_nodes * width * (Py_ssize_t)sizeof(double) ||
        c->bits.len % (Py_ssize_t)sizeof(uint32_t)) {
        PyErr_SetString(PyExc_ValueError, "inconsistent forest layout");
        return -1;
    }
    const char kind = native_kind(c->x.format);
    c->x_is_float = kind == 'f';
    if (c->x.ndim != 2 || (kind != 'f' && kind != 'd') || c->x.shape[1] < n_features) {
        PyErr_Format(PyExc_ValueError, "x must be a 2-D float32 or float64 array of %zd columns",
                     n_features);
        return -1;
    }
    if (c->out.ndim != out_ndim || c->out.shape[0] != c->x.shape[0]) {
        PyErr_Format(PyExc_ValueError, "out must have %d dimensions and a row per row of x",
                     out_ndim);
        return -1;
    }
    const Tree *tree_table = (const Tree *)c->trees.buf;
    for (Py_ssize_t t = 0; t < c->n_trees; t++) {
        const Tree tree = tree_table[t];
        if (tree.root < 0 || tree.root >= n_nodes || tree.depth < 0 || tree.column < 0 ||
            tree.column + width > c->out.shape[1] || tree.settle < 0 ||
            tree.settle > tree.depth) {
            PyErr_SetString(PyExc_ValueError, "a tree lies outside the forest layout");
            return -1;
        }
    }
    return 0;
}

static PyObject *accumulate(PyObject *self, PyObject *args) {
    PyObject *objs[6] = {NULL, NULL, NULL, NULL, NULL, Py_None};
    Py_ssize_t width, n_features;
    int threads = 1;
    if (!PyArg_ParseTuple(args, "OOOnnOO|Oi", &objs[0], &objs[1], &objs[2], &width,
                          &n_features, &objs[3], &objs[4], &objs[5], &threads))
        return NULL;
    ForestCall c = {0};
    PyObject *result = NULL;
    if (open_call(&c, objs, "leaves", width, n_features, 2) < 0) goto done;
    const char out_kind = native_kind(c.out.format);
    if (out_kind != 'd' && out_kind != 'f') {
        PyErr_SetString(PyExc_ValueError, "out must be a float64 or float32 array");
        goto done;
    }
    const Batch batch = {
        .nodes = (const Node *)c.nodes.buf,
        .leaves = (const double *)c.values.buf,
        .bits = c.bits.len ? (const uint32_t *)c.bits.buf : NULL,
        .trees = (const Tree *)c.trees.buf,
        .n_trees = c.n_trees,
        .width = width,
        .x = (const char *)c.x.buf,
        .itemsize = c.x.itemsize,
        .n_columns = c.x.shape[1],
        .widen = c.x_is_float ? widen_float : widen_double,
        .out = c.out.buf,
        .out_columns = c.out.shape[1],
        .sum_double = out_kind == 'd',
    };
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = predict_batch(&batch, c.x.shape[0], threads);
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    close_call(&c);
    return result;
}

/* Saabas contributions: one row's path through every tree, each step crediting the change
 * of the node's value (`values`: every node's, slot by slot, laid out as `leaves`) to
 * the split's feature, and the root's value to the bias (column n_features). `out` holds
 * the row's n_columns x (n_features + 1) sums. The path's steps telescope, so a tree adds
 * exactly its leaf's value minus its root's to the features. */
static void contribute_row(const Node *nodes, const double *values, const uint32_t *bits,
                           const Tree *trees, Py_ssize_t n_trees, Py_ssize_t width,
                           const double *row, Py_ssize_t n_features, double *out) {
    const Py_ssize_t stride = n_features + 1;
    for (Py_ssize_t t = 0; t < n_trees; t++) {
        const Tree tree = trees[t];
        double *sums = out + tree.column * stride;
        int32_t at = tree.root;
        for (Py_ssize_t k = 0; k < width; k++)
            sums[k * stride + n_features] += values[(Py_ssize_t)at * width + k];
        for (int32_t level = 0; level < tree.depth; level++) {
            const Node *node = &nodes[at];
            if (node->left == at) break; /* a leaf */
            const uint32_t feature = node->feature_flags & FEATURE_MASK;
            const int32_t next = bits != NULL ? step_cat(node, row[feature], bits)
                                              : step_full(node, row[feature]);
            const double *from = values + (Py_ssize_t)at * width;
            const double *to = values + (Py_ssize_t)next * width;
            for (Py_ssize_t k = 0; k < width; k++)
                sums[k * stride + feature] += to[k] - from[k];
            at = next;
        }
    }
}

PyDoc_STRVAR(contributions_doc,
"contributions(nodes, values, trees, width, n_features, x, out, bits=None)\n\n"
"Add each row's Saabas contributions to out[row]: n_columns x (n_features + 1), float64,\n"
"C order, the last column the root values (the bias). values: every node's values, laid\n"
"out as accumulate's leaves. x: rows x n_features, float32 or float64, C order.");

static PyObject *contributions(PyObject *self, PyObject *args) {
    PyObject *objs[6] = {NULL, NULL, NULL, NULL, NULL, Py_None};
    Py_ssize_t width, n_features;
    if (!PyArg_ParseTuple(args, "OOOnnOO|O", &objs[0], &objs[1], &objs[2], &width,
                          &n_features, &objs[3], &objs[4], &objs[5]))
        return NULL;
    ForestCall c = {0};
    PyObject *result = NULL;
    double *row = NULL;
    if (open_call(&c, objs, "values", width, n_features, 3) < 0) goto done;
    if (native_kind(c.out.format) != 'd' || c.out.shape[2] != n_features + 1) {
        PyErr_SetString(PyExc_ValueError,
                        "out must be a float64 array of rows x columns x (n_features + 1)");
        goto done;
    }
    /* The nodes are lay_out's (every child inside the layout), as accumulate trusts them. */
    const Py_ssize_t columns = c.x.shape[1];
    row = PyMem_RawMalloc(sizeof(double) * (size_t)columns);
    if (row == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const Widen widen = c.x_is_float ? widen_float : widen_double;
    const uint32_t *bits = c.bits.len ? (const uint32_t *)c.bits.buf : NULL;
    const Py_ssize_t per_row = c.out.shape[1] * (n_features + 1);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < c.x.shape[0]; r++) {
        widen((const char *)c.x.buf + r * columns * c.x.itemsize, columns, row);
        contribute_row((const Node *)c.nodes.buf, (const double *)c.values.buf, bits,
                       (const Tree *)c.trees.buf, c.n_trees, width, row, n_features,
                       (double *)c.out.buf + r * per_row);
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    close_call(&c);
    PyMem_RawFree(row);
    return result;
}

/* A breadth-first walk of one source tree, laying each node out as it comes: an inner
 * node's children take the next two free slots, so they are neighbours. Returns the
 * tree's depth, or -1 with a message in `error` for arrays that are not one tree. */
static int32_t lay_out_tree(const int64_t *left, const int64_t *right, const int64_t *feature,
                            const double *threshold, const uint32_t *flags,
                            const double *values, Py_ssize_t n, Py_ssize_t width,
                            Py_ssize_t n_features, Node *nodes, double *leaves,
                            Py_ssize_t first, int64_t *queue, int32_t *levels,
                            uint8_t *seen, const char **error) {
    /* queue[i]: the source node laid out i-th, in slot first + i (slots are taken in
     * the walk's order); levels[i]: its depth. */
    Py_ssize_t head = 0, tail = 1, next = 1;
    int32_t depth = 0;
    memset(seen, 0, (size_t)n);
    queue[0] = 0;
    levels[0] = 0;
    seen[0] = 1;
    while (head < tail) {
        const int64_t source = queue[head];
        const int32_t level = levels[head];
        const Py_ssize_t slot = first + head;
        head++;
        if (level > depth) depth = level;
        double *leaf = leaves + slot * width;
        if (left[source] < 0) {
            nodes[slot].threshold = INFINITY; /* every number and (NAN_LEFT) NaN stay */
            nodes[slot].feature_flags = NAN_LEFT;
            nodes[slot].left = (int32_t)slot;
            memcpy(leaf, values + source * width, sizeof(double) * (size_t)width);
            continue;
        }
        const int64_t children[2] = {left[source], right[source]};
        if (feature[source] < 0 || feature[source] >= n_features) {
            *error = "a split on a feature the model does not have";
            return -1;
        }
        if (flags[source] & ~FLAG_MASK) {
            *error = "unknown split flags";
            return -1;
        }
        for (int c = 0; c < 2; c++) {
            if (children[c] <= 0 || children[c] >= n || seen[children[c]]) {
                *error = "the node arrays are not one tree";
                return -1;
            }
            seen[children[c]] = 1;
            queue[tail] = children[c];
            levels[tail] = level + 1;
            tail++;
        }
        nodes[slot].threshold = threshold[source];
        nodes[slot].feature_flags = (uint32_t)feature[source] | flags[source];
        nodes[slot].left = (int32_t)(first + next);
        next += 2;
        memset(leaf, 0, sizeof(double) * (size_t)width);
    }
    if (tail != n) {
        *error = "the node arrays hold nodes that no path reaches";
        return -1;
    }
    return depth;
}

/* The costs `settle_level` weighs, in steps of the walk over every row of a block:
 * setting the list of the rows still walking, one per row; a step through that list costs
 * more than a plain one (one more load). Measured on the benchmark's models (RESULTS.md,
 * "The settle level of the tree walk"): chosen this way, LightGBM's walk of 256 rows is
 * 12% faster and XGBoost's and the random forest's trees walk as before; cheaper lists
 * settle more trees for no gain, dearer ones fewer for less. */
#define LIST_COST 1.0
#define LISTED_STEP_COST 1.25
#define WORTH 0.95 /* settle only for at least a 5% cheaper walk */

/* The level after which the rows at their leaves leave a tree's walk (`Tree.settle`),
 * from `weights` (the training rows, or their weight, that reached each source node):
 * the level whose expected cost, the plain levels before it, the list and the listed
 * steps of the rows still walking, is lowest, when it beats walking every row to `depth`
 * by enough. `queue` and `levels` are lay_out_tree's (source node and depth in layout
 * order); `at_depth` has room for depth + 1 sums. */
static int32_t settle_level(const int64_t *left, const double *weights, const int64_t *queue,
                            const int32_t *levels, Py_ssize_t n, int32_t depth,
                            double *at_depth) {
    const double total = weights[0];
    if (depth < 2 || !(total > 0.0) || !isfinite(total)) return depth;
    for (int32_t d = 0; d <= depth; d++) at_depth[d] = 0.0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (left[queue[i]] < 0 && weights[queue[i]] > 0.0) at_depth[levels[i]] += weights[queue[i]];
    int32_t best = depth;
    double best_cost = WORTH * depth, settled = at_depth[0];
    for (int32_t level = 1; level < depth; level++) {
        settled += at_depth[level]; /* the share of rows at their leaves after `level` steps */
        double walking = 1.0 - settled / total;
        if (walking < 0.0) walking = 0.0;
        const double cost = level + LIST_COST + walking * (depth - level) * LISTED_STEP_COST;
        if (cost < best_cost) {
            best_cost = cost;
            best = level;
        }
    }
    return best;
}

PyDoc_STRVAR(lay_out_doc,
"lay_out(left, right, feature, threshold, flags, values, n_features, nodes, leaves, first,\n"
"        weights=None)\n\n"
"Lay one tree out into nodes[first:first + n] and leaves[first:first + n], breadth first\n"
"from its root (node 0), and return (depth, settle): its depth and the level after which\n"
"the walk leaves out the rows at their leaves (the depth: never). The tree as n-node\n"
"arrays: left and right children (int64, -1 at a leaf), feature (int64), threshold\n"
"(float64), flags (uint32, the kernel's split rules), values (float64, n x width: a leaf's\n"
"values), weights (float64 or None: the training rows, or their weight, each node saw;\n"
"without them the settle level is the depth).");

static PyObject *lay_out(PyObject *self, PyObject *args) {
    PyObject *objs[6], *nodes_obj, *leaves_obj, *weights_obj = Py_None;
    Py_ssize_t n_features, first;
    if (!PyArg_ParseTuple(args, "OOOOOOnOOn|O", &objs[0], &objs[1], &objs[2], &objs[3],
                          &objs[4], &objs[5], &n_features, &nodes_obj, &leaves_obj, &first,
                          &weights_obj))
        return NULL;
    static const char *names[6] = {"left", "right", "feature", "threshold", "flags", "values"};
    static const char kinds[6] = {'q', 'q', 'q', 'd', 'I', 'd'};
    Py_buffer views[6] = {{0}}, nodes = {0}, leaves = {0}, weights = {0};
    PyObject *result = NULL;
    int64_t *queue = NULL;
    int32_t *levels = NULL;
    uint8_t *seen = NULL;
    double *at_depth = NULL;
    for (int i = 0; i < 6; i++) {
        if (contiguous(objs[i], &views[i], PyBUF_ND | PyBUF_FORMAT, names[i]) < 0) goto done;
        char kind = native_kind(views[i].format);
        if (kind == 'l' && sizeof(long) == 8) kind = 'q';
        if (kind == 'L' && sizeof(long) == 4) kind = 'I';
        if (kind != kinds[i]) {
            PyErr_Format(PyExc_ValueError, "%s has the wrong type", names[i]);
            goto done;
        }
    }
    if (contiguous(nodes_obj, &nodes, PyBUF_WRITABLE, "nodes") < 0) goto done;
    if (contiguous(leaves_obj, &leaves, PyBUF_WRITABLE, "leaves") < 0) goto done;
    const Py_ssize_t n = views[0].len / 8;
    const Py_ssize_t n_slots = nodes.len / (Py_ssize_t)sizeof(Node);
    if (n < 1 || views[1].len != n * 8 || views[2].len != n * 8 || views[3].len != n * 8 ||
        views[4].len != n * 4 || views[5].len < n * 8 || views[5].len % (n * 8) || nodes.len % (Py_ssize_t)sizeof(Node) ||
        first < 0 || first > n_slots - n || n_slots > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "inconsistent tree arrays");
        goto done;
    }
    const Py_ssize_t width = views[5].len / (n * 8);
    if (leaves.len != n_slots * width * (Py_ssize_t)sizeof(double)) {
        PyErr_SetString(PyExc_ValueError, "leaves do not match nodes");
        goto done;
    }
    if (weights_obj != Py_None) {
        if (contiguous(weights_obj, &weights, PyBUF_ND | PyBUF_FORMAT, "weights") < 0) goto done;
        if (native_kind(weights.format) != 'd' || weights.len != n * 8) {
            PyErr_SetString(PyExc_ValueError, "weights must be float64, one per node");
            goto done;
        }
    }
    queue = PyMem_RawMalloc(sizeof(int64_t) * (size_t)n);
    levels = PyMem_RawMalloc(sizeof(int32_t) * (size_t)n);
    seen = PyMem_RawMalloc((size_t)n);
    at_depth = PyMem_RawMalloc(sizeof(double) * (size_t)(n + 1)); /* a depth is below n */
    if (queue == NULL || levels == NULL || seen == NULL || at_depth == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const char *error = NULL;
    int32_t depth, settle;
    Py_BEGIN_ALLOW_THREADS
    depth = lay_out_tree(views[0].buf, views[1].buf, views[2].buf, views[3].buf, views[4].buf,
                         views[5].buf, n, width, n_features, nodes.buf, leaves.buf, first,
                         queue, levels, seen, &error);
    settle = depth >= 0 && weights.obj != NULL
                 ? settle_level(views[0].buf, weights.buf, queue, levels, n, depth, at_depth)
                 : depth;
    Py_END_ALLOW_THREADS
    if (depth < 0) {
        PyErr_SetString(PyExc_ValueError, error);
        goto done;
    }
    result = Py_BuildValue("(ii)", depth, settle);
done:
    for (int i = 0; i < 6; i++)
        if (views[i].obj) PyBuffer_Release(&views[i]);
    if (nodes.obj) PyBuffer_Release(&nodes);
    if (leaves.obj) PyBuffer_Release(&leaves);
    if (weights.obj) PyBuffer_Release(&weights);
    PyMem_RawFree(queue);
    PyMem_RawFree(at_depth);
    PyMem_RawFree(levels);
    PyMem_RawFree(seen);
    return result;
}

PyDoc_STRVAR(libm_doc,
"libm(function, values, scale=1.0)\n\n"
"Apply the C library's exp (function 0), log1p (1) or LightGBM's sigmoid\n"
"1 / (1 + exp(-scale * x)) (2) to every element of values (float64, C order, writable), in\n"
"place. numpy's exp and log1p are its own vectorised code (AVX-512) and may differ from the\n"
"C library's in the last bit; LightGBM's link functions call the C library's, so its\n"
"answers are reproduced to the bit only with these. The sigmoid is the same operations as\n"
"numpy would do around exp, in one call (four numpy calls cost a batch-1 row ~3 us).");

static PyObject *libm(PyObject *self, PyObject *args) {
    int function;
    PyObject *values_obj;
    double scale = 1.0;
    if (!PyArg_ParseTuple(args, "iO|d", &function, &values_obj, &scale)) return NULL;
    if (function < 0 || function > 2) {
        PyErr_SetString(PyExc_ValueError, "function must be 0 (exp), 1 (log1p) or 2 (sigmoid)");
        return NULL;
    }
    Py_buffer values;
    if (contiguous(values_obj, &values, PyBUF_WRITABLE | PyBUF_FORMAT, "values") < 0)
        return NULL;
    if (native_kind(values.format) != 'd') {
        PyBuffer_Release(&values);
        PyErr_SetString(PyExc_ValueError, "values must be float64");
        return NULL;
    }
    double *x = values.buf;
    const Py_ssize_t n = values.len / (Py_ssize_t)sizeof(double);
    Py_BEGIN_ALLOW_THREADS
    if (function == 0)
        for (Py_ssize_t i = 0; i < n; i++) x[i] = exp(x[i]);
    else if (function == 1)
        for (Py_ssize_t i = 0; i < n; i++) x[i] = log1p(x[i]);
    else
        for (Py_ssize_t i = 0; i < n; i++) x[i] = 1.0 / (1.0 + exp(-scale * x[i]));
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&values);
    Py_RETURN_NONE;
}

/* Oblivious trees (CatBoost's): a layout and a walk of their own. */
#include "oblivious.h"

static PyMethodDef methods[] = {
    {"accumulate", accumulate, METH_VARARGS, accumulate_doc},
    {"lay_out", lay_out, METH_VARARGS, lay_out_doc},
    {"contributions", contributions, METH_VARARGS, contributions_doc},
    {"libm", libm, METH_VARARGS, libm_doc},
    {"oblivious", oblivious, METH_VARARGS, oblivious_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kernel", "inferpool's tree-ensemble kernel.", -1, methods,
};

PyMODINIT_FUNC PyInit__kernel(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "NODE_SIZE", (long)sizeof(Node)) < 0 ||
        PyModule_AddIntConstant(m, "TREE_SIZE", (long)sizeof(Tree)) < 0 ||
        PyModule_AddIntConstant(m, "MAX_THREADS", MAX_THREADS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
