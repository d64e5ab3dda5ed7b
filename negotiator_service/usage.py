"""Token usage in Prometheus: `negotiator_tokens_total{adapter,model,kind}`.

Counted by the broker for every reply an adapter returned with usage (also
one whose output then failed validation: the tokens were spent). The model
label is the call's model only when the adapter's declaration names it (its
default model or an entry of `models`), else `other`, so a caller choosing
model names cannot grow the label set without bound.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter

from agentsidecar.negotiator_service.model import Declaration, Usage
from agentsidecar.sidecar_runtime.metrics import METRICS

OTHER_MODEL = "other"

TOKENS = Counter(
    "negotiator_tokens",
    "Tokens the upstream reported, by adapter, model and kind (prompt, completion, reasoning, cached).",
    ["adapter", "model", "kind"],
    registry=METRICS.registry,
)


def model_label(declaration: Declaration | None, model: str | None) -> str:
    """The `model` label of a call with `options.model` = `model`."""
    if declaration is None:
        return OTHER_MODEL
    selected = declaration.selected_model(model)
    if selected and (selected == declaration.default_model or selected in declaration.models):
        return selected
    return OTHER_MODEL


# The counter's child per label set, looked up once: labels() checks and locks on every call.
# Bounded as the label set is (adapters, their declared models and `other`, four kinds).
_CHILDREN: dict[tuple[str, str, str], Any] = {}


def count_tokens(adapter: str, model: str, usage: Usage) -> None:
    for kind, tokens in usage.counts():
        if tokens:
            key = (adapter, model, kind)
            child = _CHILDREN.get(key)
            if child is None:
                child = _CHILDREN[key] = TOKENS.labels(adapter, model, kind)
            child.inc(tokens)
