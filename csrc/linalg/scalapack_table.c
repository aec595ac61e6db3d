/* The table of ScaLAPACK's routines, filled from the library by dlopen and dlsym:
 * mpitensor never links ScaLAPACK, so that it builds and imports without it. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scalapack-private.h"

const size_t mt__sl_itemsize[4] = {4, 8, 8, 16};

int mt__sl_type_index(int type) {
  switch (type) {
    case 's': return 0;
    case 'd': return 1;
    case 'c': return 2;
    case 'z': return 3;
    default: return -1;
  }
}

/* Where each routine goes in the table: its symbol and its slot's offset. The
 * typed routines are named with their letter in place of '?'. */
typedef struct entry {
  const char *name;
  size_t offset;
} entry;

#define TYPED(field) offsetof(mt__sl_typed, field)
static const entry TYPED_ENTRIES[] = {
    {"p?gesv_", TYPED(gesv)},   {"p?getrf_", TYPED(getrf)}, {"p?getri_", TYPED(getri)},
    {"p?getrs_", TYPED(getrs)},
    {"p?potrf_", TYPED(potrf)}, {"p?laset_", TYPED(laset)}, {"p?geqrf_", TYPED(geqrf)},
};
#undef TYPED

#define SL(field) offsetof(struct mt_scalapack, field)
static const entry ENTRIES[] = {
    {"descinit_", SL(descinit)},
    {"numroc_", SL(numroc)},
    {"Csys2blacs_handle", SL(sys2blacs)},
    {"Cblacs_gridinit", SL(gridinit)},
    {"Cblacs_gridinfo", SL(gridinfo)},
    {"Cblacs_gridexit", SL(gridexit)},
    {"Cfree_blacs_system_handle", SL(free_handle)},
};
#undef SL

/* Stores the address of `name` at `slot` (a function pointer: memcpy, since ISO C
 * has no conversion from dlsym's void * to one). */
static int load(void *handle, const char *name, char *slot, mt_error *err) {
  void *sym = dlsym(handle, name);
  if (sym == NULL)
    return mt_error_set(err, MT_ENOTSUP, "the ScaLAPACK library has no routine %s",
                        name);
  memcpy(slot, &sym, sizeof sym);
  return MT_OK;
}

/* The routines of element type `letter` into `t`. */
static int load_typed(void *handle, char letter, mt__sl_typed *t, mt_error *err) {
  char name[32];
  for (size_t i = 0; i < sizeof TYPED_ENTRIES / sizeof *TYPED_ENTRIES; ++i) {
    snprintf(name, sizeof name, "%s", TYPED_ENTRIES[i].name);
    *strchr(name, '?') = letter;
    int rc = load(handle, name, (char *)t + TYPED_ENTRIES[i].offset, err);
    if (rc != MT_OK) return rc;
  }
  int complex = letter == 'c' || letter == 'z';
  snprintf(name, sizeof name, complex ? "p%cungqr_" : "p%corgqr_", letter);
  int rc = load(handle, name, (char *)&t->orgqr, err);
  snprintf(name, sizeof name, "p%cgesvd_", letter);
  if (rc == MT_OK)
    rc = load(handle, name, complex ? (char *)&t->cgesvd : (char *)&t->gesvd, err);
  snprintf(name, sizeof name, complex ? "p%cheevr_" : "p%csyevr_", letter);
  if (rc == MT_OK)
    rc = load(handle, name, complex ? (char *)&t->heevr : (char *)&t->syevr, err);
  snprintf(name, sizeof name, complex ? "p%cheevd_" : "p%csyevd_", letter);
  if (rc == MT_OK)
    rc = load(handle, name, complex ? (char *)&t->heevd : (char *)&t->syevd, err);
  return rc;
}

static int load_all(struct mt_scalapack *sl, mt_error *err) {
  for (size_t i = 0; i < sizeof ENTRIES / sizeof *ENTRIES; ++i) {
    int rc = load(sl->handle, ENTRIES[i].name, (char *)sl + ENTRIES[i].offset, err);
    if (rc != MT_OK) return rc;
  }
  for (int k = 0; k < 4; ++k) {
    int rc = load_typed(sl->handle, "sdcz"[k], &sl->typed[k], err);
    if (rc != MT_OK) return rc;
  }
  return MT_OK;
}

int mt_scalapack_open(const char *path, mt_scalapack **out, mt_error *err) {
  if (path == NULL || out == NULL)
    return mt_error_set(err, MT_EINVAL, "mt_scalapack_open: path and out are required");
  struct mt_scalapack *sl = calloc(1, sizeof *sl);
  if (sl == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
  sl->keyval = MPI_KEYVAL_INVALID;
  /* RTLD_LOCAL: its BLAS and LAPACK symbols (dgemm_, ...) stay out of the global
   * namespace, where they could stand in for those of a library loaded later. */
  sl->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (sl->handle == NULL) {
    const char *why = dlerror();
    free(sl);
    return mt_error_set(err, MT_ENOTSUP, "%s", why != NULL ? why : path);
  }
  int rc = load_all(sl, err);
  if (rc == MT_OK) rc = mt__sl_caches_open(sl, mt__sl_table_free, err);
  if (rc != MT_OK) {
    mt_scalapack_close(sl);
    return rc;
  }
  *out = sl;
  return MT_OK;
}

void mt__sl_table_free(mt_scalapack *sl) {
  if (sl->handle != NULL) dlclose(sl->handle);
  free(sl->life);
  free(sl);
}

void mt_scalapack_close(mt_scalapack *sl) {
  if (sl == NULL) return;
  if (mt__sl_caches_close(sl)) mt__sl_table_free(sl);
}
