"""Secrets in a job's `env`: a key naming one, or a value that looks like one (issue 44.4, ADR 0043).

A run's conf (the spec of a generic-DAG run) is readable to everyone who may read that DAG in
Airflow, so a secret reaches a job by reference only. Create and Re-run refuse such entries, and
`validate_spec` refuses them again for a run a person triggered through the REST API. The rule
names the field, never the value.
"""

from __future__ import annotations

import re
from itertools import pairwise

# An env key naming a secret: one of these words between `_`s (HF_TOKEN, DB_PASSWORD; not TOKENIZERS_PARALLELISM) ...
SECRET_WORDS = frozenset({"TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASS", "PASSPHRASE", "CREDENTIAL",
                          "CREDENTIALS", "APIKEY", "AUTH", "PAT"})
SECRET_PAIRS = frozenset({("API", "KEY"), ("ACCESS", "KEY"), ("PRIVATE", "KEY"), ("SECRET", "KEY"),
                          ("SIGNING", "KEY"), ("ENCRYPTION", "KEY")})
# ... and a value that looks like one: a known token format, a private key, a URL with a password.
SECRET_VALUES = (
    ("a Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{20,}")),
    ("an AWS access key id", re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("a GitHub token", re.compile(r"\b(gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})")),
    ("a GitLab token", re.compile(r"\bglpat-[A-Za-z0-9_-]{16,}")),
    ("a Slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("an API key (sk-...)", re.compile(r"\bsk-[A-Za-z0-9_-]{20,}")),
    ("a JSON Web Token", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.")),
    ("a private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY")),
    ("a URL with a password", re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@")),
)
SECRET_REFERENCE = ("a secret reaches a job by reference (an Airflow connection id or a Kubernetes Secret name), "
                    "never as an env value: the run's conf is readable to everyone who may read the generic DAG")


def env_secret_problems(env: dict[str, str]) -> list[tuple[str, str]]:
    """(`env.<KEY>`, rule) for each env entry whose key names a secret or whose value looks like one (never the value)."""
    problems = []
    for key, value in env.items():
        words = key.upper().split("_")
        if SECRET_WORDS.intersection(words) or SECRET_PAIRS.intersection(pairwise(words)):
            problems.append((f"env.{key}", f"the name {key} names a secret; {SECRET_REFERENCE}"))
            continue
        kind = next((kind for kind, pattern in SECRET_VALUES if pattern.search(str(value))), None)
        if kind is not None:
            problems.append((f"env.{key}", f"the value looks like {kind}; {SECRET_REFERENCE}"))
    return problems
