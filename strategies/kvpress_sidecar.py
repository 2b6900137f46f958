"""The JSON sidecar of a ``--format kvpress`` export: how it is written, and how it is read back.

The module and its sidecar are written as one set (:func:`strategies.io.atomic_write_files`);
both record the digest of the strategy they come from (``STRATEGY_DIGEST`` in the module,
``strategy_digest`` in the sidecar), and :func:`read_export` refuses a pair whose digests differ,
as a process killed between the two renames could leave it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from strategies.exporters import ExportError
from strategies.kvpress_heads import HeadPlan, sidecar_layer
from strategies.kvpress_presses import (
    DECODING_INTERVAL,
    KVPRESS_REQUIREMENT,
    SIDECAR_SCHEMA,
    Press,
    pattern_params,
)
from strategies.strategy import LayerChoice, Strategy


def read_export(module: str | Path) -> dict[str, Any]:
    """The sidecar of the kvpress module ``module``, after checking that both come from one strategy.

    Reads text only (kvpress need not be installed). Raises :class:`ExportError` when either file is
    missing or unreadable, or when their strategy digests differ (a set mixed by an interrupted export).
    """
    module = Path(module)
    side = module.with_suffix(".json")
    try:
        text = module.read_text(encoding="utf-8")
        doc = json.loads(side.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ExportError(f"kvpress export {module}: cannot read it with its sidecar {side.name}: {err}") from None
    found = re.search(r'^STRATEGY_DIGEST = "([0-9a-f]+)"$', text, flags=re.MULTILINE)
    digest = found.group(1) if found else None
    if not isinstance(doc, dict) or doc.get("schema") != SIDECAR_SCHEMA:
        raise ExportError(f"kvpress export {module}: {side.name} is not a {SIDECAR_SCHEMA} sidecar")
    if digest is None or doc.get("strategy_digest") != digest:
        raise ExportError(
            f"kvpress export {module}: the module is of strategy {digest}, its sidecar {side.name} of "
            f"{doc.get('strategy_digest')}; export them again together"
        )
    return doc


def _press_json(press: Press | None) -> dict[str, Any] | None:
    return None if press is None else {"class": press.cls, "params": press.params}


def render_sidecar(strategy: Strategy, module_name: str, pre, dec, notes, heads: HeadPlan | None = None) -> str:
    """The sidecar JSON: per layer, the strategy's choice, its kvpress press and what differs (head-group
    layers: each group's key-mask rule, :mod:`strategies.kvpress_heads`)."""
    layers = []
    for i in range(strategy.num_layers):
        rules = heads.layers[i] if heads is not None else None
        if rules is not None:
            layers.append(sidecar_layer(strategy, i, rules))
            continue
        p, d = strategy.prefill[i], strategy.decoding[i]
        press, dropped = dec[i]
        dec_json: dict[str, Any] = {"pattern": d.pattern, "params": _params_or_empty(d), "budget": d.budget}
        if press is not None:
            dec_json["kvpress"] = {
                "class": "DecodingPress",
                "params": {
                    "base_press": _press_json(press),
                    "compression_interval": DECODING_INTERVAL,
                    "target_size": d.budget,
                    "hidden_states_buffer_size": 0,
                },
            }
        else:
            dec_json["kvpress"] = None
        dec_json["differences"] = [dropped] if dropped else list(press.differences if press else ())
        layers.append(
            {
                "layer": i,
                "prefill": {
                    "pattern": p.pattern,
                    "params": _params_or_empty(p),
                    "budget": p.budget,
                    "kvpress": _press_json(pre[i]),
                    "differences": list(pre[i].differences if pre[i] else ()),
                },
                "decoding": dec_json,
            }
        )
    body = {
        "schema": SIDECAR_SCHEMA,
        "version": 1,
        "module": module_name,
        "kvpress": KVPRESS_REQUIREMENT,
        "strategy_digest": strategy.digest(),
        "num_layers": strategy.num_layers,
        "global_budget": strategy.global_budget,
        "b_min": strategy.b_min,
        "prefill_ratio": "compression_ratio = 1 - (budget + 0.5) / prompt_length if prompt_length > budget else 0",
        "decoding_interval": DECODING_INTERVAL,
        "layers": layers,
        "notes": notes,
        "provenance": strategy.provenance,
    }
    if heads is not None and heads.any:
        body["head_groups"] = "per KV head, kvpress key masks updated after every attention call (module docstring)"
        body["warnings"] = list(heads.warnings)
        body["duo_attention"] = heads.duo
    return json.dumps(body, indent=2) + "\n"


def _params_or_empty(choice: LayerChoice) -> dict[str, Any]:
    return {} if choice.pattern == "full" else pattern_params(choice)
