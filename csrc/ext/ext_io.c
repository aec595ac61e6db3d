/* io_save / io_load: sharded files with MPI-IO (mpitensor/io/io.h). The .npy format
 * itself lives in Python (mpitensor.checkpoint); these move the header and data. */
#include "ext.h"

#include "mpitensor/io/io.h"

/* Reads (shape, itemsize, data offset) and (box offset, box shape). */
static int parse_array(PyObject *shape, PyObject *itemsize, PyObject *offset,
                       PyObject *box_offset, PyObject *box_shape, mt_io_array *a,
                       mt_box *box) {
  memset(a, 0, sizeof *a);
  memset(box, 0, sizeof *box);
  a->itemsize = PyLong_AsLongLong(itemsize);
  a->offset = PyLong_AsLongLong(offset);
  if (PyErr_Occurred()) return -1;
  int no = 0, ns = 0;
  if (mt_ext_int64s(shape, a->shape, MT_MAX_NDIM, &a->ndim, "shape") < 0 ||
      mt_ext_int64s(box_offset, box->offset, MT_MAX_NDIM, &no, "box offset") < 0 ||
      mt_ext_int64s(box_shape, box->shape, MT_MAX_NDIM, &ns, "box shape") < 0) {
    return -1;
  }
  box->ndim = ns;
  if (no != ns) {
    PyErr_SetString(PyExc_ValueError, "box offset and box shape differ in length");
    return -1;
  }
  return 0;
}

typedef struct io_args {
  mt_mesh *mesh;
  PyObject *path; /* bytes, from PyUnicode_FSConverter */
  mt_io_array array;
  mt_box box;
  Py_buffer view;
} io_args;

/* (mesh, path, shape, itemsize, offset, box_offset, box_shape, buffer) */
static int parse(PyObject *module, PyObject *const *args, Py_ssize_t nargs, int flags,
                 io_args *c) {
  memset(c, 0, sizeof *c);
  if (nargs != 8) {
    PyErr_SetString(PyExc_TypeError, "expected (mesh, path, shape, itemsize, offset, "
                    "box_offset, box_shape, buffer)");
    return -1;
  }
  c->mesh = mt_ext_mesh_for_collective(module, args[0]);
  if (c->mesh == NULL || !PyUnicode_FSConverter(args[1], &c->path)) return -1;
  if (parse_array(args[2], args[3], args[4], args[5], args[6], &c->array, &c->box) < 0)
    return -1;
  /* The buffer's size is checked in the core, on every rank alike. */
  return PyObject_GetBuffer(args[7], &c->view, flags);
}

static void release(io_args *c) {
  Py_XDECREF(c->path);
  if (c->view.obj != NULL) PyBuffer_Release(&c->view);
}

/* io_save(mesh, path, header, shape, itemsize, offset, box_offset, box_shape, buf).
 * Collective on the mesh. */
static PyObject *io_save(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 9) return PyErr_Format(PyExc_TypeError, "io_save takes 9 arguments");
  Py_buffer header;
  if (PyObject_GetBuffer(args[2], &header, PyBUF_SIMPLE) < 0) return NULL;
  PyObject *rest[8] = {args[0], args[1], args[3], args[4], args[5], args[6], args[7],
                       args[8]};
  io_args c;
  PyObject *out = NULL;
  if (parse(module, rest, 8, PyBUF_C_CONTIGUOUS, &c) == 0) {
    mt_io_options opts = mt_ext_state_of(module)->io_options;
    mt_error err = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = mt_io_save(c.mesh, PyBytes_AS_STRING(c.path), header.buf, (int64_t)header.len,
                    &c.array, &c.box, c.view.buf, (int64_t)c.view.len, &opts, &err);
    Py_END_ALLOW_THREADS
    out = rc == MT_OK ? Py_NewRef(Py_None) : mt_ext_raise(rc, &err);
  }
  release(&c);
  PyBuffer_Release(&header);
  return out;
}

/* io_load(mesh, path, shape, itemsize, offset, box_offset, box_shape, out): fills
 * the writable C-contiguous `out` with this rank's box. Collective on the mesh. */
static PyObject *io_load(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  io_args c;
  PyObject *out = NULL;
  if (parse(module, args, nargs, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE, &c) == 0) {
    mt_io_options opts = mt_ext_state_of(module)->io_options;
    mt_error err = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = mt_io_load(c.mesh, PyBytes_AS_STRING(c.path), &c.array, &c.box, c.view.buf,
                    (int64_t)c.view.len, &opts, &err);
    Py_END_ALLOW_THREADS
    out = rc == MT_OK ? Py_NewRef(Py_None) : mt_ext_raise(rc, &err);
  }
  release(&c);
  return out;
}

/* io_counters() -> (data bytes read, data bytes written) by this process through
 * this module. Local. */
static PyObject *io_counters(PyObject *module, PyObject *unused) {
  mt_io_counters *c = &mt_ext_state_of(module)->io_counters;
  return Py_BuildValue("(LL)", (long long)atomic_load(&c->read_bytes),
                       (long long)atomic_load(&c->written_bytes));
}

/* io_pipeline(chunk_bytes, io_thread) -> the previous (chunk_bytes, io_thread): the
 * options every later io_save and io_load of this module passes. Local. */
static PyObject *io_pipeline(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 2) return PyErr_Format(PyExc_TypeError, "io_pipeline takes 2 arguments");
  long long chunk = PyLong_AsLongLong(args[0]);
  int threaded = PyObject_IsTrue(args[1]);
  if (PyErr_Occurred() || threaded < 0) return NULL;
  if (chunk < 1) return PyErr_Format(PyExc_ValueError, "chunk_bytes must be positive");
  mt_io_options *o = &mt_ext_state_of(module)->io_options;
  PyObject *old = Py_BuildValue("(LO)", (long long)o->chunk_bytes,
                                o->io_thread ? Py_True : Py_False);
  if (old != NULL) o->chunk_bytes = (int64_t)chunk, o->io_thread = threaded;
  return old;
}

/* io_gather(mode) -> the previous mode, for every later io_save. Local. */
static PyObject *io_gather(PyObject *module, PyObject *arg) {
  long mode = PyLong_AsLong(arg);
  if (mode == -1 && PyErr_Occurred()) return NULL;
  if (mode < 0 || mode > 2) return PyErr_Format(PyExc_ValueError, "io_gather takes 0, 1 or 2");
  mt_io_options *o = &mt_ext_state_of(module)->io_options;
  int old = o->gather;
  o->gather = (int)mode;
  return PyLong_FromLong(old);
}

PyMethodDef mt_ext_io_methods[] = {
    {"io_save", (PyCFunction)(void (*)(void))io_save, METH_FASTCALL,
     "io_save(mesh, path, header, shape, itemsize, offset, box_offset, box_shape, buf): "
     "writes a new file of header + array, this rank's box from buf. Collective."},
    {"io_load", (PyCFunction)(void (*)(void))io_load, METH_FASTCALL,
     "io_load(mesh, path, shape, itemsize, offset, box_offset, box_shape, out): reads "
     "this rank's box of the array at `offset` into out. Collective."},
    {"io_counters", io_counters, METH_NOARGS,
     "io_counters() -> (data bytes read, data bytes written) by this process. Local."},
    {"io_pipeline", (PyCFunction)(void (*)(void))io_pipeline, METH_FASTCALL,
     "io_pipeline(chunk_bytes, io_thread) -> the previous pair: how boxes of many short "
     "runs move through row slabs (mt_io_options). Local."},
    {"io_gather", io_gather, METH_O,
     "io_gather(mode) -> the previous mode: whether a save of interleaved boxes on one "
     "node is written by two writers reading the others' memory: 0 never, 1 when it "
     "pays (default), 2 by the first rank's threads whenever it can (mt_io_options). "
     "Local."},
    {NULL, NULL, 0, NULL},
};
