"""Execution's models: leaf attempts (claims), work items for human leaves, agents' trust
scores, the global stop switch and the workers' heartbeats.

They moved here from oversight and keep their tables (`oversight_*`).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone


class WorkerHeartbeat(models.Model):
    """The last time each Celery worker reported itself alive."""

    hostname = models.CharField(max_length=255, unique=True)
    pid = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    last_seen = models.DateTimeField()

    class Meta:
        db_table = "oversight_workerheartbeat"

    def __str__(self) -> str:
        return self.hostname


class LeafAttempt(models.Model):
    """One claim of a leaf by a worker: the attempt number is the worker's fencing token."""

    class Outcome(models.TextChoices):
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        LOST = "lost", "lost (worker gone, lease expired)"
        STALE = "stale", "stale (result refused)"
        CANCELLED = "cancelled"

    node = models.ForeignKey("planning.PlanNode", on_delete=models.PROTECT, related_name="runs")
    number = models.PositiveIntegerField()
    worker = models.CharField(max_length=255, blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=10, choices=Outcome.choices, default=Outcome.RUNNING)
    error_class = models.CharField(max_length=20, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        db_table = "oversight_leafattempt"
        ordering = ["node", "number"]
        constraints = [
            models.UniqueConstraint(fields=["node", "number"], name="leaf_attempt_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.node_id} attempt {self.number}"


class WorkItem(models.Model):
    """A human leaf waiting for a person of the assignee group to complete it in a form."""

    class Status(models.TextChoices):
        OPEN = "open"
        COMPLETED = "completed"
        CANCELLED = "cancelled"

    case = models.ForeignKey("planning.Case", on_delete=models.PROTECT, related_name="work_items")
    node = models.ForeignKey(
        "planning.PlanNode", on_delete=models.PROTECT, related_name="work_items"
    )
    attempt = models.PositiveIntegerField(help_text="The leaf attempt this item belongs to.")
    group = models.ForeignKey("auth.Group", on_delete=models.PROTECT, related_name="work_items")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.OPEN)
    created_at = models.DateTimeField()
    deadline = models.DateTimeField()
    remind_at = models.DateTimeField(
        null=True, blank=True, help_text="When the group is reminded (half-way to the deadline)."
    )
    reminded_at = models.DateTimeField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True)
    escalation_group = models.ForeignKey(
        "auth.Group",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Once the item is escalated, its members may complete it too.",
    )
    completed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
    )
    completed_at = models.DateTimeField(null=True, blank=True)
    output = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "oversight_workitem"
        ordering = ["deadline", "id"]
        indexes = [
            models.Index(fields=["status", "group", "deadline"]),
            models.Index(fields=["status", "deadline"]),
            models.Index(fields=["status", "remind_at"]),
        ]
        constraints = [
            models.UniqueConstraint(fields=["node", "attempt"], name="work_item_per_attempt"),
        ]

    def __str__(self) -> str:
        return f"work item {self.pk} ({self.status})"

    @property
    def is_overdue(self) -> bool:
        """Tell whether the item is still open past its deadline (an escalated one is)."""
        if self.status != self.Status.OPEN:
            return False
        return self.escalated_at is not None or self.deadline <= timezone.now()


class TrustScore(models.Model):
    """An agent's Beta-prior trust for one capability, from decayed outcome counts."""

    agent = models.ForeignKey("planning.Agent", on_delete=models.CASCADE, related_name="scores")
    capability = models.CharField(max_length=100)
    successes = models.FloatField(default=0.0)
    failures = models.FloatField(default=0.0)
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "oversight_trustscore"
        ordering = ["agent", "capability"]
        constraints = [
            models.UniqueConstraint(fields=["agent", "capability"], name="trust_per_capability"),
        ]

    def __str__(self) -> str:
        return f"{self.agent_id} {self.capability}"


class ExecutionControl(models.Model):
    """The global stop switch: one row; while stopped nothing new is claimed on any case."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    stopped = models.BooleanField(default=False)
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    changed_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True)

    class Meta:
        db_table = "oversight_executioncontrol"
        constraints = [models.CheckConstraint(condition=Q(id=1), name="one_execution_control")]

    def __str__(self) -> str:
        return "stopped" if self.stopped else "running"
