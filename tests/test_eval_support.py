"""Shared helpers of the evaluation tests: a tiny char-level tokenizer and haystack text."""

from __future__ import annotations

import pydoc_data.topics

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

CHARS = [chr(i) for i in range(32, 127)] + ["\n"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def char_tokenizer(chat: bool = False) -> PreTrainedTokenizerFast:
    """One token per ASCII character (ids 4..99), BOS ``<s>``=1 added in front, EOS ``</s>``=2."""
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({c: i + 4 for i, c in enumerate(CHARS)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    if chat:
        fast.chat_template = CHAT_TEMPLATE
    return fast


def haystack_texts() -> list[str]:
    """Prose that ships with CPython (the design's fallback corpus), ASCII only."""
    topics = pydoc_data.topics.topics
    texts = [topics[k] for k in sorted(topics)]
    return ["".join(c for c in t if 32 <= ord(c) < 127 or c == "\n") for t in texts]


def test_char_tokenizer_round_trips_and_adds_bos():
    tok = char_tokenizer()
    ids = tok("ab c\n", add_special_tokens=True)["input_ids"]
    assert ids[0] == 1 and len(ids) == 6 and max(ids) < 128
    assert tok.decode(ids, skip_special_tokens=True) == "ab c\n"


def test_chat_template_keeps_one_bos():
    tok = char_tokenizer(chat=True)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids.count(1) == 1 and ids[0] == 1
    assert text.endswith("<|assistant|>\n")
