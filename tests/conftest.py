import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
os.environ["LANGSMITH_TRACING"] = os.environ.get("SPECRAG_TEST_TRACING", "false")

# Hypothesis: deterministic by default (derandomized, no example database, so a run depends on
# the code only); HYPOTHESIS_PROFILE=dev explores new examples and remembers failures outside
# the checkout's test folders.
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
    "dev",
    database=DirectoryBasedExampleDatabase(str(cache_dir() / "hypothesis")),
    suppress_health_check=[HealthCheck.too_slow],
)
# deterministic unless asked: a bare `make test` (no $CI) drew new examples each run, and a
# loaded machine tripped the too-slow check; HYPOTHESIS_PROFILE=dev explores and remembers
_PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or "ci"
settings.load_profile(_PROFILE)


@pytest.fixture(autouse=True)
def _model_thread_idle_after():
    """A test whose decode job ignores its stop (a long step) leaves it running on the shared
    model thread: the next test's tight budgets waited behind it, so each test ends when the
    thread has no job left (at most 15 s)."""
    import sys
    import time

    yield
    if (worker := sys.modules.get("specrag.models.worker")) is None:
        return
    thread = worker.MODEL_THREAD
    start = time.monotonic()
    while (thread._active or thread._waiting) and time.monotonic() - start < 15:
        time.sleep(0.01)


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
