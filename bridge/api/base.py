"""Shared pydantic base for wire objects: camelCase on the wire, unknown fields rejected, lossless dump."""

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class WireModel(BaseModel):
    """A Kubernetes-style object fragment.

    ``extra="forbid"`` is what makes a typo (``numNode``) an error instead of a silently ignored field.
    Input is read as the Kubernetes API server reads it: by the camelCase wire name only (``num_nodes`` is an
    unknown field, not an alias) and with strict types — ``numNodes: "2"`` or ``numNodes: true`` is an error,
    not 2 or 1, and a boolean is never a number.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_alias=True,
        validate_by_name=False,
        strict=True,
        extra="forbid",
        validate_assignment=False,
        frozen=False,
        str_strip_whitespace=False,
        # completed all at once by bridge.api.schema_cache, from its cache when one matches
        defer_build=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """The object as it travels: camelCase keys, only the fields that were set (lossless round-trip)."""
        return self.model_dump(by_alias=True, exclude_unset=True, mode="json")
