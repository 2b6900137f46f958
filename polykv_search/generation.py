"""Text generation under a strategy, with cache reports after prefill and at the end."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from polykv_search.runtime import CacheReport, apply_strategy
from strategies import Strategy


@dataclass
class GenerationResult:
    text: str
    prompt_tokens: int
    new_tokens: list[int]
    after_prefill: CacheReport
    at_end: CacheReport
    prefill_seconds: float
    decode_seconds: float
    extra: dict = field(default_factory=dict)

    @property
    def decode_tokens_per_second(self) -> float:
        steps = max(len(self.new_tokens) - 1, 0)
        return steps / self.decode_seconds if self.decode_seconds > 0 else float("nan")

    def to_json(self) -> dict:
        return {
            "text": self.text,
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": len(self.new_tokens),
            "prefill_seconds": self.prefill_seconds,
            "decode_seconds": self.decode_seconds,
            "decode_tokens_per_second": self.decode_tokens_per_second,
            "after_prefill": self.after_prefill.to_json(),
            "at_end": self.at_end.to_json(),
        }


def encode_prompt(tokenizer, prompt: str, *, chat: bool) -> torch.Tensor:
    """Token ids ``[1, n]`` of ``prompt``, wrapped in the chat template when asked and available."""
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        return tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
    return tokenizer(prompt, return_tensors="pt").input_ids


@torch.no_grad()
def generate(
    model,
    tokenizer,
    input_ids: torch.Tensor,
    strategy: Strategy,
    *,
    max_new_tokens: int,
    decode_interval: int = 1,
    interval_mode: str = "within",
    temperature: float = 0.0,
    seed: int = 0,
) -> GenerationResult:
    """Prefill ``input_ids`` (compressed per the strategy), then decode one token per step.

    Greedy when ``temperature`` is 0; otherwise sampling with a seeded generator. Stops at EOS.
    """
    device = next(model.parameters()).device
    input_ids = input_ids.to(device)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    eos = set(_as_list(getattr(tokenizer, "eos_token_id", None))) | set(
        _as_list(getattr(getattr(model, "generation_config", None), "eos_token_id", None))
    )
    new: list[int] = []
    with apply_strategy(model, strategy, decode_interval=decode_interval, interval_mode=interval_mode) as rt:
        t0 = time.perf_counter()
        out = model(input_ids=input_ids, use_cache=True)
        _sync(device)
        prefill_s = time.perf_counter() - t0
        cache = out.cache
        after_prefill = rt.report(cache)
        t0 = time.perf_counter()
        logits = out.logits[:, -1]
        for _ in range(max_new_tokens):
            token = _pick(logits, temperature, gen)
            new.append(token)
            if token in eos or len(new) == max_new_tokens:
                break
            out = model(input_ids=torch.tensor([[token]], device=device), cache=cache, use_cache=True)
            logits = out.logits[:, -1]
        _sync(device)
        decode_s = time.perf_counter() - t0
        at_end = rt.report(cache)
    text = tokenizer.decode(new, skip_special_tokens=True)
    return GenerationResult(text, input_ids.shape[1], new, after_prefill, at_end, prefill_s, decode_s)


def _pick(logits: torch.Tensor, temperature: float, gen: torch.Generator) -> int:
    if temperature <= 0:
        return int(logits[0].argmax())
    probs = torch.softmax(logits[0].float().cpu() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=gen))


def _as_list(x) -> list[int]:
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [int(x)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
