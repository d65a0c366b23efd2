"""What the packs' pydantic models share: strict models, and identifiers whose errors read in
the user's words ("An invoice number looks like INV-1042.") instead of a regular expression.

The case form, the API and the actions all validate through these models, so they all show
the same words; the pattern itself stays in the JSON schema for the browser and the API docs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema


class PackModel(BaseModel):
    """A frozen model that refuses fields it does not declare."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True, slots=True)
class Identifier:
    """`Annotated[str, Identifier(...)]`: a string matching `pattern`, or "<noun> looks like
    <example>."."""

    pattern: str
    noun: str
    example: str

    @property
    def message(self) -> str:
        """Return the error a value of the wrong shape gets."""
        return f"{self.noun} looks like {self.example}."

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        compiled = re.compile(self.pattern)
        message = self.message

        def check(value: str) -> str:
            if compiled.search(value) is None:
                raise PydanticCustomError("identifier_shape", message)
            return value

        return core_schema.no_info_after_validator_function(check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        json_schema.update(pattern=self.pattern, examples=[self.example])
        return json_schema
