/*
 * inferpool_model.h: the C ABI of a model served by inferpool's `native` runtime.
 *
 * A native model is a shared library (`model.so`) that exports the functions below with
 * C linkage. inferpool loads it with ctypes (dlopen) in each worker process, after the
 * fork, and calls them from Python; documented in docs/languages.md and
 * docs/runtimes/native.md.
 *
 * Required:  inferpool_abi_version, inferpool_model_metadata, inferpool_model_predict.
 * Optional:  inferpool_model_init (called once after loading, with the model's folder),
 *            inferpool_model_free (called once when the model is unloaded).
 *
 * Threads: calls come from one thread at a time per model unless the metadata says
 * "thread_safe": true (then predict may run in several threads at once). inferpool never
 * calls init or free while a predict runs. The library must start no thread before
 * init (the load happens in each worker, after the fork, so init may start threads).
 *
 * Memory: `in` belongs to inferpool (the request's own buffer: read it, never keep the
 * pointer after predict returns); `out` is an array inferpool allocated with exactly
 * `out_len` elements of the output's datatype, C order, rows first. The JSON string of
 * inferpool_model_metadata stays owned by the library and must stay valid until free.
 */
#ifndef INFERPOOL_MODEL_H
#define INFERPOOL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI this header describes: inferpool_abi_version() must return it. */
#define INFERPOOL_ABI_VERSION 1

/* Element types of `in` and `out` (V2 datatype names in the metadata JSON). */
#define INFERPOOL_FP32 1  /* "FP32": float   */
#define INFERPOOL_FP64 2  /* "FP64": double  */
#define INFERPOOL_INT32 3 /* "INT32": int32_t */
#define INFERPOOL_INT64 4 /* "INT64": int64_t */

/* Return codes. Anything else than OK must leave a message in `error` (NUL-terminated,
 * at most error_len bytes with the NUL): the client receives it. */
#define INFERPOOL_OK 0
#define INFERPOOL_BAD_INPUT 1     /* the client's input: answered HTTP 400 / INVALID_ARGUMENT */
#define INFERPOOL_MODEL_FAILURE 2 /* the model failed: answered HTTP 500 / INTERNAL */

/* Return INFERPOOL_ABI_VERSION (a library built for another ABI is refused at load). */
int inferpool_abi_version(void);

/* Set *json_out to a NUL-terminated JSON object describing the model:
 *
 *   {"inputs":  [{"name": "input-0", "datatype": "FP64", "shape": [-1, 3]}],
 *    "outputs": [{"name": "predict", "datatype": "FP64", "shape": [-1]}],
 *    "input_datatypes": ["FP64", "FP32"],   (optional: every dtype predict accepts;
 *                                            default: the input's datatype only)
 *    "thread_safe": false,                  (optional, default false)
 *    "rows_independent": true}              (optional, default false: row i of the
 *                                            output depends on row i of the input only,
 *                                            so the server may batch requests together)
 *
 * One input of shape [-1, cols] and one output of shape [-1] or [-1, k]. Return
 * INFERPOOL_OK, anything else fails the load. Called after init. */
int inferpool_model_metadata(const char **json_out);

/* Predict `rows` rows of `cols` elements of type `dtype` (one of the input datatypes the
 * metadata lists) read from `in` (C order), writing rows * k elements of the output's
 * datatype into `out` (`out_len` = rows * k). Return INFERPOOL_OK, INFERPOOL_BAD_INPUT or
 * INFERPOOL_MODEL_FAILURE with a message in `error`. */
int inferpool_model_predict(const void *in, int64_t rows, int64_t cols, int dtype, void *out,
                            int64_t out_len, char *error, size_t error_len);

/* Optional: called once after loading, before the metadata, with the model's folder (where
 * model-settings.json is). Return INFERPOOL_OK, or anything else with a message in `error`
 * to fail the load with it. */
int inferpool_model_init(const char *folder, char *error, size_t error_len);

/* Optional: release what init acquired; called once when the model is unloaded. */
void inferpool_model_free(void);

#ifdef __cplusplus
}
#endif

#endif /* INFERPOOL_MODEL_H */
