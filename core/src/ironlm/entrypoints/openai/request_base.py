"""The base of every request model: explicit ``null`` means "not given", unknown fields are
logged (once per request, as vLLM does) and kept, never silently acted on.

The OpenAI spec lets most optional request fields be ``null``; clients (and schema-driven
test tools) send it. A declared field whose value is ``null`` is dropped before validation,
so its default applies, exactly as if it were absent; a required field sent as ``null`` is
still "missing". Unknown fields pass validation (vendor extras are common) and are named in
one warning per request.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator

log = logging.getLogger("ironlm.server")


class OpenAIRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    # Fields of the OpenAI API this server knows and does not implement: a request that uses
    # them gets 400 naming the field (see ``unsupported_fields``) instead of being half-done.
    UNSUPPORTED: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _null_is_not_given(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if not (v is None and k in cls.model_fields)}
        return data

    @model_validator(mode="after")
    def _log_unknown_fields(self) -> OpenAIRequest:
        extra = sorted(self.model_extra or {})
        unknown = [k for k in extra if k not in self.UNSUPPORTED]
        if unknown:
            log.warning("The following fields were present in the request but ignored: %s",
                        unknown)
        return self

    def unsupported_fields(self) -> list[tuple[str, str]]:
        """(field, why) for each known-unsupported field the request sets (not null/false)."""
        extra = self.model_extra or {}
        return [(k, why) for k, why in self.UNSUPPORTED.items()
                if extra.get(k) not in (None, False, [], {}, "")]


class ActivationFields(BaseModel):
    """A classifier's activation switch: vLLM's ``use_activation`` and its older names
    ``activation`` and ``softmax`` (bodies written for older vLLM send them)."""

    use_activation: bool | None = None
    activation: bool | None = None
    softmax: bool | None = None

    def activation_given(self) -> tuple[str, bool] | None:
        """(the field the request set, its value): ``use_activation`` first; None if unset."""
        for name in ("use_activation", "activation", "softmax"):
            value = getattr(self, name)
            if value is not None:
                return name, value
        return None

    def applies_activation(self) -> bool:
        given = self.activation_given()
        return given is None or given[1]
