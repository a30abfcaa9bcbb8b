"""`rft_runtime.model.loading.torch_hidden`: a tokenizer loaded without importing torch, and nothing
hidden where that would break transformers. Each case runs in a fresh interpreter, since what
transformers decides about torch lasts for its process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.serve.support import TINY

CASES = {
    # a fresh process: twice torch-free, the same ids as with torch, and torch never imported
    "fresh": """
tok = load_tokenizer(TINY, torch_free=True)
again = load_tokenizer(TINY, torch_free=True)
ids = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True)
print("torch" in sys.modules, list(ids["input_ids"] if hasattr(ids, "keys") else ids), tok.decode([5, 6, 7]))
""",
    # transformers imported first with torch visible: nothing is hidden (hiding would fail its imports)
    "transformers-first": """
import transformers.utils.logging
tok = load_tokenizer(TINY, torch_free=True)
ids = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True)
print("torch" in sys.modules, list(ids["input_ids"] if hasattr(ids, "keys") else ids), tok.decode([5, 6, 7]))
""",
    # torch visible: the reference
    "with-torch": """
tok = load_tokenizer(TINY)
ids = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True)
print("torch" in sys.modules, list(ids["input_ids"] if hasattr(ids, "keys") else ids), tok.decode([5, 6, 7]))
""",
}


def _run(case: str) -> tuple[str, str]:
    code = (f"import sys\nfrom pathlib import Path\nfrom rft_runtime.model.loading import load_tokenizer\n"
            f"TINY = Path({str(TINY)!r})\n{CASES[case]}")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "PyTorch was not found" not in p.stderr  # transformers' advice is not printed
    torch_imported, rest = p.stdout.strip().split(" ", 1)
    return torch_imported, rest


@pytest.mark.parametrize("case, torch_imported", [("fresh", "False"), ("transformers-first", "True")])
def test_tokenizer_without_torch_or_nothing_hidden(case, torch_imported):
    got, out = _run(case)
    assert got == torch_imported
    assert out == _run("with-torch")[1]  # the same ids and text either way
