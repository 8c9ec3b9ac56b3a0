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
