"""Bridges to other tools' extension points (optional extras; nothing here is imported by the core).

- :mod:`~polykv_search.integrations.lm_eval_model`: the ``polykv`` model type of EleutherAI's
  lm-evaluation-harness (``pip install 'polykv-search[lm-eval]'``).
- :mod:`~polykv_search.integrations.lm_eval_score`: lm-eval tasks inside a ``polykv-search score``
  run (``--lm-eval-tasks``), folded into the results file.
- :mod:`~polykv_search.integrations.lm_eval_support`: its error type and install check (no lm-eval import).
- :mod:`~polykv_search.integrations.lm_eval_cli`: ``polykv-lm-eval``, lm-eval's own command line with
  the ``polykv`` model registered.
"""
