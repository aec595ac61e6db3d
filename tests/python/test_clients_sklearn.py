"""scikit-learn on DTensors gives scikit-learn's answers on NumPy.

scikit-learn takes DTensors through the array API (``array_api_dispatch=True``,
the namespace ``mpitensor.array_api`` by name). Each case runs scikit-learn's own
checks, which fit and call every method once on NumPy arrays and once on the
namespace's arrays and compare attributes and results: every estimator tagged
``array_api_support`` and every metric scikit-learn lists as array-API compatible.
A few classifiers and a pipeline are also compared label for label, since a
label order that follows the ranks (an unsorted ``unique_values``) predicted other
labels in every row without an error.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.array_api as xp

sklearn = pytest.importorskip("sklearn")
# SciPy reads it once, at its import: the conftest sets it before anything does.
assert os.environ.get("SCIPY_ARRAY_API") == "1"

from sklearn.utils import all_estimators  # noqa: E402
from sklearn.utils._test_common.instance_generator import _construct_instances  # noqa: E402
from sklearn.utils.estimator_checks import check_array_api_input_and_values  # noqa: E402

from client_helpers import recording_gathers  # noqa: E402

NAMESPACE = "mpitensor.array_api"

# Estimators whose default instance is compared where its answer is not unique:
# PCA() keeps every component, and those past the data's rank are any orthonormal
# basis of its null space (NumPy's own solvers differ there). They are checked
# with the components scikit-learn's own array-API tests use.
_NOT_UNIQUE = {"PCA"}
# Not estimators of data: LabelEncoder fits labels alone (checked below).
_OWN_TEST = {"LabelEncoder"}


def _tagged():
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, cls in all_estimators():
            if name in _NOT_UNIQUE or name in _OWN_TEST:
                continue
            try:
                instances = list(_construct_instances(cls))
            except Exception:  # noqa: BLE001 - needs arguments the generator lacks
                continue
            for est in instances:
                if est.__sklearn_tags__().array_api_support:
                    out.append(pytest.param(est, id=f"{name}-{len(out)}"))
    return out


def _pca_instances():
    from sklearn.decomposition import PCA
    return [PCA(n_components=2, svd_solver="full"),
            PCA(n_components=0.1, svd_solver="full", whiten=True),
            PCA(n_components=2, svd_solver="covariance_eigh"),
            PCA(n_components=2, svd_solver="randomized", power_iteration_normalizer="QR",
                random_state=0)]


@pytest.mark.parametrize("estimator", _tagged() + [pytest.param(p, id=f"PCA-{i}")
                                                   for i, p in enumerate(_pca_instances())])
def test_estimator_gives_numpys_values(record_property, estimator):
    with recording_gathers(record_property):
        with sklearn.config_context(array_api_dispatch=True):
            check_array_api_input_and_values(type(estimator).__name__, estimator,
                                             NAMESPACE)


def _metric_cases():
    from sklearn.metrics.tests.test_common import array_api_metric_checkers
    out = []
    for metric, checks in array_api_metric_checkers.items():
        name = getattr(metric, "__name__", None) or getattr(metric, "func").__name__
        for check in checks:
            kind = check.__name__.replace("check_array_api_", "")
            out.append(pytest.param(metric, check, id=f"{name}-{kind}"))
    return out


@pytest.mark.parametrize("metric, check", _metric_cases())
def test_metric_gives_numpys_values(record_property, metric, check):
    with recording_gathers(record_property):
        check(metric, NAMESPACE, None, "float64")


def _full(a):
    return a.full_tensor() if isinstance(a, mt.DTensor) else np.asarray(a)


def _classifiers():
    from sklearn.decomposition import PCA
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
    from sklearn.linear_model import LogisticRegression, RidgeClassifierCV
    from sklearn.naive_bayes import GaussianNB
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    return {"LogisticRegression": LogisticRegression,
            "pipeline": lambda: make_pipeline(StandardScaler(), PCA(n_components=4),
                                              LogisticRegression()),
            "GaussianNB": GaussianNB, "LDA": LinearDiscriminantAnalysis,
            "RidgeClassifierCV": RidgeClassifierCV}


@pytest.mark.parametrize("name", list(_classifiers()))
@pytest.mark.parametrize("labels", [(0, 1, 2), (7, -3, 2)], ids=["0-1-2", "7-m3-2"])
def test_classifier_labels_are_numpys(record_property, name, labels):
    from sklearn.datasets import make_classification
    X, y = make_classification(301, 8, n_informative=5, n_classes=3, random_state=0)
    y = np.asarray(labels)[y]
    make = _classifiers()[name]
    ref = make().fit(X, y)
    with recording_gathers(record_property):
        with sklearn.config_context(array_api_dispatch=True):
            got = make().fit(xp.asarray(X), xp.asarray(y))
            pred = _full(got.predict(xp.asarray(X)))
            classes = _full(got.classes_)
            proba = (_full(got.predict_proba(xp.asarray(X)))
                     if hasattr(got, "predict_proba") else None)
    np.testing.assert_array_equal(classes, ref.classes_)
    np.testing.assert_array_equal(pred, ref.predict(X))
    if proba is not None:
        np.testing.assert_allclose(proba, ref.predict_proba(X), rtol=1e-8, atol=1e-10)


def test_label_encoder_is_numpys(record_property):
    from sklearn.preprocessing import LabelEncoder
    y = np.random.default_rng(3).choice([5, -1, 9, 2], 103)
    ref = LabelEncoder().fit(y)
    with recording_gathers(record_property), sklearn.config_context(array_api_dispatch=True):
        enc = LabelEncoder().fit(xp.asarray(y))
        codes = enc.transform(xp.asarray(y))
        back = enc.inverse_transform(codes)
    np.testing.assert_array_equal(_full(enc.classes_), ref.classes_)
    np.testing.assert_array_equal(_full(codes), ref.transform(y))
    np.testing.assert_array_equal(_full(back), y)
