"""Hugging Face hub ids: fail fast, in one line, when a hub model is neither cached nor reachable."""

from __future__ import annotations

from polykv_search.models.sources import BUILTIN_MODELS, DEFAULT_MODEL, ModelError, _first_line


def _check_hub(repo_id: str, timeout: float = 10.0) -> None:
    """Fail in a second, in one line, for a hub id that is neither cached nor reachable.

    transformers retries an unreachable hub for about a minute per file; one metadata request
    without retries says as much. A cached ``config.json`` skips the request."""
    from huggingface_hub import HfApi, try_to_load_from_cache  # lazy: only hub ids need it (CLI start-up)
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return
    try:
        HfApi().model_info(repo_id, timeout=timeout)
    except GatedRepoError:
        return  # from_pretrained explains access (a token may be configured)
    except RepositoryNotFoundError:
        raise ModelError(
            f"model {repo_id!r}: no such model on the Hugging Face hub (and not a built-in name "
            f"[{', '.join(BUILTIN_MODELS)}] or a local path)"
        ) from None
    except HfHubHTTPError:
        return  # reachable; from_pretrained reports what is wrong
    except Exception as exc:  # noqa: BLE001 - connection, DNS, timeout, offline mode: the hub is unreachable
        raise ModelError(
            f"model {repo_id!r}: not in the local Hugging Face cache and the hub is unreachable "
            f"({_first_line(exc)}); pass a local path or {DEFAULT_MODEL!r}"
        ) from None
