"""Integration tests on the real drafter/target pair (``make models-pair && make test-pair``).

Skipped, with the command to run, when the pair is not installed; CI runs the embedded model
only.
"""

import pytest

from specrag.models.pair import INSTALL_HINT, installed


def pytest_collection_modifyitems(config, items):
    if installed():
        return
    skip = pytest.mark.skip(reason=f"the drafter/target pair is not installed: {INSTALL_HINT}")
    for item in items:
        if "tests/pair" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def pair_models():
    from specrag.models.loading import load_lm

    return load_lm("qwen2.5-coder-1.5b", "cpu", "float32"), load_lm(
        "qwen2.5-coder-0.5b", "cpu", "float32"
    )
