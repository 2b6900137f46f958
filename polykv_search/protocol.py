"""The two evaluation protocols: what the compressed prompt call holds (docs/scoring.md, "Protocols").

* ``question-agnostic`` (the default, kvpress's default): the context is prefilled and compressed; the
  question (with the chat template's assistant header and any answer prefix) follows in a second call,
  uncompressed at prefill. The cache does not know what will be asked.
* ``question-aware`` (kvpress's ``compress_questions``, the KVCache-Factory setting of SnapKV, PyramidKV
  and H2O, and a chat server's single-turn prompt): the whole prompt -- context, question, template tail
  and answer prefix -- is prefilled in one call and compressed as one; the answer starts from that call's
  last position. kvpress moves only the question text into the compressed part and keeps the template
  tail and answer prefix (a few tokens) uncompressed; here the token sequence of the prompt is the same
  under both protocols and only the split point moves, so the two protocols differ in nothing else.

Results files record their protocol (``provenance.protocol``; a file without it is question-agnostic)
and files of different protocols are never paired.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

AGNOSTIC = "question-agnostic"
AWARE = "question-aware"
PROTOCOLS = (AGNOSTIC, AWARE)
DEFAULT = AGNOSTIC


def check_protocol(protocol: Any) -> str:
    """``protocol`` if it is one of :data:`PROTOCOLS`; ``ValueError`` (one line) otherwise."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; expected one of {', '.join(PROTOCOLS)}")
    return protocol


def split_prompt(
    context_ids: Sequence[int], question_ids: Sequence[int], protocol: str = DEFAULT
) -> tuple[list[int], list[int]]:
    """``(compressed, uncompressed)`` prompt ids: the first call's ids (compressed at prefill) and the
    second call's (none under ``question-aware``). Their concatenation is the same prompt either way."""
    if check_protocol(protocol) == AWARE:
        return [*context_ids, *question_ids], []
    return list(context_ids), list(question_ids)


def protocol_of(provenance: Mapping[str, Any] | None) -> str:
    """The protocol a results file's or checkpoint's ``provenance`` records (absent: question-agnostic)."""
    value = (provenance or {}).get("protocol")
    return AGNOSTIC if value is None else value


__all__ = ["AGNOSTIC", "AWARE", "DEFAULT", "PROTOCOLS", "check_protocol", "protocol_of", "split_prompt"]
