"""Oversight models: role capabilities, reason codes, gating policy, gates and their decisions,
notifications and the LLM budget ledger."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone


class Capability(models.Model):
    """Anchor for the role permissions that belong to no single model; it has no table."""

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("submit_case", "Can submit cases and follow their own cases"),
            ("view_all_cases", "Can read every case and plan"),
            ("decide_gate", "Can approve or reject gates"),
            ("edit_plan", "Can edit plan steps"),
            ("view_audit", "Can read the audit trail of any case"),
            ("export_audit", "Can export and verify audit bundles"),
            ("configure", "Can configure agents, tools, gating policy and packs"),
        ]

    def __str__(self) -> str:
        return "capability"


# Oversight: reason codes, gating policy, gates and their decisions, notifications ------------


class ReasonCode(models.Model):
    """One entry of the controlled list of reasons a decision, edit or change must give (R6)."""

    class AppliesTo(models.TextChoices):
        REJECT = "reject"
        EDIT = "edit"
        CANCEL = "cancel"
        RERUN = "rerun"
        POLICY = "policy"

    code = models.SlugField(max_length=50, unique=True)
    label = models.CharField(max_length=200)
    applies_to = models.JSONField(
        default=list, help_text="Kinds of decision this code may justify."
    )
    active = models.BooleanField(default=True)

    class Meta:
        ordering = ["code"]

    def __str__(self) -> str:
        return self.code


class PolicyVersion(models.Model):
    """One audited version of the gating policy's settings (thresholds, groups, expiry).

    Exactly one version is active. A proposal that makes gating less strict stays pending until
    a second admin approves it; a stricter one takes effect at once.
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        ACTIVE = "active"
        SUPERSEDED = "superseded"
        REJECTED = "rejected"

    number = models.PositiveIntegerField(unique=True)
    values = models.JSONField(help_text="oversight.policy.PolicySettings as data.")
    status = models.CharField(max_length=12, choices=Status.choices)
    proposed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    reason_code = models.CharField(max_length=50, blank=True)
    reason = models.TextField(blank=True)
    loosens = models.BooleanField(default=False, help_text="Makes gating less strict.")
    created_at = models.DateTimeField(auto_now_add=True)
    activated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-number"]
        constraints = [
            models.UniqueConstraint(
                fields=["status"], condition=Q(status="active"), name="policy_one_active_version"
            ),
        ]

    def __str__(self) -> str:
        return f"policy v{self.number} ({self.status})"


class PolicyWhatIf(models.Model):
    """A what-if report: the plan versions of a period replayed under a proposed policy version
    beside the policy that was active when it was asked for. Nothing else is written by it.

    `summary` holds the totals (oversight.whatif.WhatIfTally.summary); `cases` the cases with a
    change, the most changed first, bounded (oversight.whatif.CASE_ROWS).
    """

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    policy_version = models.ForeignKey(
        PolicyVersion, on_delete=models.PROTECT, related_name="whatifs"
    )
    base_version = models.ForeignKey(
        PolicyVersion,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The active version it is compared with (none: the safe defaults).",
    )
    base_values = models.JSONField(help_text="The compared active settings, as they were.")
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.QUEUED)
    done = models.PositiveIntegerField(default=0, help_text="Plan versions replayed so far.")
    total = models.PositiveIntegerField(default=0, help_text="Plan versions in the period.")
    summary = models.JSONField(default=dict, blank=True)
    cases = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["policy_version", "-created_at"])]

    def __str__(self) -> str:
        return f"what-if {self.pk} of policy v{self.policy_version_id}"

    @property
    def is_finished(self) -> bool:
        return self.status in (self.Status.DONE, self.Status.FAILED)

    @property
    def is_waiting_long(self) -> bool:
        """Tell whether the report has been queued for over two minutes (no worker took it)."""
        return self.status == self.Status.QUEUED and (
            timezone.now() - self.created_at > timedelta(minutes=2)
        )

    @property
    def percent(self) -> int:
        if self.status == self.Status.DONE:
            return 100
        return int(100 * self.done / self.total) if self.total else 0


class GateKind(models.TextChoices):
    PLAN = "plan"
    STEP = "step"
    ESCALATION = "escalation"


class GateStatus(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    VOID = "void"


class GateRisk(models.TextChoices):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"


# A gate in one of these states can still be decided (an expired gate is held, not closed).
OPEN_GATE_STATUSES = (GateStatus.PENDING, GateStatus.EXPIRED)


class Gate(models.Model):
    """Where people must approve before work goes on: a plan version, a step, an escalation."""

    case = models.ForeignKey("planning.Case", on_delete=models.PROTECT, related_name="gates")
    version = models.ForeignKey(
        "planning.PlanVersion", on_delete=models.PROTECT, related_name="gates"
    )
    node = models.ForeignKey(
        "planning.PlanNode", null=True, blank=True, on_delete=models.PROTECT, related_name="gates"
    )
    kind = models.CharField(max_length=12, choices=GateKind.choices)
    status = models.CharField(max_length=10, choices=GateStatus.choices, default=GateStatus.PENDING)
    reason = models.TextField(help_text="Why this is gated, in words.")
    reasons = models.JSONField(default=list, help_text="Each classifier's finding.")
    risk = models.CharField(max_length=8, choices=GateRisk.choices, default=GateRisk.LOW)
    approver_group = models.ForeignKey("auth.Group", on_delete=models.PROTECT, related_name="gates")
    escalation_group = models.ForeignKey(
        "auth.Group", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    quorum = models.PositiveSmallIntegerField(default=1)
    approvals = models.PositiveSmallIntegerField(default=0)
    needs_signature = models.BooleanField(default=False)
    content_hash = models.CharField(
        max_length=64, help_text="The version's or the node's content hash the gate binds to."
    )
    policy_version = models.ForeignKey(
        PolicyVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    opened_at = models.DateTimeField()
    remind_at = models.DateTimeField(help_text="When the approver group is reminded.")
    deadline = models.DateTimeField()
    reminded_at = models.DateTimeField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True)
    held_at = models.DateTimeField(null=True, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    approval_expires_at = models.DateTimeField(
        null=True, blank=True, help_text="An approval older than this never executes."
    )
    carried_from = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The approved gate of an unchanged step in the version this one was edited from.",
    )

    class Meta:
        ordering = ["deadline", "id"]
        constraints = [
            # One live plan gate per version; an approval that expired is replaced by a new gate.
            models.UniqueConstraint(
                fields=["version"],
                condition=Q(kind="plan", status__in=["pending", "approved"]),
                name="gate_one_live_plan_gate_per_version",
            ),
            # One live step gate per step; an approval that expired is replaced by a new gate.
            models.UniqueConstraint(
                fields=["node"],
                condition=Q(kind="step", status__in=["pending", "approved"]),
                name="gate_one_live_step_gate_per_node",
            ),
            models.CheckConstraint(
                condition=Q(kind="plan", node__isnull=True) | ~Q(kind="plan"),
                name="gate_plan_gate_has_no_node",
            ),
            models.CheckConstraint(condition=Q(quorum__gte=1), name="gate_quorum_at_least_1"),
        ]
        indexes = [
            models.Index(fields=["status", "deadline"]),
            models.Index(fields=["approver_group", "status", "deadline"]),
            models.Index(fields=["case", "status"]),
        ]

    def __str__(self) -> str:
        return f"{self.kind} gate {self.pk}"

    @property
    def is_open(self) -> bool:
        return self.status in OPEN_GATE_STATUSES


class GateDecision(models.Model):
    """One officer's approval or rejection of a gate, bound to what they saw (R3)."""

    class Decision(models.TextChoices):
        APPROVE = "approve"
        REJECT = "reject"

    gate = models.ForeignKey(Gate, on_delete=models.PROTECT, related_name="decisions")
    decider = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    full_name = models.CharField(max_length=300)
    decision = models.CharField(max_length=8, choices=Decision.choices)
    reason_code = models.CharField(max_length=50, blank=True)
    reason = models.TextField(blank=True)
    version_number = models.PositiveIntegerField()
    content_hash = models.CharField(max_length=64)
    time = models.DateTimeField()
    # Text, not a short field: a step's meaning names the outputs it acts on.
    signature_meaning = models.TextField(
        blank=True, help_text="Set when the decision was an electronic signature."
    )
    signature_hash = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["time", "id"]
        constraints = [
            models.UniqueConstraint(fields=["gate", "decider"], name="gate_decision_once_per_user"),
        ]

    def __str__(self) -> str:
        return f"{self.decision} of gate {self.gate_id} by {self.decider_id}"

    @property
    def is_signed(self) -> bool:
        return bool(self.signature_meaning)


class Notification(models.Model):
    """An in-app notice to one user: a gate opened for their group, their case was decided."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notifications"
    )
    case = models.ForeignKey(
        "planning.Case", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    gate = models.ForeignKey(
        Gate, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    gate_ids = models.JSONField(
        default=list,
        blank=True,
        help_text="Every gate the notice says waits (it links the first): read once all closed.",
    )
    kind = models.CharField(max_length=50)
    message = models.TextField()
    url = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    read_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["user", "read_at", "-created_at"])]

    def __str__(self) -> str:
        return f"{self.kind} for {self.user_id}"
