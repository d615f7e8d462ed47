"""pytest fixtures shared by the Python tests."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "dev", "data"))
import gpt2_bpe  # noqa: E402


@pytest.fixture(scope="session")
def encoding():
    """GPT-2's tiktoken encoding from the local rank file. Without one the tests that use it
    skip, unless LLM8_REQUIRE_BPE=1 (CI), where they fail."""
    try:
        return gpt2_bpe.load_gpt2_encoding()
    except gpt2_bpe.RankFileError as e:
        if os.environ.get("LLM8_REQUIRE_BPE") == "1":
            pytest.fail(f"LLM8_REQUIRE_BPE=1 but no GPT-2 rank file was found: {e}")
        pytest.skip(f"no GPT-2 rank file here (run scripts/setup_python.sh): {e}")
