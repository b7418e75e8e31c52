"""This project's webhooks as shipped and as registered, and the mode each namespace gets from them.

A namespace's mode is what the API server does, read off the registrations' namespaceSelectors: the
configured enforcement where a base registration selects it, `warn` where its `/warn/` copy does (SPEC.md
§4.10), and none where neither does (the webhooks skip it: kube-system, the webhook's own namespace, a
namespace labelled `hami.io/webhook: ignore`). Reading the live registrations keeps a chart's renamed
namespace or an operator's edited selector true; the shipped ones stand in where none is readable.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from ..admission import configurations
from ..admission.review import WARN_PREFIX, warned
from ..rules.config import Config
from ..rules.selectors import selector_matches
from .objects import Obj, mapping, metadata, name_of, sequence

__all__ = ["registered", "shipped_webhooks"]

#: The label the API server sets on every namespace with its name; selectors of ours match on it.
NAME_LABEL = "kubernetes.io/metadata.name"


def webhooks_of(configs: Iterable[Obj]) -> list[tuple[str, Obj, Obj]]:
    """(kind, configuration, webhook) of every webhook of `configs`."""
    return [(str(doc.get("kind") or ""), doc, hook) for doc in configs
            for hook in sequence(doc.get("webhooks")) if isinstance(hook, dict)]


@functools.cache
def shipped_webhooks() -> tuple[tuple[str, str, Obj], ...]:
    """(kind, configuration name, webhook) of every webhook this project ships (read, never changed)."""
    return tuple((doc["kind"], doc["metadata"]["name"], hook)
                 for doc in configurations.webhook_configurations() for hook in doc.get("webhooks", []))


def registered(webhooks: Iterable[tuple[str, Obj, Obj]]) -> dict[str, tuple[str, Obj, Obj]]:
    """This project's webhooks among (kind, configuration, webhook) triples, by webhook name (the
    configurations may be renamed)."""
    shipped = {hook["name"] for _, _, hook in shipped_webhooks()}
    return {str(hook.get("name")): (kind, doc, hook) for kind, doc, hook in webhooks
            if hook.get("name") in shipped}


def handler_of(hook: Mapping[str, Any]) -> str:
    """The handler a registration calls (`mutate-pods`, `warn/mutate-pods`): its Service's path or URL's."""
    client = mapping(hook.get("clientConfig"))
    url = client.get("url")
    path = urlsplit(url).path if isinstance(url, str) and url else mapping(client.get("service")).get("path")
    return str(path or "").lstrip("/")


class Modes:
    """The settings each namespace is judged with, per handler, as the registrations route its requests."""

    def __init__(self, hooks: Iterable[Mapping[str, Any]], config: Config) -> None:
        self.config = config
        self._selectors: dict[str, list[tuple[Any, Config]]] = {}
        for hook in hooks:
            handler = handler_of(hook)
            base = handler.removeprefix(WARN_PREFIX)
            chosen = warned(config) if handler != base else config
            self._selectors.setdefault(base, []).append((hook.get("namespaceSelector"), chosen))

    @classmethod
    def of(cls, configs: Iterable[Obj], config: Config) -> Modes:
        """From the configurations read (ours among them), else from the shipped ones."""
        ours = registered(webhooks_of(configs))
        hooks = [hook for _, _, hook in ours.values()] or [hook for _, _, hook in shipped_webhooks()]
        return cls(hooks, config)

    def mode(self, namespace: Mapping[str, Any] | str, handler: str) -> Config | None:
        """The settings `handler` answers `namespace`'s requests with (a Namespace object, or a name with no
        labels); None where no registration of it selects the namespace."""
        if isinstance(namespace, str):
            name, labels = namespace, {}
        else:
            name, labels = name_of(namespace), dict(mapping(metadata(namespace).get("labels")))
        labels.setdefault(NAME_LABEL, name)
        return next((chosen for selector, chosen in self._selectors.get(handler, ())
                     if selector_matches(selector, labels)), None)
