import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import util  # noqa: E402


@pytest.fixture(scope="session")
def pagoda_bin():
    assert util.PAGODA.exists(), f"build pagoda first: {util.PAGODA} is missing"
    return util.PAGODA


@pytest.fixture(scope="session")
def default_model():
    assert util.DEFAULT_MODEL.exists(), "run scripts/fetch-default-model.sh first"
    return util.DEFAULT_MODEL
