/* Ordered access to the 64-bit words of inferpool's shared-memory ring
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
 *
 * The sequentially consistent pair serves the ring's doorbell: the producer stores its
 * tail then loads the consumer's "asleep" word, the consumer stores "asleep" then loads
 * the tail. Release and acquire do not keep a store before a later load of another word
 * (x86-64's store buffer reorders exactly that); sequential consistency does, so at least
 * one side sees the other's store: the producer rings, or the consumer does not sleep.
 * (x86-64: the store is an xchg, a full barrier; arm64: stlr / ldar again.)
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

/* store_release and store_seq_cst: the same checks, one memory order. */
static PyObject *store(PyObject *const *args, Py_ssize_t nargs, const char *name, int order) {
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "%s() takes 3 arguments (%zd given)", name, nargs);
        return NULL;
    }
    /* Convert the value first, so that a bad value leaves no buffer exported. */
    unsigned long long value = PyLong_AsUnsignedLongLong(args[2]);
    if (value == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    uint64_t *counter = counter_at(args[0], args[1], &view);
    if (counter == NULL) return NULL;
    if (order == __ATOMIC_SEQ_CST) {
        __atomic_store_n(counter, (uint64_t)value, __ATOMIC_SEQ_CST);
    } else {
        __atomic_store_n(counter, (uint64_t)value, __ATOMIC_RELEASE);
    }
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyObject *store_release(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return store(args, nargs, "store_release", __ATOMIC_RELEASE);
}

PyDoc_STRVAR(store_seq_cst_doc,
             "store_seq_cst(buffer, offset, value)\n--\n\n"
             "As store_release, sequentially consistent: a later load_seq_cst of another "
             "word by this thread is not done before it.");

static PyObject *store_seq_cst(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return store(args, nargs, "store_seq_cst", __ATOMIC_SEQ_CST);
}

PyDoc_STRVAR(load_acquire_doc,
             "load_acquire(buffer, offset)\n--\n\n"
             "The unsigned 64-bit value at `offset` (8-byte aligned) of a writable buffer, "
             "native byte order, loaded with acquire semantics.");

/* load_acquire and load_seq_cst: the same checks, one memory order. */
static PyObject *load(PyObject *const *args, Py_ssize_t nargs, const char *name, int order) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s() takes 2 arguments (%zd given)", name, nargs);
        return NULL;
    }
    Py_buffer view;
    uint64_t *counter = counter_at(args[0], args[1], &view);
    if (counter == NULL) return NULL;
    uint64_t value = order == __ATOMIC_SEQ_CST ? __atomic_load_n(counter, __ATOMIC_SEQ_CST)
                                               : __atomic_load_n(counter, __ATOMIC_ACQUIRE);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong((unsigned long long)value);
}

static PyObject *load_acquire(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return load(args, nargs, "load_acquire", __ATOMIC_ACQUIRE);
}

PyDoc_STRVAR(load_seq_cst_doc,
             "load_seq_cst(buffer, offset)\n--\n\n"
             "As load_acquire, sequentially consistent (see store_seq_cst).");

static PyObject *load_seq_cst(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return load(args, nargs, "load_seq_cst", __ATOMIC_SEQ_CST);
}

static PyMethodDef methods[] = {
    {"store_release", (PyCFunction)(void (*)(void))store_release, METH_FASTCALL,
     store_release_doc},
    {"load_acquire", (PyCFunction)(void (*)(void))load_acquire, METH_FASTCALL,
     load_acquire_doc},
    {"store_seq_cst", (PyCFunction)(void (*)(void))store_seq_cst, METH_FASTCALL,
     store_seq_cst_doc},
    {"load_seq_cst", (PyCFunction)(void (*)(void))load_seq_cst, METH_FASTCALL,
     load_seq_cst_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_atomics",
    .m_doc = "Acquire/release and sequentially consistent access to 64-bit words in shared "
             "memory (the ring's head, tail and doorbell word).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__atomics(void) { return PyModule_Create(&module); }
