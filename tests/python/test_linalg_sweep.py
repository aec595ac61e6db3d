"""np.linalg's distributed engines against NumPy on every small shape: each n and m
from 1 to 9, in every layout of the run's mesh (rows, columns, both, neither; the
2-D meshes at 4 ranks), for solve, inv, det, slogdet, eigh, eigvalsh, svd, lstsq,
qr and cholesky. Small matrices are where a grid holds empty or one-row blocks,
which ScaLAPACK's drivers do not take: each must still give NumPy's values
(relative 1e-8; factors compared by what makes them unique) and raise NumPy's
exception type on every rank, with the ranks still paired afterwards. float64,
well-conditioned matrices, and singular or indefinite ones where NumPy raises.
A NaN or an infinity gives NumPy's own answer in every layout. Run under mpiexec
at 1 to 4 ranks."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from mpitensor import Replicate, Shard, distribute_tensor
from mpitensor._algorithms._scalapack import scalapack_library
from mpitensor.device_mesh import init_device_mesh

COMM = MPI.COMM_WORLD
P = COMM.size
R, S0, S1 = Replicate(), Shard(0), Shard(1)
SIZES = range(1, 10)
TOL = 1e-8

pytestmark = pytest.mark.skipif(scalapack_library() is None,
                                reason="ScaLAPACK (libscalapack-openmpi-dev) is not installed")


def layouts():
    """(mesh shape, placements) of a matrix: every placement of its dims on a 1-D
    mesh, and on a 2 x 2 one at 4 ranks (two mesh dims on one matrix dim too)."""
    out = [((P,), [p]) for p in (S0, S1, R)]
    if P == 4:
        out += [((2, 2), [p, q]) for p in (S0, S1, R) for q in (S0, S1, R)]
    return out


MESHES = {}


def dist(a, layout):
    if layout[0] not in MESHES:
        MESHES[layout[0]] = init_device_mesh("cpu", layout[0])
    return distribute_tensor(a, MESHES[layout[0]], layout[1])


def well(m, n, seed):
    """A well-conditioned m x n matrix (condition below 10)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, n))
    k = min(m, n)
    a[np.arange(k), np.arange(k)] += 3 * np.sqrt(max(m, n)) + 1
    return a


def spd(n, seed):
    a = np.random.default_rng(seed).standard_normal((n, n))
    return a @ a.T + n * np.eye(n)


def singular(n):
    """A singular n x n matrix: a zero row stays exactly zero through elimination."""
    a = well(n, n, 7)
    a[n // 2] = 0.0
    return a


def close(got, want, scale=None) -> bool:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return False
    scale = np.abs(want).max(initial=0.0) if scale is None else scale
    return bool(np.all(np.abs(got - want) <= TOL * max(scale, 1e-300)))


def outcome(func):
    """(exception type or None, result) of ``func()``."""
    try:
        return None, func()
    except Exception as e:  # noqa: BLE001 -- compared with NumPy's below
        return type(e), e


def sweep(cases, run, compare):
    """For each (label, layout, args) of ``cases``: NumPy's ``run`` on the arrays and
    the distributed one on their DTensors, which must agree (``compare``) or raise
    NumPy's exception type on every rank. Returns the failures, on every rank."""
    problems = []
    for label, layout, args in cases:
        want_type, want = outcome(lambda: run(*args))
        dargs = [dist(x, layout) if isinstance(x, np.ndarray) and x.ndim == 2 else x
                 for x in args]
        got_type, got = outcome(lambda: run(*dargs))
        types = COMM.allgather(None if got_type is None else got_type.__name__)
        what = f"{label} {layout[0]} {layout[1]}"
        if want_type is not None:
            if any(t != want_type.__name__ for t in types):
                problems.append(f"{what}: NumPy raises {want_type.__name__}, ranks {types}"
                                f" ({got if got_type else 'no exception'})")
            continue
        if any(t is not None for t in types):
            problems.append(f"{what}: ranks raise {types} ({got}), NumPy does not")
            continue
        try:
            bad = compare(got, want, args)
        except Exception as e:  # noqa: BLE001
            bad = f"{type(e).__name__}: {e}"
        if COMM.allreduce(bool(bad), op=MPI.LOR):
            problems.append(f"{what}: {bad or 'another rank differs'}")
    return problems


def square_cases(make):
    return [(f"n={n}", lay, make(n)) for n in SIZES for lay in layouts()]


def rect_cases(make):
    return [(f"{m}x{n}", lay, make(m, n))
            for m in SIZES for n in SIZES for lay in layouts()]


def full(x):
    return x.full_tensor() if hasattr(x, "full_tensor") else x


def check(problems):
    assert not problems, f"{len(problems)} cases differ:\n" + "\n".join(problems[:40])


def test_solve():
    rhs = lambda n: np.arange(1.0, n + 1)  # noqa: E731
    cases = square_cases(lambda n: (well(n, n, n), rhs(n)))
    cases += square_cases(lambda n: (well(n, n, n), np.ones((n, 2))))
    cases += square_cases(lambda n: (singular(n), rhs(n)))
    check(sweep(cases, lambda a, b: np.linalg.solve(a, b),
                lambda got, want, args: not close(full(got), want) and "x differs"))


def test_inv():
    cases = square_cases(lambda n: (well(n, n, n),)) + \
        square_cases(lambda n: (singular(n),))
    check(sweep(cases, np.linalg.inv,
                lambda got, want, args: not close(full(got), want) and "inverse differs"))


def test_det_and_slogdet():
    cases = square_cases(lambda n: (well(n, n, n),)) + \
        square_cases(lambda n: (singular(n),))
    check(sweep(cases, np.linalg.det,
                lambda got, want, args: not close(full(got), want) and "det differs"))

    def both(got, want, args):
        sign, logabs = (full(x) for x in got)
        if sign != want[0]:
            return f"sign {sign} for {want[0]}"
        return (not (logabs == want[1] or close(logabs, want[1], 1.0))
                and f"logabsdet {logabs} for {want[1]}")
    check(sweep(cases, np.linalg.slogdet, both))


def test_cholesky():
    indefinite = square_cases(lambda n: (well(n, n, n) - 20 * np.eye(n),))
    cases = square_cases(lambda n: (spd(n, n),)) + indefinite
    check(sweep(cases, np.linalg.cholesky,
                lambda got, want, args: not close(full(got), want) and "factor differs"))


def test_eigh_and_eigvalsh():
    cases = square_cases(lambda n: (spd(n, n) - n * np.eye(n),))

    def vectors(got, want, args):
        (a,) = args
        w, v = full(got[0]), full(got[1])
        if not close(w, want[0]):
            return "eigenvalues differ"
        if np.linalg.norm(a @ v - v * w) > TOL * np.linalg.norm(a):
            return "A V != V diag(w)"
        return np.linalg.norm(v.T @ v - np.eye(len(w))) > TOL and "V not orthonormal"
    check(sweep(cases, np.linalg.eigh, vectors))
    check(sweep(cases, lambda a: np.linalg.eigvalsh(a, UPLO="U"),
                lambda got, want, args: not close(full(got), want)
                and "eigenvalues differ"))


def _svd_check(got, want, args, full_matrices):
    (a,) = args
    u, s, vh = (full(x) for x in got)
    if u.shape != want[0].shape or vh.shape != want[2].shape:
        return f"shapes {u.shape} {vh.shape} for {want[0].shape} {want[2].shape}"
    if not close(s, want[1]):
        return "singular values differ"
    k = len(s)
    if np.linalg.norm(a - (u[:, :k] * s) @ vh[:k]) > TOL * np.linalg.norm(a):
        return "U S Vh != A"
    if np.linalg.norm(u.T @ u - np.eye(u.shape[1])) > TOL:
        return "U not orthonormal"
    return np.linalg.norm(vh @ vh.T - np.eye(vh.shape[0])) > TOL and "Vh not orthonormal"


def test_svd():
    cases = rect_cases(lambda m, n: (well(m, n, m * 10 + n),))
    for fm in (False, True):
        check(sweep(cases, lambda a, fm=fm: np.linalg.svd(a, full_matrices=fm),
                    lambda got, want, args, fm=fm: _svd_check(got, want, args, fm)))
    check(sweep(cases, lambda a: np.linalg.svd(a, compute_uv=False),
                lambda got, want, args: not close(full(got), want) and "values differ"))


def test_lstsq():
    cases = rect_cases(lambda m, n: (well(m, n, m * 10 + n), np.arange(1.0, m + 1)))

    def compare(got, want, args):
        x, res, rank, s = got
        if type(rank) is not type(want[2]) or rank != want[2]:
            return f"rank {rank!r} ({type(rank).__name__}) for {want[2]!r}"
        for name, g, w in (("x", x, want[0]), ("residuals", res, want[1]),
                           ("s", s, want[3])):
            g = full(g)
            if g.dtype != w.dtype or not close(g, w):
                return f"{name} {g} for {w}"
        return None
    check(sweep(cases, lambda a, b: np.linalg.lstsq(a, b), compare))


def test_qr():
    cases = rect_cases(lambda m, n: (well(m, n, m * 10 + n),))
    for mode in ("reduced", "complete"):
        def compare(got, want, args, mode=mode):
            (a,) = args
            q, r = full(got[0]), full(got[1])
            if q.shape != want[0].shape or r.shape != want[1].shape:
                return f"shapes {q.shape} {r.shape}"
            if np.linalg.norm(a - q @ r) > TOL * np.linalg.norm(a):
                return "Q R != A"
            if not np.array_equal(r, np.triu(r)):
                return "R not upper triangular"
            return not close(np.abs(r), np.abs(want[1])) and "|R| differs"
        check(sweep(cases, lambda a, mode=mode: np.linalg.qr(a, mode=mode), compare))
    check(sweep(cases, lambda a: np.linalg.qr(a, mode="r"),
                lambda got, want, args: not close(np.abs(full(got)), np.abs(want))
                and "|R| differs"))


def same(got, want) -> bool:
    """The very values NumPy gives, NaNs and infinities where it puts them."""
    got, want = np.asarray(full(got)), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    with np.errstate(invalid="ignore"):
        scale = np.abs(want[np.isfinite(want)]).max(initial=1.0)
        return bool(np.all((got == want) | (np.isnan(got) & np.isnan(want))
                           | (np.abs(got - want) <= 1e-12 * scale)))


def non_finite(shape, seed):
    """Matrices of ``shape`` with a NaN, an infinity or a minus infinity in the
    lower or the upper triangle (eigh reads one of them)."""
    out = []
    for bad in (np.nan, np.inf, -np.inf):
        for at in ((shape[0] - 1, 0), (0, shape[1] - 1)):
            a = spd(shape[0], seed)[:, :shape[1]] if shape[0] == shape[1] else \
                well(*shape, seed)
            a[at] = bad
            out.append((f"{bad} at {at}", a))
    return out


def svd_reference(a):
    """NumPy's thin SVD, but for a matrix holding an infinity and no NaN: NumPy's
    LAPACK gives all-NaN singular values and arbitrary vectors there, or on some
    such matrices never returns, and the distributed svd gives U and Vh NaN."""
    if isinstance(a, np.ndarray) and np.isinf(a).any() and not np.isnan(a).any():
        s = np.linalg.svd(a, compute_uv=False)
        k = len(s)
        return (np.full((a.shape[0], k), np.nan), s, np.full((k, a.shape[1]), np.nan))
    return np.linalg.svd(a, full_matrices=False)


def lstsq_reference(a, b):
    """NumPy's lstsq, whose LinAlgError for an A holding a NaN or an infinity
    comes without calling LAPACK, which on some such matrices never returns."""
    if isinstance(a, np.ndarray) and not np.isfinite(a).all():
        raise np.linalg.LinAlgError("SVD did not converge in Linear Least Squares")
    return np.linalg.lstsq(a, b)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_non_finite_input_gives_numpys_answer():
    """A NaN or an infinity never reaches ScaLAPACK (which rejects it, prints
    LAPACK's complaints or answers otherwise): NumPy's own results, or its
    LinAlgError on every rank, whichever engine the layout would take."""
    n = 3 * P
    square = [(label, lay, (a,)) for label, a in non_finite((n, n), 1) for lay in layouts()]
    calls = {"inv": np.linalg.inv, "det": np.linalg.det, "slogdet": np.linalg.slogdet,
             "cholesky": np.linalg.cholesky, "eigh": np.linalg.eigh,
             "eigh U": lambda a: np.linalg.eigh(a, UPLO="U"),
             "eigvalsh": np.linalg.eigvalsh, "qr": np.linalg.qr,
             "svd": lambda a: svd_reference(a),
             "svdvals": lambda a: np.linalg.svd(a, compute_uv=False)}

    def compare(got, want, args):
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        return not all(same(g, w) for g, w in zip(got, want)) and "differs from NumPy"
    problems = []
    for name, f in calls.items():
        problems += [f"{name} {p}" for p in sweep(square, f, compare)]
    rhs = np.arange(1.0, n + 1)
    problems += [f"solve {p}" for p in sweep(
        [(lab, lay, (a, rhs)) for lab, lay, (a,) in square],
        np.linalg.solve, compare)]
    # Tall (TSQR's, rows sharded), and wide (ScaLAPACK's).
    for shape in ((8 * P, 3), (n, n + 2)):
        rect = [(lab, lay, (a,)) for lab, a in non_finite(shape, 2) for lay in layouts()]
        for name in ("qr", "svd", "svdvals"):
            problems += [f"{name} {shape} {p}" for p in sweep(rect, calls[name], compare)]
        b = np.arange(1.0, shape[0] + 1)

        def lstsq_same(got, want, args):
            x, res, rank, s = got
            return not (same(x, want[0]) and same(res, want[1]) and rank == want[2]
                        and same(s, want[3])) and "differs from NumPy"
        problems += [f"lstsq {shape} {p}" for p in sweep(
            [(lab, lay, (a, b)) for lab, lay, (a,) in rect],
            lstsq_reference, lstsq_same)]
    check(problems)
