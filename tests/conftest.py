import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture
def seed() -> int:
    torch.manual_seed(0)
    return 0


def pytest_configure(config) -> None:
    """Where bubblewrap is unavailable, the suite opts in explicitly to the sandbox's process layer alone (the default
    refuses to run generated code without it); the tests that need bubblewrap skip with the reason."""
    from hf_mdm.harness.sandbox import UNISOLATED_ENV, bubblewrap_unavailable

    if bubblewrap_unavailable():
        os.environ[UNISOLATED_ENV] = "1"


def pytest_terminal_summary(terminalreporter) -> None:
    """Say once which layer the sandbox's tests ran generated code with (bubblewrap, or why not)."""
    from hf_mdm.harness.sandbox import bubblewrap_unavailable

    reason = bubblewrap_unavailable()
    if reason is None:
        terminalreporter.write_line("sandbox: generated code ran under bubblewrap (the operating-system layer)")
    else:
        terminalreporter.write_line(
            f"sandbox: bubblewrap unavailable, its tests were skipped and the rest used the explicit opt-in to "
            f"unisolated execution: {reason}"
        )
