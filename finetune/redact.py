"""Keep secrets out of what a run writes (run.json, recipe.resolved.yml) and prints (error messages).

Redacted: the password in any URL (`postgresql://user:PASSWORD@host/db` -> `postgresql://user:***@host/db`),
query-string credentials (`?password=...`, `&token=...`), the value of any mapping key that names a secret
(password, secret, token, api_key, ...), and the literal value of secret environment variables
(WANDB_API_KEY, HF_TOKEN, ...) wherever it appears.
"""

from __future__ import annotations

import os
import re

MASK = "***"
SECRET_ENV = ("WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_TOKEN", "OPENAI_API_KEY",
              "PGPASSWORD", "MYSQL_PWD", "DATABASE_URL")
_SECRET_KEY = re.compile(r"(passw(or)?d|secret|api[_-]?key|credential|(^|[_-])(token|auth)$|^auth[_-])", re.IGNORECASE)
# user:PASSWORD@host after `scheme://`, or after a `/` when a URL was joined onto a folder (`.../postgresql:/u:p@h`)
_URL_PASSWORD = re.compile(r"(?P<head>(?:[a-zA-Z][a-zA-Z0-9+.\-]*:/?/|(?<=/))[^:/?#@\s`'\"]*:)(?P<pw>[^@/\s`'\"]+)"
                           r"(?P<at>@)")
_QUERY_SECRET = re.compile(r"(?P<head>[?&;](?:passw(?:or)?d|pwd|token|secret|api[_-]?key|access_token|key)=)"
                           r"(?P<value>[^&;#\s]+)", re.IGNORECASE)
_KEEP_KEYS = {"tokens", "special_tokens", "max_tokens", "tokens_per_step", "supervised_tokens", "pad_token",
              "eos_token", "bos_token", "unk_token", "sep_token", "cls_token", "mask_token"}


def _env_secrets() -> list[str]:
    return [v for name in SECRET_ENV if len(v := os.environ.get(name, "")) >= 6]


def redact_text(text: str) -> str:
    text = _URL_PASSWORD.sub(lambda m: m["head"] + MASK + m["at"], text)
    text = _QUERY_SECRET.sub(lambda m: m["head"] + MASK, text)
    for secret in _env_secrets():
        text = text.replace(secret, MASK)
    return text


def _secret_key(key: object) -> bool:
    if not isinstance(key, str) or key in _KEEP_KEYS or "tokens" in key:
        return False  # token *counts* and tokenizer settings are not secrets
    return bool(_SECRET_KEY.search(key))


def redact(value):
    """A copy of `value` (dicts, lists, strings, anything else) with every secret masked."""
    if isinstance(value, dict):
        return {k: (MASK if _secret_key(k) and isinstance(v, str) and v else redact(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v) for v in value)
    if isinstance(value, str):
        return redact_text(value)
    return value
