"""Shared helpers of the model tests: a fake weights package on a temporary ``sys.path`` (never imported), a cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from polykv_search.models import SMOLLM2_CHAT_TEMPLATE, BuiltinModel

FAKE_PKG = "polykv_fake_weights_pkg"
TINY_GGUF = "Tiny-Test.F32.gguf"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("POLYKV_CACHE", str(root))
    return root


def fake_package(root: Path, files: dict[str, bytes]) -> Path:
    """A package on ``root`` whose import fails loudly, holding ``files``."""
    pkg = root / FAKE_PKG
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('this package must never be imported')\n")
    for name, data in files.items():
        (pkg / name).write_bytes(data)
    return pkg


def fake_builtin(*, sha256=None, chat_template=SMOLLM2_CHAT_TEMPLATE) -> BuiltinModel:
    return BuiltinModel(
        name="tiny-test",
        distribution="polykv-fake-weights",
        version="9.9.9",
        package=FAKE_PKG,
        filename=TINY_GGUF,
        sha256=sha256,
        chat_template=chat_template,
        context_length=256,
    )


def assert_one_line(exc_info):
    message = str(exc_info.value)
    assert message and "\n" not in message, message
    assert isinstance(exc_info.value, RuntimeError)


def saved_tiny_checkpoint(path: Path, family: str = "qwen2") -> tuple[Path, Path]:
    """A 2-layer random-init ``family`` model with the character tokenizer saved at ``path``, and a 40-document
    jsonl corpus of Austen haystacks beside it: what the CLI tests run ``--model``/``--corpus`` on."""
    import json

    from tests.test_eval_support import char_tokenizer, haystack_texts
    from tests.tiny import tiny_model

    tiny_model(family, layers=2).save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    corpus = path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps({"id": f"d{i}", "text": t}) for i, t in enumerate(haystack_texts()[:40])))
    return path, corpus
