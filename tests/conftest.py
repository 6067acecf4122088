import os

import pytest

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Tests never download: the hub clients fail fast instead of timing out.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture
def one_torch_thread():
    """One intra-op torch thread for the test, the caller's setting restored afterwards: tiny models gain
    nothing from threads, and spinning threads on a busy 2-core machine make timings erratic."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def ieee_subnormals():
    """Every test starts and ends with IEEE subnormals on this thread: a test that runs a trial in this
    process (``run_trial``) sets the trial's flush mode (flatlab.train.cpu_threads), which would otherwise
    stay set for the tests after it."""
    import torch

    yield
    torch.set_flush_denormal(False)
