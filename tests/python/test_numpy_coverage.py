"""docs/numpy_coverage.md is the registry's page as it stands:
a rule added or removed without regenerating the page fails here."""

from pathlib import Path

import pytest

from mpitensor import _coverage

# The registry's page: the same at every rank count.
pytestmark = pytest.mark.np(1)

PAGE = Path(__file__).resolve().parents[2] / "docs" / "numpy_coverage.md"


def test_the_coverage_page_is_current():
    assert PAGE.read_text() == _coverage.page(), (
        "docs/numpy_coverage.md is stale: python -m mpitensor._coverage > "
        "docs/numpy_coverage.md")


def test_the_page_names_what_gathers_and_what_does_not():
    page = _coverage.page()
    assert "| `numpy.sum` | distributed" in page
    assert "| `numpy.kron` | distributed (`_kron.py`) |" in page
    assert "| `numpy.busday_count` | gathered |" in page  # no rule: the fallback's
    assert "| `numpy.savez` | distributed (`checkpoint/_npz.py`) |" in page
    assert "| `add` | distributed | distributed | distributed | distributed | distributed |" in page
