"""The case submission form, with the chosen domain pack's input fields built from its schema."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from django import forms
from pydantic import BaseModel

from planning.models import Strategy

INPUT_PREFIX = "input_"
NO_DOMAIN_LABEL = "none: plan from goal and description"
DEFAULT_MAX_DEPTH = 2
MAX_DEPTH_LIMIT = 5


def input_field_name(name: str) -> str:
    """Return the form field name of a pack input."""
    return INPUT_PREFIX + name


def _lines(value: str) -> list[str]:
    return [line.strip() for line in value.splitlines() if line.strip()]


class LinesField(forms.CharField):
    """A list of strings, entered one per line."""

    widget = forms.Textarea(attrs={"rows": 3})

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return "\n".join(str(v) for v in value)
        return value

    def to_python(self, value: Any) -> list[str]:  # type: ignore[override]
        if isinstance(value, list | tuple):
            return [str(v) for v in value]
        return _lines(super().to_python(value) or "")


class JsonField(forms.CharField):
    """Any JSON value, for schema properties that have no simpler widget."""

    widget = forms.Textarea(attrs={"rows": 3})

    def to_python(self, value: Any) -> Any:
        text = super().to_python(value)
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError:
            raise forms.ValidationError("Enter valid JSON.") from None


def _types(prop: Mapping[str, Any]) -> set[str]:
    found: set[str] = set()
    if isinstance(prop.get("type"), str):
        found.add(prop["type"])
    for option in prop.get("anyOf", ()):
        found |= _types(option)
    return found


def _bound(prop: Mapping[str, Any], key: str) -> Any:
    if key in prop:
        return prop[key]
    for option in prop.get("anyOf", ()):
        if key in option:
            return option[key]
    return None


def schema_field(name: str, prop: Mapping[str, Any], *, required: bool) -> forms.Field:
    """Return the Django form field for one property of a pack's input JSON schema."""
    label = prop.get("title") or name.replace("_", " ").capitalize()
    common: dict[str, Any] = {
        "label": label,
        "help_text": prop.get("description", ""),
        "required": required,
    }
    if "default" in prop:
        common["initial"] = prop["default"]
    types = _types(prop) - {"null"}
    if prop.get("enum"):
        choices = [(v, v) for v in prop["enum"]]
        if not required:
            choices.insert(0, ("", "—"))
        return forms.ChoiceField(choices=choices, **common)
    if types == {"boolean"}:
        common["required"] = False
        return forms.BooleanField(**common)
    if types == {"integer"}:
        return forms.IntegerField(
            min_value=_bound(prop, "minimum"), max_value=_bound(prop, "maximum"), **common
        )
    if "number" in types:
        return forms.DecimalField(
            min_value=_bound(prop, "minimum"), max_value=_bound(prop, "maximum"), **common
        )
    if types == {"array"} and _types(prop.get("items", {})) <= {"string"}:
        common["help_text"] = " ".join(filter(None, [common["help_text"], "One per line."]))
        return LinesField(**common)
    if types == {"string"}:
        field = forms.CharField(
            min_length=prop.get("minLength"), max_length=prop.get("maxLength"), **common
        )
        pattern = prop.get("pattern")
        if isinstance(pattern, str):
            # The browser checks it early; the pack's pydantic schema is still the judge.
            field.widget.attrs["pattern"] = pattern.removeprefix("^").removesuffix("$")
        return field
    return JsonField(**common)


def schema_fields(schema: type[BaseModel]) -> dict[str, forms.Field]:
    """Return the form fields (named `input_<property>`) for a pack's input schema."""
    json_schema = schema.model_json_schema()
    required = set(json_schema.get("required", ()))
    return {
        input_field_name(name): schema_field(name, prop, required=name in required)
        for name, prop in json_schema.get("properties", {}).items()
    }


class CaseForm(forms.Form):
    """Title, goal, description, strategy and depth, plus the chosen pack's inputs."""

    domain = forms.ChoiceField(label="Domain", required=False)
    title = forms.CharField(max_length=200)
    goal = forms.CharField(max_length=500, help_text="What the plan must achieve.")
    description = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 4}), help_text="Context for planning."
    )
    strategy = forms.ChoiceField(choices=Strategy.choices, initial=Strategy.STATIC)
    max_depth = forms.IntegerField(
        label="Maximum depth",
        min_value=1,
        max_value=MAX_DEPTH_LIMIT,
        initial=DEFAULT_MAX_DEPTH,
        help_text="How many levels the LLM may decompose (1 to 5).",
    )

    def __init__(
        self,
        *args: Any,
        domains: Iterable[tuple[str, str]],
        schema: type[BaseModel] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.fields["domain"].choices = [("", NO_DOMAIN_LABEL), *domains]  # type: ignore[attr-defined]
        self.input_names: list[str] = []
        if schema is not None:
            for name, field in schema_fields(schema).items():
                self.fields[name] = field
                self.input_names.append(name)

    @property
    def input_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in self.input_names]

    @property
    def case_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in ("title", "goal", "description")]

    def inputs(self) -> dict[str, Any]:
        """Return the pack inputs from cleaned data, leaving out blanks so defaults apply."""
        values: dict[str, Any] = {}
        for name in self.input_names:
            value = self.cleaned_data.get(name)
            if value is None or value == "":
                continue
            if isinstance(self.fields[name], forms.DecimalField):
                value = str(value)
            values[name.removeprefix(INPUT_PREFIX)] = value
        return values

    def add_case_errors(self, errors: Mapping[str, Iterable[str]]) -> None:
        """Attach `CaseInvalid` errors (paths like `inputs.invoice_id`) to the form's fields."""
        for path, messages in errors.items():
            head, _, rest = path.partition(".")
            target: str | None = head if head in self.fields else None
            if head == "inputs" and rest:
                name = input_field_name(rest.split(".", 1)[0])
                target = name if name in self.fields else None
            for message in messages:
                prefix = "" if target else f"{path}: "
                self.add_error(target, f"{prefix}{message}")
