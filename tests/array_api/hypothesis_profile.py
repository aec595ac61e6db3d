"""A pytest plugin for the array API standard's suite (data-apis/array-api-tests)
run against mpitensor.array_api (tests/array_api/run.sh loads it with -p).

It keeps the suite's Hypothesis settings and takes away what would make ranks
disagree or make a short run long: no example database (each rank would replay its
own past failures, so the ranks would draw different examples and stop matching
their collectives) and no shrinking (a failing example is reported as drawn; its
minimal form costs many more calls, each a collective on a sharded array)."""

import pytest
from hypothesis import Phase, settings


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    settings.register_profile(
        "mpitensor-array-api", settings(settings(), database=None,
                                        phases=[Phase.explicit, Phase.generate]))
    settings.load_profile("mpitensor-array-api")
