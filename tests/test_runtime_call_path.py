"""One attention call runs top to bottom: the attention function, the layer of kernel groups, the call protocol
(``base_layer``), the evicting layer, the masks and kernel (``view``) and the store (``storage``); no runtime module
is called again from a module below it."""

from __future__ import annotations

import sys

import torch

from polykv_search.patterns import make_pattern
from polykv_search.runtime import FULL_PLAN, GroupedLayer, HeadGroupPlan, PhasePlan, apply_strategy
from strategies import Strategy
from tests.test_runtime import batch
from tests.tiny import tiny_model

#: The runtime modules one attention call through a head-group layer names (masks and the kernel: ``view``;
#: evictions: ``layer``; the cached tensors: ``storage``).
ALLOWED = {"attention", "layouts", "base_layer", "layer", "view", "storage"}


def _trace(run) -> list[dict]:
    """Per attention call of ``run()``, the runtime modules it named and the ones it re-entered from below."""
    calls: list[dict] = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "polykv_attention":
            calls.append({"stack": [], "modules": set(), "functions": set(), "reentered": set(), "frame": frame})
        if not calls or calls[-1]["frame"] is None:
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("polykv_search.runtime."):
            return
        call, name = calls[-1], module.rsplit(".", 1)[-1]
        if event == "call":
            stack = call["stack"]
            if stack and stack[-1] != name and name in stack:
                call["reentered"].add(name)
            call["modules"].add(name)
            call["functions"].add(f"{name}.{frame.f_code.co_name}")
            stack.append(name)
        elif event == "return":
            call["stack"].pop()
            if frame is call["frame"]:
                call["frame"] = None

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


def test_an_attention_call_through_head_groups_names_few_modules_and_reenters_none():
    model = tiny_model("llama", layers=2, seed=3)
    snap = PhasePlan(make_pattern("snapkv"), 8)
    groups = {0: [HeadGroupPlan((0,), FULL_PLAN, FULL_PLAN), HeadGroupPlan((1,), snap, snap)]}
    ids, _ = batch(seed=4, n=20, pad=0)
    with torch.no_grad(), apply_strategy(model, Strategy.full(2), head_groups=groups) as rt:

        def prefill_and_step():
            out = model(ids, use_cache=True)
            model(out.logits[:, -1:].argmax(-1), cache=out.cache, use_cache=True)

        calls = _trace(prefill_and_step)
        assert isinstance(rt.last_cache.layers[0], GroupedLayer)
    assert len(calls) == 4  # two layers, prefill and one decoding step
    for call in calls:
        assert call["modules"] <= ALLOWED, call["modules"]
        assert not call["reentered"], call["reentered"]
    assert calls[0]["modules"] == ALLOWED  # the head-group layer's call names every one of them
    assert "view.run" in calls[0]["functions"]  # ran its groups' kernels


def test_the_trace_sees_a_module_called_again_from_below():
    """A runtime module ``a`` that calls ``b``, which calls back into ``a``: the trace reports ``a`` re-entered."""
    entry, a, b = ({"__name__": f"polykv_search.runtime.{m}"} for m in ("attention", "a", "b"))
    exec("def back():\n    return 1\ndef up():\n    return down()", a)
    exec("def down():\n    return back()", b)
    exec("def polykv_attention():\n    return up()", entry)
    a["down"], b["back"], entry["up"] = b["down"], a["back"], a["up"]
    (call,) = _trace(entry["polykv_attention"])
    assert call["modules"] == {"attention", "a", "b"} and call["reentered"] == {"a"}
