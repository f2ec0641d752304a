"""Shared pydantic base for wire objects: camelCase on the wire, unknown fields rejected, lossless dump."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class WireModel(BaseModel):
    """A Kubernetes-style object fragment.

    ``extra="forbid"`` is what makes a typo (``numNode``) an error instead of a silently ignored field;
    ``populate_by_name`` lets Python code build objects with snake_case names.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=False,
        frozen=False,
        str_strip_whitespace=False,
    )

    def to_wire(self) -> dict[str, Any]:
        """The object as it travels: camelCase keys, only the fields that were set (lossless round-trip)."""
        return self.model_dump(by_alias=True, exclude_unset=True, mode="json")


class OpenModel(WireModel):
    """A fragment whose own fields are checked but which keeps unknown keys verbatim.

    Used only for objects we pass through without interpreting (e.g. Kubernetes types nested in a pod
    template that a newer cluster may extend).
    """

    model_config = ConfigDict(extra="allow")
