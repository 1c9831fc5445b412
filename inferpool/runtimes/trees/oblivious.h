/* The tree kernel's walk of oblivious (symmetric) trees, CatBoost's: every level of a tree
 * splits on one (feature, border) pair, so a row's leaf is a d-bit index, bit l set when
 * the row's value of level l's feature is above level l's border. The d compares of a tree
 * are independent of each other (no chain of loads as in a walk from node to node), so the
 * CPU computes a block's indexes side by side. Included by _kernel.c (one translation
 * unit); the layout is built by inferpool/runtimes/trees/oblivious.py.
 *
 * CatBoost's rule, reproduced: the features as float32, `x > border` in float32 sets the
 * bit; a NaN sets it only for a feature whose NaNs count as above every border (CatBoost's
 * nan_value_treatment "AsTrue"), since NaN > border is false. The leaf values are added
 * to the rows' sums tree by tree in order, in double precision, as CatBoost adds them. */

typedef struct {
    float border;     /* x > border sets the level's bit */
    uint32_t feature; /* the feature's column; OBLIVIOUS_NAN_ABOVE: a NaN sets the bit */
} ObliviousSplit;

typedef struct {
    int32_t first; /* the tree's first split (level 0, the index's lowest bit) */
    int32_t depth; /* its levels: 2^depth leaves */
    int32_t leaf;  /* its first leaf */
} ObliviousTree;

#define OBLIVIOUS_NAN_ABOVE (1u << 31)
#define OBLIVIOUS_MAX_DEPTH 20 /* CatBoost grows at most 16 levels */

/* What a batch walks through, and where its rows and sums are. */
typedef struct {
    const ObliviousSplit *splits;
    const ObliviousTree *trees;
    const double *leaves;
    Py_ssize_t n_trees, width;
    const float *x;
    Py_ssize_t n_columns;
    double *out; /* rows x width */
} ObliviousBatch;

/* The leaf index of one row in one tree. */
static inline uint32_t oblivious_index(const ObliviousSplit *split, int32_t depth,
                                       const float *row) {
    uint32_t index = 0;
    for (int32_t level = 0; level < depth; level++) {
        const uint32_t feature = split[level].feature;
        const float v = row[feature & ~OBLIVIOUS_NAN_ABOVE];
        const uint32_t above = (v > split[level].border) | ((feature >> 31) & (v != v));
        index |= above << level;
    }
    return index;
}

/* The leaf values of `at` (a block's leaf indexes in one tree) added to the block's sums. */
static inline void oblivious_add(const ObliviousBatch *b, const double *leaves,
                                 const uint32_t *at, Py_ssize_t rows, double *sums) {
    if (b->width == 1) {
        for (Py_ssize_t r = 0; r < rows; r++) sums[r] += leaves[at[r]];
        return;
    }
    for (Py_ssize_t r = 0; r < rows; r++) {
        const double *leaf = leaves + (Py_ssize_t)at[r] * b->width;
        for (Py_ssize_t k = 0; k < b->width; k++) sums[r * b->width + k] += leaf[k];
    }
}

/* A block's leaf indexes in one tree, from the block laid out by feature (`columns`:
 * feature f's values of the block's rows at f * BLOCK): a level is one compare of
 * contiguous values against one border, which the compiler vectorises. */
static inline void oblivious_block_index(const ObliviousSplit *split, int32_t depth,
                                         const float *columns, Py_ssize_t rows,
                                         uint32_t *at) {
    for (Py_ssize_t r = 0; r < rows; r++) at[r] = 0;
    for (int32_t level = 0; level < depth; level++) {
        const uint32_t feature = split[level].feature;
        const float border = split[level].border;
        const float *v = columns + (Py_ssize_t)(feature & ~OBLIVIOUS_NAN_ABOVE) * BLOCK;
        if (feature & OBLIVIOUS_NAN_ABOVE) {
            for (Py_ssize_t r = 0; r < rows; r++)
                at[r] |= (uint32_t)((v[r] > border) | (v[r] != v[r])) << level;
        } else {
            for (Py_ssize_t r = 0; r < rows; r++) at[r] |= (uint32_t)(v[r] > border) << level;
        }
    }
}

/* Rows [first, last) through every tree, a block of rows at a time, laid out by feature
 * in `columns` (n_columns x BLOCK floats); a block of fewer than FEW_ROWS rows walks row
 * by row (laying it out would cost more than it saves). */
static void oblivious_rows(const ObliviousBatch *b, Py_ssize_t first_row, Py_ssize_t last_row,
                           float *columns) {
    uint32_t at[BLOCK];
    for (Py_ssize_t first = first_row; first < last_row; first += BLOCK) {
        const Py_ssize_t rows = last_row - first < BLOCK ? last_row - first : BLOCK;
        const float *block = b->x + first * b->n_columns;
        double *sums = b->out + first * b->width;
        const int few = rows < FEW_ROWS;
        if (!few)
            for (Py_ssize_t r = 0; r < rows; r++)
                for (Py_ssize_t f = 0; f < b->n_columns; f++)
                    columns[f * BLOCK + r] = block[r * b->n_columns + f];
        for (Py_ssize_t t = 0; t < b->n_trees; t++) {
            const ObliviousTree tree = b->trees[t];
            const ObliviousSplit *split = b->splits + tree.first;
            if (few)
                for (Py_ssize_t r = 0; r < rows; r++)
                    at[r] = oblivious_index(split, tree.depth, block + r * b->n_columns);
            else
                oblivious_block_index(split, tree.depth, columns, rows, at);
            oblivious_add(b, b->leaves + (Py_ssize_t)tree.leaf * b->width, at, rows, sums);
        }
    }
}

typedef struct {
    const ObliviousBatch *batch;
    Py_ssize_t first, last;
    float *columns;
} ObliviousShare;

static void *oblivious_share(void *arg) {
    const ObliviousShare *share = (const ObliviousShare *)arg;
    oblivious_rows(share->batch, share->first, share->last, share->columns);
    return NULL;
}

/* The batch on up to `threads` threads (this one included), each a contiguous run of
 * whole blocks; a row's sums do not depend on which thread adds them. Returns -1 (nothing
 * done) when out of memory. */
static int oblivious_batch(const ObliviousBatch *b, Py_ssize_t n_rows, int threads) {
    threads = thread_count(threads, (n_rows + BLOCK - 1) / BLOCK);
    const size_t per_thread = (size_t)BLOCK * (size_t)(b->n_columns ? b->n_columns : 1);
    float *columns = n_rows >= FEW_ROWS ? malloc(sizeof(float) * per_thread * threads) : NULL;
    if (n_rows >= FEW_ROWS && columns == NULL) return -1;
    ObliviousShare shares[MAX_THREADS];
    for (int t = 0; t < threads; t++) {
        shares[t].batch = b;
        share_rows(n_rows, t, threads, &shares[t].first, &shares[t].last);
        shares[t].columns = columns != NULL ? columns + per_thread * (size_t)t : NULL;
    }
    run_shares(threads, oblivious_share, shares, sizeof(ObliviousShare));
    free(columns);
    return 0;
}

/* Whether every tree's splits and leaves lie inside the arrays and every split's feature
 * is a column of x: the walk reads only where these say. */
static int oblivious_layout_ok(const ObliviousSplit *splits, Py_ssize_t n_splits,
                               const ObliviousTree *trees, Py_ssize_t n_trees,
                               Py_ssize_t n_leaves, Py_ssize_t n_features) {
    for (Py_ssize_t s = 0; s < n_splits; s++)
        if ((Py_ssize_t)(splits[s].feature & ~OBLIVIOUS_NAN_ABOVE) >= n_features) return 0;
    for (Py_ssize_t t = 0; t < n_trees; t++) {
        const ObliviousTree tree = trees[t];
        if (tree.first < 0 || tree.depth < 0 || tree.depth > OBLIVIOUS_MAX_DEPTH ||
            tree.leaf < 0 || tree.first + (Py_ssize_t)tree.depth > n_splits ||
            tree.leaf + ((Py_ssize_t)1 << tree.depth) > n_leaves)
            return 0;
    }
    return 1;
}

PyDoc_STRVAR(oblivious_doc,
"oblivious(splits, trees, leaves, width, n_features, x, out, threads=1)\n\n"
"Add to out[row] (rows x width, float64, C order) the leaf values every row of x (rows x\n"
"n_features or more, float32, C order) reaches in every oblivious tree, tree by tree in\n"
"order. splits: (border float32, feature uint32) pairs, the feature's top bit set when a\n"
"NaN counts as above the border; trees: (first split, depth, first leaf) int32 triples;\n"
"leaves: float64, width values a leaf. threads: split the rows between this many threads\n"
"(the sums are the same).");

static PyObject *oblivious(PyObject *self, PyObject *args) {
    PyObject *splits_obj, *trees_obj, *leaves_obj, *x_obj, *out_obj;
    Py_ssize_t width, n_features;
    int threads = 1;
    if (!PyArg_ParseTuple(args, "OOOnnOO|i", &splits_obj, &trees_obj, &leaves_obj, &width,
                          &n_features, &x_obj, &out_obj, &threads))
        return NULL;
    Py_buffer splits = {0}, trees = {0}, leaves = {0}, x = {0}, out = {0};
    PyObject *result = NULL;
    if (contiguous(splits_obj, &splits, PyBUF_SIMPLE, "splits") < 0 ||
        contiguous(trees_obj, &trees, PyBUF_SIMPLE, "trees") < 0 ||
        contiguous(leaves_obj, &leaves, PyBUF_SIMPLE, "leaves") < 0 ||
        contiguous(x_obj, &x, PyBUF_ND | PyBUF_FORMAT, "x") < 0 ||
        contiguous(out_obj, &out, PyBUF_ND | PyBUF_FORMAT | PyBUF_WRITABLE, "out") < 0)
        goto done;
    if (native_kind(x.format) != 'f' || x.ndim != 2 || x.shape[1] < n_features ||
        native_kind(out.format) != 'd' || out.ndim != 2 || out.shape[0] != x.shape[0] ||
        out.shape[1] != width || width < 1) {
        PyErr_SetString(PyExc_ValueError,
                        "x must be float32 rows of n_features, out float64 rows of width");
        goto done;
    }
    const Py_ssize_t n_splits = splits.len / (Py_ssize_t)sizeof(ObliviousSplit);
    const Py_ssize_t n_trees = trees.len / (Py_ssize_t)sizeof(ObliviousTree);
    const Py_ssize_t n_leaves = leaves.len / (Py_ssize_t)sizeof(double) / width;
    if (splits.len % (Py_ssize_t)sizeof(ObliviousSplit) ||
        trees.len % (Py_ssize_t)sizeof(ObliviousTree) ||
        leaves.len % ((Py_ssize_t)sizeof(double) * width) ||
        !oblivious_layout_ok(splits.buf, n_splits, trees.buf, n_trees, n_leaves, n_features)) {
        PyErr_SetString(PyExc_ValueError, "inconsistent oblivious forest layout");
        goto done;
    }
    const ObliviousBatch batch = {
        .splits = splits.buf,
        .trees = trees.buf,
        .leaves = leaves.buf,
        .n_trees = n_trees,
        .width = width,
        .x = x.buf,
        .n_columns = x.shape[1],
        .out = out.buf,
    };
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = oblivious_batch(&batch, x.shape[0], threads);
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    if (splits.obj) PyBuffer_Release(&splits);
    if (trees.obj) PyBuffer_Release(&trees);
    if (leaves.obj) PyBuffer_Release(&leaves);
    if (x.obj) PyBuffer_Release(&x);
    if (out.obj) PyBuffer_Release(&out);
    return result;
}
