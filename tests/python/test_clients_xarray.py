"""xarray over DTensors gives xarray's answers over NumPy.

A DataArray whose data is a DTensor (made by ``mpitensor.array_api.asarray``, rows
sharded over the world) runs xarray's reductions, arithmetic, groupby, rolling,
coarsen, resample, quantile, interp, polyfit, dot and differentiate through the
array's namespace and NumPy's protocols; each case is the same call on a
DataArray over the NumPy array, to 1e-8.
"""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.array_api as xp
from client_helpers import recording_gathers

xr = pytest.importorskip("xarray")
pd = pytest.importorskip("pandas")

A = np.random.default_rng(0).normal(size=(25, 5))
TIME = pd.date_range("2020-01-01", periods=25, freq="D")


def _array(data):
    return xr.DataArray(data, dims=("time", "x"),
                        coords={"time": TIME, "x": np.arange(5.0)}, name="a")


def _plain(v):
    if isinstance(v, xr.Dataset):
        return {k: _plain(v[k]) for k in v.data_vars}
    data = v.data if isinstance(v, xr.DataArray) else v
    return data.full_tensor() if isinstance(data, mt.DTensor) else np.asarray(data)


CASES = {
    "sum": lambda d: d.sum("time"), "mean": lambda d: d.mean(),
    "std": lambda d: d.std("x"), "median": lambda d: d.median("time"),
    "arithmetic": lambda d: (d * 2 + 1) / d.max(), "where": lambda d: d.where(d > 0),
    "groupby": lambda d: d.groupby("time.dayofweek").mean(),
    "coarsen": lambda d: d.coarsen(time=5).mean(),
    "resample": lambda d: d.resample(time="W").mean(),
    "quantile": lambda d: d.quantile([0.3, 0.9], dim="time"),
    "interp": lambda d: d.interp(x=[0.5, 1.5, 3.25]),
    "dot": lambda d: xr.dot(d, d, dim="x"),
    "differentiate": lambda d: d.differentiate("x"),
    "shift": lambda d: d.shift(time=2), "pad": lambda d: d.pad(time=2),
    "cumsum": lambda d: d.cumsum("time"), "cumprod": lambda d: d.cumprod("x"),
    "diff": lambda d: d.diff("time"), "clip": lambda d: d.clip(-0.5, 0.5),
    "isel": lambda d: d.isel(time=slice(2, 9)), "sel": lambda d: d.sel(x=2.0),
    "transpose": lambda d: d.T, "argmax": lambda d: d.argmax("time"),
    "round": lambda d: d.round(1), "concat": lambda d: xr.concat([d, d], "time"),
    "values": lambda d: d.values, "to_numpy": lambda d: d.to_numpy(),
    "dataset": lambda d: (d.to_dataset() * 3).mean("x"),
    "rolling": lambda d: d.rolling(time=3).mean(),
    "polyfit": lambda d: d.polyfit("x", 2),
}
def _same(got, want):
    if isinstance(want, dict):
        assert set(got) == set(want)
        for k in want:
            _same(got[k], want[k])
    elif want.dtype.kind in "mM":  # coordinates: dates, exactly
        assert got.dtype == want.dtype and np.array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-8, equal_nan=True)


@pytest.mark.parametrize("name", list(CASES))
def test_dataarray_gives_numpys_values(record_property, name):
    call = CASES[name]
    want = _plain(call(_array(A)))
    with recording_gathers(record_property):
        got = _plain(call(_array(xp.asarray(A))))
    _same(got, want)


def _written(how):
    def write(d):
        if how == "setitem":
            d[0:3, 1] = 7.0
        elif how == "loc":
            d.loc[dict(time=TIME[4:6])] = -1.0
        elif how == "isel":
            d[dict(time=2)] = 0.5
        elif how == "iadd":
            d += 1
        else:
            d.data[d.data > 1] = 0.0
        return d
    return write


# Missing values in one column: xarray's skipna paths (nan-aware reductions, masks
# of all-missing slices, idxmax putting NaT back), and its writes into the data.
NAN_CASES = {
    "min": lambda d: d.min("time"), "mean": lambda d: d.mean("time"),
    "mean_skipna_false": lambda d: d.mean("time", skipna=False),
    "var": lambda d: d.var("time", ddof=1), "count": lambda d: d.count("time"),
    "median": lambda d: d.median("x"), "idxmax": lambda d: d.idxmax("time"),
    "idxmin_x": lambda d: d.idxmin("x"), "argmin": lambda d: d.argmin("x"),
    "rolling_sum": lambda d: d.rolling(time=4).sum(),
    "rolling_center": lambda d: d.rolling(time=3, center=True).max(),
    "coarsen_trim": lambda d: d.coarsen(time=4, boundary="trim").sum(),
    "groupby_sum": lambda d: d.groupby("time.month").sum(),
    "groupby_bins": lambda d: d.groupby_bins("x", [0, 2, 5]).mean(),
    "resample": lambda d: d.resample(time="2D").sum(),
    "weighted": lambda d: d.weighted(xr.DataArray(np.arange(5.0), dims="x")).mean("x"),
    "fillna": lambda d: d.fillna(0), "dropna": lambda d: d.dropna("time"),
    "interpolate_na": lambda d: d.interpolate_na("time"),
    "integrate": lambda d: d.integrate("x"), "roll": lambda d: d.roll(time=3),
    "reindex": lambda d: d.reindex(x=[0.0, 2.0, 7.0]),
    "stack": lambda d: d.stack(z=("time", "x")).unstack("z"),
    "corr": lambda d: xr.corr(d.isel(x=0), d.isel(x=1)),
    "min_count": lambda d: d.sum("time", min_count=30),
    **{f"write_{how}": _written(how) for how in ("setitem", "loc", "isel", "iadd", "mask")},
}


@pytest.mark.parametrize("name", list(NAN_CASES))
def test_dataarray_with_missing_values_gives_numpys_values(record_property, name):
    a = A.copy()
    a[3, 2] = a[7, 2] = np.nan
    call = NAN_CASES[name]
    want = _plain(call(_array(a.copy())))
    with recording_gathers(record_property):
        got = _plain(call(_array(xp.asarray(a.copy()))))
    _same(got, want)
