import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
os.environ["LANGSMITH_TRACING"] = os.environ.get("SPECRAG_TEST_TRACING", "false")

# Hypothesis: CI is deterministic (derandomized, no example database, so a run depends on the
# code only); local runs keep exploring new examples and remember failures outside the
# checkout's test folders. Select a profile with HYPOTHESIS_PROFILE=ci|dev.
from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis.database import DirectoryBasedExampleDatabase  # noqa: E402

from specrag.paths import cache_dir  # noqa: E402

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev", database=DirectoryBasedExampleDatabase(str(cache_dir() / "hypothesis"))
)
_PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
settings.load_profile(_PROFILE)


@pytest.fixture(autouse=True)
def _forget_failed_loads():
    """A slow model load that failed is remembered for a minute (specrag.models.loading):
    each test starts without another test's failures (and imports nothing for it)."""
    import sys

    def clear():
        if (loading := sys.modules.get("specrag.models.loading")) is not None:
            loading.FAILED_LOADS.clear()

    clear()
    yield
    clear()
