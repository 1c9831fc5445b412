/*
 * A linear regression served by inferpool's `native` runtime (docs/runtimes/native.md).
 *
 * Its weights come from `coefficients.txt` in the model's folder, read by
 * inferpool_model_init: whitespace-separated numbers, the intercept first, then one
 * coefficient per feature. Build (from the repository's root):
 *
 *   gcc -O2 -shared -fPIC -Idocs/native docs/examples/native/linear.c -o model.so
 *
 * and put model.so and coefficients.txt in the model's folder, with a model-settings.json
 * saying {"name": "linear", "implementation": "native"}.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "inferpool_model.h"

#define MAX_FEATURES 4096

static double intercept;
static double coefficients[MAX_FEATURES];
static int64_t n_features;
static char metadata[512];

int inferpool_abi_version(void) { return INFERPOOL_ABI_VERSION; }

int inferpool_model_init(const char *folder, char *error, size_t error_len) {
    char path[4096];
    snprintf(path, sizeof path, "%s/coefficients.txt", folder);
    FILE *file = fopen(path, "r");
    if (file == NULL) {
        snprintf(error, error_len, "cannot open %s", path);
        return INFERPOOL_MODEL_FAILURE;
    }
    n_features = 0;
    int read = fscanf(file, "%lf", &intercept);
    while (read == 1 && n_features < MAX_FEATURES) {
        read = fscanf(file, "%lf", &coefficients[n_features]);
        if (read == 1) n_features++;
    }
    fclose(file);
    if (n_features == 0) {
        snprintf(error, error_len, "%s holds no coefficients", path);
        return INFERPOOL_MODEL_FAILURE;
    }
    /* The metadata: one FP64 value per row; FP32 input is read as it comes (no copy). */
    snprintf(metadata, sizeof metadata,
             "{\"inputs\": [{\"name\": \"input-0\", \"datatype\": \"FP64\", \"shape\": [-1, %lld]}],"
             " \"outputs\": [{\"name\": \"predict\", \"datatype\": \"FP64\", \"shape\": [-1]}],"
             " \"input_datatypes\": [\"FP64\", \"FP32\"],"
             " \"thread_safe\": true, \"rows_independent\": true}",
             (long long)n_features);
    return INFERPOOL_OK;
}

int inferpool_model_metadata(const char **json_out) {
    *json_out = metadata;
    return INFERPOOL_OK;
}

int inferpool_model_predict(const void *in, int64_t rows, int64_t cols, int dtype, void *out,
                            int64_t out_len, char *error, size_t error_len) {
    if (cols != n_features) {
        snprintf(error, error_len, "expected %lld features, got %lld", (long long)n_features,
                 (long long)cols);
        return INFERPOOL_BAD_INPUT;
    }
    if (out_len != rows) {
        snprintf(error, error_len, "output buffer of %lld values for %lld rows",
                 (long long)out_len, (long long)rows);
        return INFERPOOL_MODEL_FAILURE;
    }
    double *result = out;
    for (int64_t row = 0; row < rows; row++) {
        double sum = intercept;
        for (int64_t col = 0; col < cols; col++) {
            double x = dtype == INFERPOOL_FP32 ? ((const float *)in)[row * cols + col]
                                               : ((const double *)in)[row * cols + col];
            if (isnan(x)) {
                snprintf(error, error_len, "row %lld, feature %lld is NaN", (long long)row,
                         (long long)col);
                return INFERPOOL_BAD_INPUT;
            }
            sum += coefficients[col] * x;
        }
        result[row] = sum;
    }
    return INFERPOOL_OK;
}

void inferpool_model_free(void) { n_features = 0; }
