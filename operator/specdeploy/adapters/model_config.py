"""Reads a model's config.json over HTTP, for models neither the spec nor the catalog describes.

The URL comes from a template in the operator config (`modelConfigUrl`), e.g.
`https://models.example/{model}/resolve/{revision}/config.json`; a hub token, when the spec names
one, is sent as a bearer token.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from specdeploy.api.models import ModelShape
from specdeploy.plan.placement.model_catalog import shape_from_config

DEFAULT_TIMEOUT_SECONDS = 10.0


class ModelConfigUnavailableError(Exception):
    """config.json could not be read or parsed; the message says which model and why."""


def config_url(template: str, model: str, revision: str | None) -> str:
    """Fills the URL template with the model id (its `/` kept) and the revision (default main)."""
    return template.format(
        model=urllib.parse.quote(model, safe="/"),
        revision=urllib.parse.quote(revision or "main", safe=""),
    )


def fetch_model_config(
    template: str,
    model: str,
    revision: str | None = None,
    token: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """The parsed config.json of `model` at `revision`; raises ModelConfigUnavailableError."""
    url = config_url(template, model, revision)
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as error:
        raise ModelConfigUnavailableError(f"{model}: GET {url} answered {error.code}") from error
    except (urllib.error.URLError, TimeoutError, OSError) as error:
        raise ModelConfigUnavailableError(f"{model}: GET {url} failed: {error}") from error
    try:
        parsed = json.loads(body)
    except ValueError as error:
        raise ModelConfigUnavailableError(f"{model}: {url} is not JSON") from error
    if not isinstance(parsed, dict):
        raise ModelConfigUnavailableError(f"{model}: {url} is not a JSON object")
    return parsed


def fetch_model_shape(
    template: str,
    model: str,
    revision: str | None = None,
    token: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> ModelShape:
    """The sizing shape of `model`, from its config.json; raises ModelConfigUnavailableError."""
    config = fetch_model_config(template, model, revision, token, timeout)
    try:
        return shape_from_config(config)
    except ValueError as error:
        raise ModelConfigUnavailableError(f"{model}: {error}") from error


class ModelShapes:
    """Shapes of models read from their config.json, each read once and kept.

    A model whose config.json could not be read is not asked again for `retry_seconds`, so a
    model the hub does not know does not slow every reconcile down. Safe across threads for
    the reconcile's purposes (at worst a model is read twice).
    """

    def __init__(self, url_template: str, retry_seconds: float = 300.0) -> None:
        self.url_template = url_template
        self.retry_seconds = retry_seconds
        self._shapes: dict[tuple[str, str | None], ModelShape] = {}
        self._retry_at: dict[tuple[str, str | None], float] = {}

    def shapes(
        self, models: Mapping[str, str | None], token: str | None
    ) -> tuple[dict[str, ModelShape], list[str]]:
        """(the shapes of `models` (model -> revision) known now, the reasons for the others)."""
        found: dict[str, ModelShape] = {}
        problems: list[str] = []
        for model, revision in models.items():
            key = (model, revision)
            if key not in self._shapes:
                if time.monotonic() < self._retry_at.get(key, 0.0):
                    continue
                try:
                    self._shapes[key] = fetch_model_shape(self.url_template, model, revision, token)
                except ModelConfigUnavailableError as error:
                    problems.append(str(error))
                    self._retry_at[key] = time.monotonic() + self.retry_seconds
                    continue
            found[model] = self._shapes[key]
        return found, problems
