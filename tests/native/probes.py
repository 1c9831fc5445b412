"""C sources of probe libraries: each shows one thing the native runtime must do (hand the
request's own buffer over, map return codes, refuse a broken library in one sentence,
serialise the calls of a library that is not reentrant)."""

from __future__ import annotations

# Answers, per row, the address of the input buffer it was given and the dtype code; a
# negative first value is refused (400), one above 1000 fails the model (500). Each call
# sleeps SLEEP_US and records how many calls ran at once (probe_max_concurrency).
PROBE = r"""
#include <stdio.h>
#include <unistd.h>
#include "inferpool_model.h"

#ifndef ABI
#define ABI INFERPOOL_ABI_VERSION
#endif
#ifndef THREAD_SAFE
#define THREAD_SAFE "false"
#endif
#ifndef SLEEP_US
#define SLEEP_US 0
#endif

static int running, most;

int inferpool_abi_version(void) { return ABI; }

int inferpool_model_metadata(const char **json_out) {
    *json_out = "{\"inputs\": [{\"name\": \"x\", \"datatype\": \"FP64\", \"shape\": [-1, 2]}],"
                " \"outputs\": [{\"name\": \"address\", \"datatype\": \"INT64\","
                " \"shape\": [-1, 2]}],"
                " \"thread_safe\": " THREAD_SAFE "}";
    return INFERPOOL_OK;
}

int probe_max_concurrency(void) { return most; }

int inferpool_model_predict(const void *in, int64_t rows, int64_t cols, int dtype, void *out,
                            int64_t out_len, char *error, size_t error_len) {
    const double *x = in;
    int64_t *answer = out;
    int now = __atomic_add_fetch(&running, 1, __ATOMIC_SEQ_CST);
    if (now > most) most = now;
    if (SLEEP_US) usleep(SLEEP_US);
    __atomic_sub_fetch(&running, 1, __ATOMIC_SEQ_CST);
    if (x[0] < 0) {
        snprintf(error, error_len, "negative first value %g", x[0]);
        return INFERPOOL_BAD_INPUT;
    }
    if (x[0] > 1000) {
        snprintf(error, error_len, "the model overflowed on %g", x[0]);
        return INFERPOOL_MODEL_FAILURE;
    }
    for (int64_t row = 0; row < rows; row++) {
        answer[2 * row] = (int64_t)(intptr_t)in;
        answer[2 * row + 1] = dtype;
    }
    (void)cols;
    (void)out_len;
    return INFERPOOL_OK;
}
"""

# Exports only the metadata and the version: no predict.
NO_PREDICT = r"""
#include "inferpool_model.h"
int inferpool_abi_version(void) { return INFERPOOL_ABI_VERSION; }
int inferpool_model_metadata(const char **json_out) { *json_out = "{}"; return 0; }
"""

# Metadata that is not JSON.
BAD_JSON = r"""
#include "inferpool_model.h"
int inferpool_abi_version(void) { return INFERPOOL_ABI_VERSION; }
int inferpool_model_metadata(const char **json_out) { *json_out = "{inputs: oops"; return 0; }
int inferpool_model_predict(const void *in, int64_t rows, int64_t cols, int dtype, void *out,
                            int64_t out_len, char *error, size_t error_len) { return 0; }
"""

# An init that refuses the folder it is given, naming it.
INIT_FAILS = r"""
#include <stdio.h>
#include "inferpool_model.h"
int inferpool_abi_version(void) { return INFERPOOL_ABI_VERSION; }
int inferpool_model_init(const char *folder, char *error, size_t error_len) {
    snprintf(error, error_len, "no weights in %s", folder);
    return 2;
}
int inferpool_model_metadata(const char **json_out) { *json_out = "{}"; return 0; }
int inferpool_model_predict(const void *in, int64_t rows, int64_t cols, int dtype, void *out,
                            int64_t out_len, char *error, size_t error_len) { return 0; }
"""

# Metadata without an input.
NO_INPUT = BAD_JSON.replace('"{inputs: oops"', '"{\\"inputs\\": [], \\"outputs\\": []}"')
