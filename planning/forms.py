"""The case submission form, with the chosen domain pack's input fields built from its schema."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from django import forms
from django.core import validators
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from pydantic import BaseModel, ValidationError

from planning import rules
from planning.core.errors import flatten_errors
from planning.models import Strategy
from planning.rules import unavailable_strategies

INPUT_PREFIX = "input_"
# A hidden field naming the domain whose inputs the form carried: an unchecked box of that
# domain then means False, not "use the default" (browsers send nothing for it).
INPUTS_OF = "inputs_of"
NO_DOMAIN_LABEL = "none: plan from goal and description"
# The chosen pack's checks of case inputs (schema and data), problems by path ("inputs.x").
type InputCheck = Callable[[Mapping[str, Any]], Mapping[str, list[str]]]


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

    def prepare_value(self, value: Any) -> Any:
        if value is None or isinstance(value, str):
            return value
        return json.dumps(value, indent=2, ensure_ascii=False)

    def to_python(self, value: Any) -> Any:
        text = super().to_python(value)
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError:
            raise forms.ValidationError("Enter valid JSON.") from None


class SuggestingInput(forms.TextInput):
    """A text box with a <datalist> of values to offer: the browser suggests them as one types,
    and any other value may still be typed (the checks judge it)."""

    def __init__(self, suggestions: Mapping[str, str], attrs: dict[str, Any] | None = None):
        super().__init__(attrs)
        self.suggestions = dict(suggestions)

    def render(
        self, name: str, value: Any, attrs: dict[str, Any] | None = None, renderer: Any = None
    ) -> SafeString:
        list_id = f"{(attrs or {}).get('id') or name}-options"
        box = super().render(name, value, {**(attrs or {}), "list": list_id}, renderer)
        options = format_html_join(
            "", '<option value="{}">{}</option>', sorted(self.suggestions.items())
        )
        return format_html('{}<datalist id="{}">{}</datalist>', box, list_id, options)


def offer(field: forms.Field, suggestions: Mapping[str, str]) -> None:
    """Offer `suggestions` (value → what it is) in `field`: a text box suggests them as one
    types; a box of lines (one value per line) names them in its help text."""
    if not suggestions:
        return
    if isinstance(field, LinesField):
        known = ", ".join(sorted(suggestions))
        field.help_text = " ".join(filter(None, [str(field.help_text), f"Known: {known}."]))
    elif type(field.widget) is forms.TextInput:
        widget = SuggestingInput(suggestions, attrs=field.widget.attrs)
        widget.is_required = field.widget.is_required
        field.widget = widget


class OptionSelect(forms.Select):
    """A select whose options may be shown disabled, with the reason after their label."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.disabled_reasons: dict[str, str] = {}

    def create_option(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        option = super().create_option(*args, **kwargs)
        reason = self.disabled_reasons.get(str(option["value"]))
        if reason:
            option["attrs"]["disabled"] = True
            option["label"] = f"{option['label']} (unavailable: {reason})"
        return option


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


def _plain_limit(validator: Any) -> Any:
    """Return `validator` raising the words the actions use ("At most 10,000 characters …")."""
    limit: Any = getattr(validator, "limit_value", None)
    if isinstance(validator, validators.MaxLengthValidator):
        return _Limit(limit, lambda v: len(v) > limit, f"At most {limit:,} characters", True)
    if isinstance(validator, validators.MinLengthValidator):
        return _Limit(limit, lambda v: len(v) < limit, f"At least {limit:,} characters", True)
    if isinstance(validator, validators.MaxValueValidator):
        return _Limit(limit, lambda v: v > limit, f"At most {limit}.", False)
    if isinstance(validator, validators.MinValueValidator):
        return _Limit(limit, lambda v: v < limit, f"At least {limit}.", False)
    return validator


class _Limit:
    """A length or value bound whose message says the limit (and a text's length) in plain words."""

    def __init__(
        self, limit: Any, is_broken: Callable[[Any], bool], words: str, counts: bool
    ) -> None:
        self.limit_value = limit
        self.is_broken = is_broken
        self.words = words
        self.counts = counts

    def __call__(self, value: Any) -> None:
        if self.is_broken(value):
            message = f"{self.words} (this has {len(value):,})." if self.counts else self.words
            raise forms.ValidationError(message, code="limit")


def plain_messages(field: forms.Field, *, required: str) -> None:
    """Give `field` one wording with the server's checks: `required`, plain limits, numbers."""
    field.error_messages["required"] = required
    if isinstance(field, forms.IntegerField):
        field.error_messages["invalid"] = "Must be a whole number."
    elif isinstance(field, forms.DecimalField):
        field.error_messages["invalid"] = "Must be a number."
    field.validators = [_plain_limit(v) for v in field.validators]


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
    """Title, goal, description, strategy and depth, plus the chosen pack's inputs.

    Strategies that cannot run for the chosen domain (or without an LLM provider) are offered
    disabled, with the reason, and refused when submitted anyway.
    """

    domain = forms.ChoiceField(label="Domain", required=False, widget=OptionSelect)
    title = forms.CharField(max_length=rules.TITLE_MAX_LENGTH)
    goal = forms.CharField(
        max_length=rules.GOAL_MAX_LENGTH, help_text="What the plan must achieve."
    )
    description = forms.CharField(
        required=False,
        max_length=rules.DESCRIPTION_MAX_LENGTH,
        widget=forms.Textarea(attrs={"rows": 4}),
        help_text=f"Context for planning, up to {rules.DESCRIPTION_MAX_LENGTH:,} characters.",
    )
    strategy = forms.ChoiceField(
        choices=Strategy.choices, initial=Strategy.STATIC, widget=OptionSelect
    )
    max_depth = forms.IntegerField(
        label="Maximum depth",
        min_value=rules.MIN_DEPTH,
        max_value=rules.MAX_DEPTH_LIMIT,
        initial=rules.DEFAULT_MAX_DEPTH,
        help_text=(
            f"How many levels the plan may break the goal down into "
            f"({rules.MIN_DEPTH} to {rules.MAX_DEPTH_LIMIT})."
        ),
    )

    def __init__(
        self,
        *args: Any,
        domains: Iterable[tuple[str, str]],
        domain: str,
        schema: type[BaseModel] | None = None,
        suggestions: Mapping[str, Mapping[str, str]] | None = None,
        check_inputs: InputCheck | None = None,
        has_provider: bool,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.domain_slug = domain
        self.check_inputs = check_inputs
        self.has_provider = has_provider
        self.fields["domain"].choices = [*domains, ("", NO_DOMAIN_LABEL)]  # type: ignore[attr-defined]
        if not has_provider:
            self.fields["domain"].widget.disabled_reasons = {
                "": "needs an LLM provider, and this server has none configured"
            }
        self.unavailable = unavailable_strategies(
            has_domain=bool(domain), has_provider=has_provider
        )
        self.fields["strategy"].widget.disabled_reasons = self.unavailable
        self.input_names: list[str] = []
        self.schema = schema
        if schema is not None:
            offered = suggestions or {}
            for name, field in schema_fields(schema).items():
                plain_messages(field, required=f"{field.label} is required.")
                offer(field, offered.get(name.removeprefix(INPUT_PREFIX), {}))
                self.fields[name] = field
                self.input_names.append(name)
        else:
            self.fields["inputs"] = JsonField(
                label="Inputs (JSON object)",
                required=False,
                help_text='Optional facts for the planner, e.g. {"service": "payments"}.',
            )
        for name in ("title", "goal", "description", "max_depth"):
            plain_messages(self.fields[name], required=f"A {name} is required.")
        # No `maxlength` on the box: a browser would cut a longer paste short without a word.
        # The count beside it says how far the text is from the limit instead.
        description = self.fields["description"].widget.attrs
        description["data-limit"] = description.pop("maxlength")
        if not self.is_bound:
            self.initial.setdefault("domain", domain)
            strategy = self.initial.get("strategy") or self.fields["strategy"].initial
            if strategy in self.unavailable or strategy not in Strategy.values:
                strategy = next((s for s in Strategy.values if s not in self.unavailable), "")
            self.initial["strategy"] = strategy

    @property
    def input_fields(self) -> list[forms.BoundField]:
        if not self.input_names:
            return [self["inputs"]]
        return [self[name] for name in self.input_names]

    @property
    def case_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in ("title", "goal", "description")]

    @property
    def unavailable_notes(self) -> list[tuple[str, str, str]]:
        """Return (value, label, reason) of each strategy that cannot run here."""
        return [(s, Strategy(s).label, reason) for s, reason in self.unavailable.items()]

    def clean_inputs(self) -> Any:
        value = self.cleaned_data.get("inputs")
        if value is not None and not isinstance(value, dict):
            raise forms.ValidationError('Enter a JSON object, like {"key": "value"}.')
        return value

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        strategy = data.get("strategy")
        if strategy in self.unavailable:
            label = Strategy(strategy).label
            self.add_error("strategy", f"{label} {self.unavailable[strategy]}: choose another.")
        self._check_schema()
        return data

    def _check_schema(self) -> None:
        # The pack's checks — its schema's (an identifier's shape) and, given `check_inputs`,
        # its data's (an invoice the ERP does not hold) — in the same round as the form's, on
        # the inputs the form accepted, so one round shows every invalid field.
        if self.schema is None:
            return
        values = self.inputs()
        if self.check_inputs is not None:
            problems = self.check_inputs(values)
        else:
            try:
                self.schema.model_validate(values)
            except ValidationError as exc:
                problems = flatten_errors(exc.errors(), "inputs")
            else:
                problems = {}
        # Only the inputs that were given: a missing one already has the form's error.
        given = {
            path: messages
            for path, messages in problems.items()
            if path.partition(".")[2].partition(".")[0] in values
        }
        self.add_case_errors(given)

    def inputs(self) -> dict[str, Any]:
        """Return the inputs from cleaned data, leaving out blank pack inputs so defaults apply."""
        if not self.input_names:
            return dict(self.cleaned_data.get("inputs") or {})
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
            if head == "inputs" and rest and self.input_names:
                name = input_field_name(rest.split(".", 1)[0])
                target = name if name in self.fields else None
            # Domain-less inputs have one JSON field: name the path inside it.
            named = target is not None and not (target == "inputs" and rest)
            for message in messages:
                self.add_error(target, message if named else f"{path}: {message}")
