/* Shared by the ScaLAPACK files of the linalg library: the table of routines
 * (scalapack_table.c) and the process grid and descriptors the drivers use
 * (scalapack_grid.c), under the drivers (scalapack.c). */
#ifndef MPITENSOR_SCALAPACK_PRIVATE_H
#define MPITENSOR_SCALAPACK_PRIVATE_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "linalg-private.h"
#include "mpitensor/linalg/scalapack.h"

/* The names the watchdog reports ScaLAPACK's routines by, one per element type
 * (s, d, c, z), indexed as mt_scalapack.typed. */
#define MT__SL_NAMES(s, d, c, z) \
  { "ScaLAPACK's " #s, "ScaLAPACK's " #d, "ScaLAPACK's " #c, "ScaLAPACK's " #z }

/* Fortran's conventions: every argument by address, INTEGER is int, and each
 * CHARACTER argument adds its length, by value, after the others. */
typedef void (*mt__sl_gesv)(const int *n, const int *nrhs, void *a, const int *ia,
                            const int *ja, const int *desca, int *ipiv, void *b,
                            const int *ib, const int *jb, const int *descb, int *info);
typedef void (*mt__sl_getrf)(const int *m, const int *n, void *a, const int *ia,
                             const int *ja, const int *desca, int *ipiv, int *info);
typedef void (*mt__sl_getrs)(const char *trans, const int *n, const int *nrhs,
                             const void *a, const int *ia, const int *ja,
                             const int *desca, const int *ipiv, void *b, const int *ib,
                             const int *jb, const int *descb, int *info, size_t);
typedef void (*mt__sl_getri)(const int *n, void *a, const int *ia, const int *ja,
                             const int *desca, const int *ipiv, void *work,
                             const int *lwork, int *iwork, const int *liwork, int *info);
typedef void (*mt__sl_potrf)(const char *uplo, const int *n, void *a, const int *ia,
                             const int *ja, const int *desca, int *info, size_t);
typedef void (*mt__sl_laset)(const char *uplo, const int *m, const int *n,
                             const void *alpha, const void *beta, void *a, const int *ia,
                             const int *ja, const int *desca, size_t);
/* pssyevr and pdsyevr (real: no rwork). VL and VU are reals of the type's
 * precision, unread when RANGE is 'A'. */
typedef void (*mt__sl_syevr)(const char *jobz, const char *range, const char *uplo,
                             const int *n, void *a, const int *ia, const int *ja,
                             const int *desca, const void *vl, const void *vu,
                             const int *il, const int *iu, int *m, int *nz, void *w,
                             void *z, const int *iz, const int *jz, const int *descz,
                             void *work, const int *lwork, int *iwork,
                             const int *liwork, int *info, size_t, size_t, size_t);
/* pcheevr and pzheevr. */
typedef void (*mt__sl_heevr)(const char *jobz, const char *range, const char *uplo,
                             const int *n, void *a, const int *ia, const int *ja,
                             const int *desca, const void *vl, const void *vu,
                             const int *il, const int *iu, int *m, int *nz, void *w,
                             void *z, const int *iz, const int *jz, const int *descz,
                             void *work, const int *lwork, void *rwork,
                             const int *lrwork, int *iwork, const int *liwork, int *info,
                             size_t, size_t, size_t);
/* pssyevd and pdsyevd (divide and conquer; eigenvectors always computed). */
typedef void (*mt__sl_syevd)(const char *jobz, const char *uplo, const int *n, void *a,
                             const int *ia, const int *ja, const int *desca, void *w,
                             void *z, const int *iz, const int *jz, const int *descz,
                             void *work, const int *lwork, int *iwork, const int *liwork,
                             int *info, size_t, size_t);
/* pcheevd and pzheevd. */
typedef void (*mt__sl_heevd)(const char *jobz, const char *uplo, const int *n, void *a,
                             const int *ia, const int *ja, const int *desca, void *w,
                             void *z, const int *iz, const int *jz, const int *descz,
                             void *work, const int *lwork, void *rwork, const int *lrwork,
                             int *iwork, const int *liwork, int *info, size_t, size_t);

typedef void (*mt__sl_geqrf)(const int *m, const int *n, void *a, const int *ia,
                             const int *ja, const int *desca, void *tau, void *work,
                             const int *lwork, int *info);
/* pXorgqr for the real types, pXungqr for the complex ones. */
typedef void (*mt__sl_orgqr)(const int *m, const int *n, const int *k, void *a,
                             const int *ia, const int *ja, const int *desca,
                             const void *tau, void *work, const int *lwork, int *info);
/* psgesvd and pdgesvd (real: no rwork). */
typedef void (*mt__sl_gesvd)(const char *jobu, const char *jobvt, const int *m,
                             const int *n, void *a, const int *ia, const int *ja,
                             const int *desca, void *s, void *u, const int *iu,
                             const int *ju, const int *descu, void *vt, const int *ivt,
                             const int *jvt, const int *descvt, void *work,
                             const int *lwork, int *info, size_t, size_t);
/* pcgesvd and pzgesvd. */
typedef void (*mt__sl_cgesvd)(const char *jobu, const char *jobvt, const int *m,
                              const int *n, void *a, const int *ia, const int *ja,
                              const int *desca, void *s, void *u, const int *iu,
                              const int *ju, const int *descu, void *vt, const int *ivt,
                              const int *jvt, const int *descvt, void *work,
                              const int *lwork, void *rwork, int *info, size_t, size_t);

/* The local LAPACK and BLAS routines of the library ScaLAPACK itself runs on, for
 * the LU of a one-row grid (scalapack_lu.c). */
typedef void (*mt__sl_lgetrf)(const int *m, const int *n, void *a, const int *lda,
                              int *ipiv, int *info);
typedef void (*mt__sl_laswp)(const int *n, void *a, const int *lda, const int *k1,
                             const int *k2, const int *ipiv, const int *incx);
typedef void (*mt__sl_trsm)(const char *side, const char *uplo, const char *transa,
                            const char *diag, const int *m, const int *n,
                            const void *alpha, const void *a, const int *lda, void *b,
                            const int *ldb, size_t, size_t, size_t, size_t);
typedef void (*mt__sl_gemm)(const char *transa, const char *transb, const int *m,
                            const int *n, const int *k, const void *alpha, const void *a,
                            const int *lda, const void *b, const int *ldb,
                            const void *beta, void *c, const int *ldc, size_t, size_t);

/* The routines of one element type. */
typedef struct mt__sl_typed {
  mt__sl_gesv gesv;
  mt__sl_getrf getrf;
  mt__sl_getrs getrs;
  mt__sl_getri getri;
  mt__sl_potrf potrf;
  mt__sl_laset laset;
  mt__sl_syevr syevr; /* s and d */
  mt__sl_heevr heevr; /* c and z */
  mt__sl_syevd syevd; /* s and d */
  mt__sl_heevd heevd; /* c and z */
  mt__sl_geqrf geqrf;
  mt__sl_orgqr orgqr;
  mt__sl_gesvd gesvd;   /* s and d */
  mt__sl_cgesvd cgesvd; /* c and z */
  /* Local routines, NULL when the libraries lack one (pXgetrf serves then). */
  mt__sl_lgetrf lgetrf;
  mt__sl_laswp laswp;
  mt__sl_trsm trsm;
  mt__sl_gemm gemm;
} mt__sl_typed;

/* What a table shares with the grids it cached (scalapack_grid.c). */
typedef struct mt__sl_life mt__sl_life;

/* The most libraries one ScaLAPACK may come in (MKL's: core, threading layer,
 * interface, BLACS, ScaLAPACK). */
#define MT__SL_LIBRARIES 8

struct mt_scalapack {
  void *handles[MT__SL_LIBRARIES]; /* dlopen's, in the order opened */
  int nhandles;
  /* The MPI attribute under which a mesh's communicator keeps the grids made on
   * it, MPI_KEYVAL_INVALID when MPI was not initialized at open (each call then
   * makes and frees its own grid). */
  int keyval;
  mt__sl_life *life;
  mt__sl_typed typed[4]; /* s, d, c, z */
  void (*descinit)(int *desc, const int *m, const int *n, const int *mb, const int *nb,
                   const int *irsrc, const int *icsrc, const int *ctxt, const int *lld,
                   int *info);
  int (*numroc)(const int *n, const int *nb, const int *iproc, const int *isrcproc,
                const int *nprocs);
  int (*sys2blacs)(MPI_Comm comm);
  void (*gridinit)(int *ctxt, const char *order, int nprow, int npcol);
  void (*gridinfo)(int ctxt, int *nprow, int *npcol, int *myrow, int *mycol);
  void (*gridexit)(int ctxt);
  void (*free_handle)(int handle);
};

/* The index in mt_scalapack.typed of LAPACK's letter `type`, or -1. */
int mt__sl_type_index(int type);

/* The size in bytes of one element of each type, by index. */
extern const size_t mt__sl_itemsize[4];

/* A BLACS process grid over the members of a mesh that share their coordinates
 * outside the grid's two dims. */
typedef struct mt__sl_grid {
  MPI_Comm comm; /* the grid's members, ranked row-major */
  int handle;    /* Csys2blacs_handle of comm */
  int ctxt;
  int nprow, npcol, myrow, mycol;
  int cached; /* whether the mesh's cache owns it (else mt__sl_grid_close frees it) */
} mt__sl_grid;

/* Collective on the mesh the first time, Local afterwards. The grid of `row_dim` x
 * `col_dim` (-1: size 1), from the cache the mesh's communicator keeps, made and
 * cached on a miss. The cache holds a few grids per mesh, dropping the oldest for
 * a new one, and frees them when the communicator is freed (mt_mesh_destroy). It
 * is touched only inside collective calls on the mesh, from the thread that uses
 * the mesh, and by MPI's delete callback when the communicator goes. */
int mt__sl_grid_open(const mt_scalapack *sl, mt_mesh *mesh, int row_dim, int col_dim,
                     mt__sl_grid *g, mt_error *err);

/* Collective on the grid. Frees what mt__sl_grid_open made, unless it is cached. */
void mt__sl_grid_close(const mt_scalapack *sl, mt__sl_grid *g);

/* Local. Sets up the table's grid caches (its keyval) once its routines are
 * loaded; `free_table` frees the table when the last cache outlives
 * mt_scalapack_close. MT_ENOMEM. */
int mt__sl_caches_open(mt_scalapack *sl, void (*free_table)(mt_scalapack *sl),
                       mt_error *err);

/* Local. Whether the table may be freed now: the caches' keyval is released, and
 * with grids still cached the last one's release frees the table instead. */
int mt__sl_caches_close(mt_scalapack *sl);

/* Local. Unloads the libraries and frees the table. */
void mt__sl_table_free(mt_scalapack *sl);

/* A distributed matrix: its local block and its descriptor. */
typedef struct mt__sl_matrix {
  void *data;
  int desc[9];
  int64_t local_rows, local_cols;
  int owned; /* whether data was allocated here (mt__sl_matrix_free frees it) */
} mt__sl_matrix;

/* Local. Describes the m x n matrix whose local block (column-major, leading
 * dimension its local rows or 1) is at `data`, in blocks of mb x nb; with data
 * NULL, allocates the block. MT_EOVERFLOW past Fortran's INTEGER, MT_ENOMEM. */
int mt__sl_matrix_init(const mt_scalapack *sl, const mt__sl_grid *g, int64_t m,
                       int64_t n, int64_t mb, int64_t nb, size_t itemsize, void *data,
                       mt__sl_matrix *out, mt_error *err);

/* Local. Frees the block when it was allocated here. */
void mt__sl_matrix_free(mt__sl_matrix *mat);

/* The block size of the block-cyclic copies of an m x n matrix on grid `g`. */
int64_t mt__sl_cyclic_block(const mt__sl_grid *g, int64_t m, int64_t n);

/* The largest block of a block distribution that the drivers take as it lies. A
 * torch.chunk block distribution whose blocks are square (or whose grid is one
 * row or one column of processes) is already a square-block distribution, so
 * ScaLAPACK can factor it with each rank's block where it is, no message to set
 * up (the copy to column-major is local); but its panels
 * are factored one column at a time (level-2 BLAS) and the last process rows
 * work alone at the end, so larger blocks go to a block-cyclic copy instead. */
#define MT__SL_LOCAL_BLOCK 256

/* The square block of the block distribution of an m x n matrix on `g`, when the
 * drivers take it as it lies, else 0. */
int64_t mt__sl_square_block(const mt__sl_grid *g, int64_t m, int64_t n);

/* Collective on the grid. `status` agreed over the grid's members (mt_agree_comm). */
int mt__sl_agree(const mt__sl_grid *g, int status, mt_error *err);

/* Collective on the grid. The largest `info` of the members, so that a failure one
 * process saw is every member's. */
int mt__sl_agree_info(const mt__sl_grid *g, int *info, mt_error *err);

/* One call's grid and its m x n matrix in the square-block copy the routines run
 * on, taken from the caller's row-major blocks (mt__sl_rows_to_cyclic). */
typedef struct mt__sl_job {
  const mt_scalapack *sl;
  const mt__sl_typed *t;
  int k; /* the type's index */
  size_t itemsize;
  int m, n, nb, one;
  int turned;     /* whether cg is a grid of its own (see mt__sl_job_open_turned) */
  int relabelled; /* whether cyc is relabelled (see mt__sl_job_open_flipped) */
  mt__sl_grid g;  /* the caller's blocks' grid */
  mt__sl_grid cg; /* cyc's grid: g, or g turned */
  mt__sl_matrix cyc;
} mt__sl_job;

/* Collective on the mesh. The grid, the cyclic copy of the m x n A (allocated,
 * agreed on) and A copied into it from the caller's block at `a`. */
int mt__sl_job_open(const mt_scalapack *sl, mt_mesh *mesh, int row_dim, int col_dim,
                    int type, int64_t m, int64_t n, const void *a, mt__sl_job *j,
                    mt_error *err);

/* Collective on the mesh. As mt__sl_job_open for a square A on a grid of one row or
 * one column of processes, but the cyclic copy is of A's transpose, on the grid's
 * turn (mt__sl_rows_to_cyclic_flipped): no element is transposed on the way.
 * Blocks square and small enough stay where they are, as mt__sl_job_open's.
 * With `relabel`, A's rows sharded, and a cyclic block that deals each process
 * as many columns as it holds rows (and the local routines of mt__sl_lu loaded),
 * the copy is instead of A^T with its columns relabelled so that each process's
 * are its own rows as they lie, (Pi A)^T for a permutation Pi of A's rows: no
 * message. j->relabelled says which; mt__sl_lu_solve_relabelled solves from it. */
int mt__sl_job_open_flipped(const mt_scalapack *sl, mt_mesh *mesh, int row_dim,
                            int col_dim, int type, int64_t n, const void *a,
                            int relabel, mt__sl_job *j, mt_error *err);

/* Collective on the mesh. As mt__sl_job_open, but a P x 1 grid's cyclic copy
 * lies on the 1 x P grid of the same processes: there pXgetrf factors each panel
 * on one process, with no message per column to find its pivot, and pXsyevd's
 * reduction to tridiagonal form sends less along a process row. For the square drivers whose only use
 * of the grid's shape is through the copy's descriptor. */
int mt__sl_job_open_turned(const mt_scalapack *sl, mt_mesh *mesh, int row_dim,
                           int col_dim, int type, int64_t m, int64_t n, const void *a,
                           mt__sl_job *j, mt_error *err);

/* Collective on the grid. Copies the m x n matrix whose caller's blocks
 * (torch.chunk's on j->g: ceil(m/Pr) rows by ceil(n/Pc) columns, each rank's
 * row-major and contiguous) are at `rows` into `cyc`, a block-cyclic matrix of at
 * least m x n on grid `on` (j->g or j->cg: the same processes in the same order),
 * its leading m x n part: one message per pair of ranks sharing entries
 * (scalapack_exchange.c). MT_ENOMEM, MT_EOVERFLOW, agreed over the grid. */
int mt__sl_rows_to_cyclic(const mt__sl_job *j, const mt__sl_grid *on, int64_t m,
                          int64_t n, const void *rows, mt__sl_matrix *cyc,
                          mt_error *err);

/* Collective on the grid. As mt__sl_rows_to_cyclic, but `cyc` gets the transpose
 * of the n x m matrix whose caller's blocks are at `rows`, on a grid whose ranks
 * are in the order of j->g's (a grid of one row or one column and its turn): the
 * caller's rows are the columns of the transpose, column-major already, so the
 * pieces are copied straight, never transposed. */
int mt__sl_rows_to_cyclic_flipped(const mt__sl_job *j, const mt__sl_grid *on,
                                  int64_t m, int64_t n, const void *rows,
                                  mt__sl_matrix *cyc, mt_error *err);

/* Collective on the grid. The other way: the leading m x n part of `cyc` into the
 * caller's blocks at `rows`. */
int mt__sl_cyclic_to_rows(const mt__sl_job *j, const mt__sl_grid *on, int64_t m,
                          int64_t n, const mt__sl_matrix *cyc, void *rows,
                          mt_error *err);

/* Collective on the grid. Frees the cyclic copy and the grid. */
void mt__sl_job_close(mt__sl_job *j);

/* Collective on the job's grids. pXgetrf of the job's square cyclic copy, in
 * place, with the same factors, IPIV and INFO: on a grid of one process row by
 * the lookahead LU of scalapack_lu.c, else by ScaLAPACK's own. MT_ENOMEM, MPI
 * errors, agreed over the grid; a singular matrix is INFO's, not an error. */
int mt__sl_lu(const mt__sl_job *j, int *ipiv, int *info, mt_error *err);

/* Collective on the grid. With the LU (mt__sl_lu, INFO 0) of a relabelled copy
 * of A (mt__sl_job_open_flipped), solves A X = B: `b` is this process's rows of
 * the n x nrhs B (its rows of A's, row-major), which X replaces. Every process
 * holds an n x nrhs workspace. MT_ENOMEM, MPI errors, agreed. */
int mt__sl_lu_solve_relabelled(const mt__sl_job *j, const int *ipiv, int64_t nrhs,
                               void *b, mt_error *err);

/* Collective on the grid. Allocates `count` (at least one) elements of `size`
 * bytes, agreed over the grid. */
int mt__sl_alloc(mt__sl_job *j, void **out, int64_t count, size_t size, mt_error *err);

/* Local. The size a workspace query wrote in the first element of `work` (a real
 * or complex number of the job's precision), plus one. */
int mt__sl_query_size(const mt__sl_job *j, const void *work);

#endif
