"""The byte-level tokenizer of the tiny model.

Vocabulary (259 ids): ``0 <|endoftext|>`` (also the pad token), ``1 <|im_start|>``,
``2 <|im_end|>`` (the end-of-sequence token), then one token per byte: byte ``b`` has id
``BYTE_OFFSET + b``. Byte-level BPE with no merges, so a text encodes to exactly the UTF-8 bytes of
its NFC form, and the special strings above are always parsed as their special ids.

Why the Qwen2 pipeline (NFC normaliser, Qwen's split regex, byte-level): transformers 5 loads any
``model_type: qwen2`` checkpoint's tokenizer with ``Qwen2Tokenizer``, which rebuilds that pipeline
whatever ``tokenizer.json`` says. We build the tokenizer with the same class, so what we save is
exactly what ``AutoTokenizer`` (and vLLM through it) loads. Consequence: ``decode(encode(s)) ==
unicodedata.normalize("NFC", s)`` for any text ``s``.

The chat template is Qwen-style (``<|im_start|>role\\n...<|im_end|>\\n``) with
``{% generation %}`` markers around assistant content, so
``apply_chat_template(..., return_assistant_tokens_mask=True)`` works.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # transformers is imported where a tokenizer is built: VOCAB_SIZE stays cheap to read
    from transformers import PreTrainedTokenizerFast

__all__ = [
    "BYTE_OFFSET",
    "ENDOFTEXT",
    "IM_END",
    "IM_START",
    "SPECIAL_TOKENS",
    "VOCAB_SIZE",
    "build_tokenizer",
    "byte_token_id",
    "chat_template",
]

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
BYTE_OFFSET = len(SPECIAL_TOKENS)
VOCAB_SIZE = BYTE_OFFSET + 256


def _bytes_to_unicode() -> dict[int, str]:
    """The byte -> printable character table that byte-level BPE uses for its vocabulary."""
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAC + 1)) | set(range(0xAE, 0xFF + 1))
    table: dict[int, str] = {}
    extra = 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def byte_token_id(b: int) -> int:
    """Token id of byte ``b`` (0..255)."""
    if not 0 <= b < 256:
        raise ValueError(f"byte must be in 0..255, got {b}")
    return BYTE_OFFSET + b


def chat_template() -> str:
    """The chat template shipped as package data (``chat_template.jinja``)."""
    return resources.files(__package__).joinpath("chat_template.jinja").read_text(encoding="utf-8")


def build_tokenizer() -> "PreTrainedTokenizerFast":
    """Build the byte-level tokenizer (deterministic; needs no network and no files).

    Returns a ``Qwen2Tokenizer``, a ``PreTrainedTokenizerFast`` backed by a ``tokenizers`` BPE
    model with the 259-entry vocabulary above and no merges.
    """
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for b, ch in _bytes_to_unicode().items():
        vocab[ch] = byte_token_id(b)
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    tok = Qwen2Tokenizer(
        vocab=vocab,
        merges=[],
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,  # type: ignore[arg-type]  # no unknown token (byte-level)
        extra_special_tokens=[IM_START],
        chat_template=chat_template(),
        model_max_length=1 << 30,
        clean_up_tokenization_spaces=False,
    )
    if len(tok) != VOCAB_SIZE or tok.convert_tokens_to_ids([ENDOFTEXT, IM_START, IM_END]) != [0, 1, 2]:
        raise RuntimeError(f"tokenizer build produced {len(tok)} tokens, expected {VOCAB_SIZE} "
                           "with special ids 0, 1, 2")
    return tok
