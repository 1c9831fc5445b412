/*
 * Serves a tree model compiled by tl2cgen (treelite's C code generator) through inferpool's
 * native ABI (docs/native/inferpool_model.h): it adapts tl2cgen's generated per-row
 * `predict(union Entry *data, int pred_margin, leaf_t *result)` to inferpool_model_predict.
 *
 * Generate the model's C code with tl2cgen, then build it with this file (from the
 * repository's root, the generated code in src/):
 *
 *   python -c "import treelite, tl2cgen; \
 *     tl2cgen.generate_c_code(treelite.frontend.from_lightgbm(booster), dirpath='src', params={})"
 *   gcc -O2 -shared -fPIC -Isrc -Idocs/native src/main.c docs/examples/native/tl2cgen_shim.c \
 *       -o model.so
 *
 * (with every .c file that tl2cgen wrote in src/, which its recipe.json lists).
 *
 * A model whose leaf outputs are float32 (XGBoost's; tl2cgen's get_leaf_output_type() says
 * it) needs -DLEAF_T=float. Outputs are FP64: one value per target and class (the
 * probability of a binary classifier, or each class's, as the original library's predict).
 * A NaN feature is a missing value, as LightGBM and XGBoost read it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "header.h"
#include "inferpool_model.h"

#ifndef LEAF_T
#define LEAF_T double
#endif

/* tl2cgen's Entry holds `float fvalue` or `double fvalue`, as the model's thresholds. */
typedef __typeof__(((union Entry *)0)->fvalue) feature_t;

static char metadata[512];
static int32_t n_outputs;

int inferpool_abi_version(void) { return INFERPOOL_ABI_VERSION; }

int inferpool_model_init(const char *folder, char *error, size_t error_len) {
    (void)folder;
    (void)error;
    (void)error_len;
    int32_t classes[N_TARGET];
    get_num_class(classes);
    n_outputs = 0;
    for (int i = 0; i < N_TARGET; i++) n_outputs += classes[i];
    snprintf(metadata, sizeof metadata,
             "{\"inputs\": [{\"name\": \"input-0\", \"datatype\": \"FP64\", \"shape\": [-1, %d]}],"
             " \"outputs\": [{\"name\": \"predict\", \"datatype\": \"FP64\", \"shape\": [-1, %d]}],"
             " \"input_datatypes\": [\"FP64\", \"FP32\"],"
             " \"thread_safe\": true, \"rows_independent\": true}",
             (int)get_num_feature(), (int)n_outputs);
    return INFERPOOL_OK;
}

int inferpool_model_metadata(const char **json_out) {
    *json_out = metadata;
    return INFERPOOL_OK;
}

int inferpool_model_predict(const void *in, int64_t rows, int64_t cols, int dtype, void *out,
                            int64_t out_len, char *error, size_t error_len) {
    if (cols != get_num_feature()) {
        snprintf(error, error_len, "expected %d features, got %lld", (int)get_num_feature(),
                 (long long)cols);
        return INFERPOOL_BAD_INPUT;
    }
    if (out_len != rows * n_outputs) {
        snprintf(error, error_len, "output buffer of %lld values for %lld rows",
                 (long long)out_len, (long long)rows);
        return INFERPOOL_MODEL_FAILURE;
    }
    /* One row's features and results at a time: stack-sized for the usual models. */
    union Entry *data = malloc(sizeof(union Entry) * (size_t)cols);
    LEAF_T *result = malloc(sizeof(LEAF_T) * (size_t)n_outputs);
    if (data == NULL || result == NULL) {
        free(data);
        free(result);
        snprintf(error, error_len, "out of memory");
        return INFERPOOL_MODEL_FAILURE;
    }
    double *answer = out;
    for (int64_t row = 0; row < rows; row++) {
        for (int64_t col = 0; col < cols; col++) {
            double x = dtype == INFERPOOL_FP32 ? ((const float *)in)[row * cols + col]
                                               : ((const double *)in)[row * cols + col];
            if (isnan(x)) {
                data[col].missing = -1;
            } else {
                data[col].fvalue = (feature_t)x;
            }
        }
        memset(result, 0, sizeof(LEAF_T) * (size_t)n_outputs);
        predict(data, 0, result);
        for (int32_t k = 0; k < n_outputs; k++) answer[row * n_outputs + k] = (double)result[k];
    }
    free(data);
    free(result);
    return INFERPOOL_OK;
}
