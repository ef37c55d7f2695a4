import pytest

from specrag.models.loading import load_lm


@pytest.fixture(scope="session")
def smol():
    """The embedded SmolLM2-135M (converted once into the user cache dir)."""
    return load_lm("embedded", "cpu", "float32")
