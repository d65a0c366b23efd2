"""Forms of the oversight admin: a gating-policy proposal, a reason code, the reject action, and
the period of a policy what-if."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django import forms
from django.contrib.admin.helpers import ActionForm
from django.utils import timezone

from oversight.models import ReasonCode
from oversight.policy import COLD_START, RISK_CLASSES, PolicySettings, SettingsInvalid

RISK_CHOICES = [(risk, risk) for risk in RISK_CLASSES]

# One help text per setting, in the order the form shows them.
SETTING_HELP: dict[str, str] = {
    "gated_risks": "Steps whose tool has one of these risk classes always need a step gate.",
    "signature_risks": "Approving a step of these risk classes is an electronic signature.",
    "amount_threshold": "A step acting on an amount at or over this is gated.",
    "amount_quorum_threshold": "A step acting on an amount at or over this needs two approvers.",
    "amount_keys": (
        "Comma-separated words: an input whose name contains one of them holds an amount."
    ),
    "trust_threshold": "Every step of an agent trusted less than this (0 to 1) is gated.",
    "cold_start": (
        "An agent with no outcomes yet, on a step an officer approved: trusted runs it as "
        "planned; escalate asks the escalation group first."
    ),
    "llm_depth_threshold": (
        "LLM-planned steps at this depth of decomposition or deeper are gated (0: all of them)."
    ),
    "destructive_quorum": "Distinct officers who must approve a destructive step (1 to 5).",
    "approver_group": "The group that decides gates.",
    "escalation_group": "The group a gate escalates to after its deadline.",
    "gate_hours": "Hours before a gate escalates; its approvers are reminded half-way.",
    "escalation_hours": "Hours an escalated gate waits before it is held.",
    "approval_valid_hours": "Hours an approval stays valid; an older one never executes.",
}


def policy_reason_choices() -> list[tuple[str, str]]:
    """Return the active reason codes that may justify a policy change, for a select."""
    codes = ReasonCode.objects.filter(active=True).order_by("code")
    return [("", "---------")] + [
        (code.code, f"{code.code}: {code.label}")
        for code in codes
        if ReasonCode.AppliesTo.POLICY in code.applies_to
    ]


class PolicyProposalForm(forms.Form):
    """One field per policy setting, prefilled from the active version, and the reason."""

    gated_risks = forms.MultipleChoiceField(
        choices=RISK_CHOICES, required=False, widget=forms.CheckboxSelectMultiple
    )
    signature_risks = forms.MultipleChoiceField(
        choices=RISK_CHOICES, required=False, widget=forms.CheckboxSelectMultiple
    )
    amount_threshold = forms.DecimalField(min_value=Decimal(0), max_digits=20, decimal_places=2)
    amount_quorum_threshold = forms.DecimalField(
        min_value=Decimal(0), max_digits=20, decimal_places=2
    )
    amount_keys = forms.CharField(max_length=500)
    trust_threshold = forms.FloatField(min_value=0, max_value=1)
    cold_start = forms.ChoiceField(choices=[(choice, choice) for choice in COLD_START])
    llm_depth_threshold = forms.IntegerField(min_value=0, max_value=20)
    destructive_quorum = forms.IntegerField(min_value=1, max_value=5)
    approver_group = forms.CharField(max_length=150)
    escalation_group = forms.CharField(max_length=150)
    gate_hours = forms.IntegerField(min_value=1, max_value=24 * 90)
    escalation_hours = forms.IntegerField(min_value=1, max_value=24 * 90)
    approval_valid_hours = forms.IntegerField(min_value=1, max_value=24 * 90)
    reason_code = forms.ChoiceField(
        help_text="Every policy change names a reason code from the list."
    )
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}), help_text="Why, in words, for the audit trail."
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, text in SETTING_HELP.items():
            self.fields[name].help_text = text
        reason_code = self.fields["reason_code"]
        assert isinstance(reason_code, forms.ChoiceField)
        reason_code.choices = policy_reason_choices()

    @staticmethod
    def initial_from(settings: PolicySettings) -> dict[str, Any]:
        """Return the form's initial data for the settings of a version."""
        data = settings.as_data()
        data["amount_keys"] = ", ".join(settings.amount_keys)
        return data

    def clean_amount_keys(self) -> list[str]:
        keys = [key.strip().lower() for key in self.cleaned_data["amount_keys"].split(",")]
        keys = list(dict.fromkeys(key for key in keys if key))
        if not keys:
            raise forms.ValidationError("Name at least one word.")
        return keys

    def setting_values(self) -> dict[str, Any]:
        """Return the cleaned settings as PolicySettings data (call after is_valid)."""
        return {
            name: (str(value) if isinstance(value, Decimal) else value)
            for name, value in self.cleaned_data.items()
            if name in SETTING_HELP
        }

    def clean(self) -> dict[str, Any]:
        super().clean()
        if not self.errors:
            try:
                PolicySettings.from_data(self.setting_values())
            except SettingsInvalid as exc:
                for name, why in exc.problems.items():
                    self.add_error(name if name in self.fields else None, why)
        return self.cleaned_data


class ReasonCodeForm(forms.ModelForm):
    """A reason code: its kinds of decision as checkboxes; the code is fixed once added."""

    applies_to = forms.MultipleChoiceField(
        choices=ReasonCode.AppliesTo.choices,
        widget=forms.CheckboxSelectMultiple,
        help_text="Kinds of decision this code may justify.",
    )

    class Meta:
        model = ReasonCode
        fields = ["code", "label", "applies_to", "active"]
        help_texts = {
            "active": "Untick to retire the code: it stays in the records, nobody can choose it.",
        }


class PolicyActionForm(ActionForm):
    """The admin's action bar for policy versions: rejecting needs a reason code and a reason."""

    reason_code = forms.ChoiceField(required=False, label="Reason code (to reject)")
    reason = forms.CharField(required=False, label="Reason", max_length=1000)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        reason_code = self.fields["reason_code"]
        assert isinstance(reason_code, forms.ChoiceField)
        reason_code.choices = policy_reason_choices()


class WhatIfForm(forms.Form):
    """The period a policy what-if replays: from one day to another, both included."""

    start = forms.DateField(
        label="From", widget=forms.DateInput(attrs={"type": "date"}), help_text="Included."
    )
    end = forms.DateField(
        label="To", widget=forms.DateInput(attrs={"type": "date"}), help_text="Included."
    )

    @staticmethod
    def initial_for(days: int, today: date | None = None) -> dict[str, date]:
        """Return the initial period: the last `days` days up to today."""
        today = today or timezone.localdate()
        return {"start": today - timedelta(days=days), "end": today}

    def clean(self) -> dict[str, Any]:
        super().clean()
        start, end = self.cleaned_data.get("start"), self.cleaned_data.get("end")
        if start and end and end < start:
            self.add_error("end", "The period must end on or after its first day.")
        return self.cleaned_data

    def period(self) -> tuple[datetime, datetime]:
        """Return the period as [start, end) in the current time zone (call after is_valid)."""
        zone = timezone.get_current_timezone()
        start = datetime.combine(self.cleaned_data["start"], time.min, tzinfo=zone)
        end = datetime.combine(self.cleaned_data["end"] + timedelta(days=1), time.min, tzinfo=zone)
        return start, end
