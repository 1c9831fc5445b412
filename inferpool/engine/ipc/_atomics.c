/* Acquire/release access to the 64-bit counters of inferpool's shared-memory ring
 * (inferpool/engine/ipc/ring.py).
 *
 * Python has no memory-ordered store or load: struct.pack_into is a plain memcpy, which
 * the CPU may make visible to another core before the stores that precede it (arm64
 * does; x86-64 does not). A release store of a counter makes every earlier write of this
 * thread visible to whoever acquire-loads that value; an acquire load keeps every later
 * access after it. Both compile to one instruction (x86-64: a plain mov; arm64: stlr /
 * ldar), and they order the compiler too.
 *
 * The counter lives in a mapping shared between processes, so the atomic must be
 * lock-free (a lock would be private to each process) and naturally aligned.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#if !defined(__GCC_ATOMIC_LLONG_LOCK_FREE) || __GCC_ATOMIC_LLONG_LOCK_FREE != 2
#error "the ring's counters need lock-free 64-bit atomics (GCC or Clang builtins)"
#endif

/* The counter at `offset` in `buffer` (a contiguous buffer: PyBUF_WRITABLE alone asks for
 * one), or NULL with the exception set: ValueError for an offset out of range or not
 * 8-byte aligned (an unaligned atomic may tear, or fault on arm64), BufferError for a
 * read-only buffer. On success the caller releases `view`. A read-only buffer is refused
 * for loads too: the counter is memory that the other side writes, never a constant. */
static uint64_t *counter_at(PyObject *buffer, PyObject *offset_obj, Py_buffer *view) {
    /* Clamped (no OverflowError): a huge offset is out of range like any other. */
    Py_ssize_t offset = PyNumber_AsSsize_t(offset_obj, NULL);
    if (offset == -1 && PyErr_Occurred()) return NULL;
    if (PyObject_GetBuffer(buffer, view, PyBUF_WRITABLE) < 0) return NULL;
    if (offset < 0 || view->len < (Py_ssize_t)sizeof(uint64_t) ||
        offset > view->len - (Py_ssize_t)sizeof(uint64_t)) {
        PyErr_Format(PyExc_ValueError, "offset %R is outside a buffer of %zd bytes", offset_obj,
                     view->len);
        PyBuffer_Release(view);
        return NULL;
    }
    char *at = (char *)view->buf + offset;
    if ((uintptr_t)at % sizeof(uint64_t) != 0) {
        PyErr_Format(PyExc_ValueError, "offset %zd is not 8-byte aligned", offset);
        PyBuffer_Release(view);
        return NULL;
    }
    return (uint64_t *)at;
}

PyDoc_STRVAR(store_release_doc,
             "store_release(buffer, offset, value)\n--\n\n"
             "Store the unsigned 64-bit `value` at `offset` (8-byte aligned) of a writable "
             "buffer, native byte order, with release semantics.");

static PyObject *store_release(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "store_release() takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    /* Convert the value first, so that a bad value leaves no buffer exported. */
    unsigned long long value = PyLong_AsUnsignedLongLong(args[2]);
    if (value == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    uint64_t *counter = counter_at(args[0], args[1], &view);
    if (counter == NULL) return NULL;
    __atomic_store_n(counter, (uint64_t)value, __ATOMIC_RELEASE);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(load_acquire_doc,
             "load_acquire(buffer, offset)\n--\n\n"
             "The unsigned 64-bit value at `offset` (8-byte aligned) of a writable buffer, "
             "native byte order, loaded with acquire semantics.");

static PyObject *load_acquire(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "load_acquire() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_buffer view;
    uint64_t *counter = counter_at(args[0], args[1], &view);
    if (counter == NULL) return NULL;
    uint64_t value = __atomic_load_n(counter, __ATOMIC_ACQUIRE);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong((unsigned long long)value);
}

static PyMethodDef methods[] = {
    {"store_release", (PyCFunction)(void (*)(void))store_release, METH_FASTCALL,
     store_release_doc},
    {"load_acquire", (PyCFunction)(void (*)(void))load_acquire, METH_FASTCALL,
     load_acquire_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_atomics",
    .m_doc = "Acquire/release access to 64-bit counters in shared memory (the ring's head "
             "and tail).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__atomics(void) { return PyModule_Create(&module); }
