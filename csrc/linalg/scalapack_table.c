/* The table of ScaLAPACK's routines, filled from its libraries (Debian's one, or
 * MKL's five) by dlopen and dlsym: mpitensor never links ScaLAPACK, so that it
 * builds and imports without it. */
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

/* The local routines the one-row LU runs on, each optional. */
static const entry LOCAL_ENTRIES[] = {
    {"?getrf_", TYPED(lgetrf)}, {"?laswp_", TYPED(laswp)},
    {"?trsm_", TYPED(trsm)},    {"?gemm_", TYPED(gemm)},
};
#undef TYPED

/* Stores the address of `name` at `slot`, looked up in the table's libraries from
 * the last opened back (the ScaLAPACK routines are in the last; MKL keeps BLACS's
 * in the one before). memcpy, since ISO C has no conversion from dlsym's void * to
 * a function pointer. */
static int load(const struct mt_scalapack *sl, const char *name, char *slot,
                mt_error *err) {
  void *sym = NULL;
  for (int i = sl->nhandles - 1; i >= 0 && sym == NULL; --i)
    sym = dlsym(sl->handles[i], name);
  if (sym == NULL)
    return mt_error_set(err, MT_ENOTSUP, "the ScaLAPACK library has no routine %s",
                        name);
  memcpy(slot, &sym, sizeof sym);
  return MT_OK;
}

/* The local routines of element type `letter` into `t`, all or none: a library
 * that lacks one leaves the LU to pXgetrf. */
static void load_local(const struct mt_scalapack *sl, char letter, mt__sl_typed *t) {
  char name[32];
  size_t count = sizeof LOCAL_ENTRIES / sizeof *LOCAL_ENTRIES;
  for (size_t i = 0; i < count; ++i) {
    snprintf(name, sizeof name, "%s", LOCAL_ENTRIES[i].name);
    *strchr(name, '?') = letter;
    if (load(sl, name, (char *)t + LOCAL_ENTRIES[i].offset, NULL) != MT_OK) {
      t->lgetrf = NULL;
      return;
    }
  }
}

/* The routines of element type `letter` into `t`. */
static int load_typed(const struct mt_scalapack *sl, char letter, mt__sl_typed *t,
                      mt_error *err) {
  char name[32];
  for (size_t i = 0; i < sizeof TYPED_ENTRIES / sizeof *TYPED_ENTRIES; ++i) {
    snprintf(name, sizeof name, "%s", TYPED_ENTRIES[i].name);
    *strchr(name, '?') = letter;
    int rc = load(sl, name, (char *)t + TYPED_ENTRIES[i].offset, err);
    if (rc != MT_OK) return rc;
  }
  int complex = letter == 'c' || letter == 'z';
  snprintf(name, sizeof name, complex ? "p%cungqr_" : "p%corgqr_", letter);
  int rc = load(sl, name, (char *)&t->orgqr, err);
  snprintf(name, sizeof name, "p%cgesvd_", letter);
  if (rc == MT_OK)
    rc = load(sl, name, complex ? (char *)&t->cgesvd : (char *)&t->gesvd, err);
  snprintf(name, sizeof name, complex ? "p%cheevr_" : "p%csyevr_", letter);
  if (rc == MT_OK)
    rc = load(sl, name, complex ? (char *)&t->heevr : (char *)&t->syevr, err);
  snprintf(name, sizeof name, complex ? "p%cheevd_" : "p%csyevd_", letter);
  if (rc == MT_OK)
    rc = load(sl, name, complex ? (char *)&t->heevd : (char *)&t->syevd, err);
  if (rc == MT_OK) load_local(sl, letter, t);
  return rc;
}

static int load_all(struct mt_scalapack *sl, mt_error *err) {
  for (size_t i = 0; i < sizeof ENTRIES / sizeof *ENTRIES; ++i) {
    int rc = load(sl, ENTRIES[i].name, (char *)sl + ENTRIES[i].offset, err);
    if (rc != MT_OK) return rc;
  }
  for (int k = 0; k < 4; ++k) {
    int rc = load_typed(sl, "sdcz"[k], &sl->typed[k], err);
    if (rc != MT_OK) return rc;
  }
  return MT_OK;
}

/* Puts the MPI library this one is linked to into the global namespace, where
 * MKL's BLACS, which names no MPI library, finds its symbols: a Python extension's
 * own libraries are loaded local (mpi4py promotes it too, when it is imported). */
static int mpi_global(mt_error *err) {
  int (*init)(int *, char ***) = MPI_Init;
  void *addr = NULL;
  memcpy(&addr, &init, sizeof addr);
  Dl_info info;
  void *h = NULL;
  if (dladdr(addr, &info) != 0 && info.dli_fname != NULL)
    h = dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
  if (h == NULL)
    return mt_error_set(err, MT_ENOTSUP, "cannot find the MPI library to share with "
                        "ScaLAPACK's libraries");
  dlclose(h); /* this library's link to it keeps it loaded */
  return MT_OK;
}

/* Opens the libraries of `paths` into `sl`, in order. All but the last go into the
 * global namespace: they name none of the others (MKL's are meant for a link line,
 * not the loader), so the later ones find their symbols only there; RTLD_LAZY, as
 * each refers to functions of the ones after it. RTLD_NODELETE: a library loaded
 * since may have bound to their symbols, so they stay. The last is RTLD_LOCAL: a
 * ScaLAPACK of one library (Debian's) keeps its BLAS and LAPACK symbols (dgemm_,
 * ...) out of the global namespace, where they could stand in for those of a
 * library loaded later; MKL's BLAS and LAPACK (libmkl_intel_lp64) are there then,
 * for good.
 *
 * The other way round, a Fortran BLAS already global (MKL's, which libmkl_rt makes
 * global when the nn kernels load it) would stand in for Debian's ScaLAPACK's own:
 * Intel's interface returns a complex cdotc_ or zdotc_ where gfortran's code does
 * not look, and pXpotrf of complex matrices crashes. Such a ScaLAPACK is then
 * opened RTLD_DEEPBIND, its own libraries first. Only then: the sanitizers refuse
 * RTLD_DEEPBIND. */
static int open_all(const char *const *paths, int count, struct mt_scalapack *sl,
                    mt_error *err) {
  if (count > 1) {
    int rc = mpi_global(err);
    if (rc != MT_OK) return rc;
  }
  int own = count == 1 && dlsym(RTLD_DEFAULT, "zdotc_") != NULL ? RTLD_DEEPBIND : 0;
  for (int i = 0; i < count; ++i) {
    int last = i == count - 1;
    void *h = dlopen(paths[i], last ? RTLD_NOW | RTLD_LOCAL | own
                                    : RTLD_LAZY | RTLD_GLOBAL | RTLD_NODELETE);
    if (h == NULL) {
      const char *why = dlerror();
      return mt_error_set(err, MT_ENOTSUP, "%s", why != NULL ? why : paths[i]);
    }
    sl->handles[sl->nhandles++] = h;
  }
  return MT_OK;
}

int mt_scalapack_open_libraries(const char *const *paths, int count, mt_scalapack **out,
                                mt_error *err) {
  if (paths == NULL || out == NULL || count < 1 || count > MT__SL_LIBRARIES)
    return mt_error_set(err, MT_EINVAL, "mt_scalapack_open: out and 1 to %d paths",
                        MT__SL_LIBRARIES);
  for (int i = 0; i < count; ++i)
    if (paths[i] == NULL)
      return mt_error_set(err, MT_EINVAL, "mt_scalapack_open: path %d is NULL", i);
  struct mt_scalapack *sl = calloc(1, sizeof *sl);
  if (sl == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
  sl->keyval = MPI_KEYVAL_INVALID;
  int rc = open_all(paths, count, sl, err);
  if (rc == MT_OK) rc = load_all(sl, err);
  if (rc == MT_OK) rc = mt__sl_caches_open(sl, mt__sl_table_free, err);
  if (rc != MT_OK) {
    mt_scalapack_close(sl);
    return rc;
  }
  *out = sl;
  return MT_OK;
}

int mt_scalapack_open(const char *path, mt_scalapack **out, mt_error *err) {
  if (path == NULL)
    return mt_error_set(err, MT_EINVAL, "mt_scalapack_open: path and out are required");
  return mt_scalapack_open_libraries(&path, 1, out, err);
}

void mt__sl_table_free(mt_scalapack *sl) {
  for (int i = sl->nhandles - 1; i >= 0; --i) dlclose(sl->handles[i]);
  free(sl->life);
  free(sl);
}

void mt_scalapack_close(mt_scalapack *sl) {
  if (sl == NULL) return;
  if (mt__sl_caches_close(sl)) mt__sl_table_free(sl);
}
