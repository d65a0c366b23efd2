"""Oversight models: the audit trail, role capabilities and worker heartbeats."""

from __future__ import annotations

from django.conf import settings
from django.db import models


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


class ActorKind(models.TextChoices):
    USER = "user"
    AGENT = "agent"
    SYSTEM = "system"
    ANONYMOUS = "anonymous"


class AuditChainHead(models.Model):
    """The last sequence number and hash of one audit chain; locked to serialise appends."""

    chain = models.CharField(max_length=64, primary_key=True)
    seq = models.PositiveBigIntegerField(default=0)
    head_hash = models.CharField(max_length=64)

    def __str__(self) -> str:
        return f"{self.chain}@{self.seq}"


class AuditEvent(models.Model):
    """One append-only, hash-chained event. Written only through oversight.audit.append_event."""

    chain = models.CharField(max_length=64)
    seq = models.PositiveBigIntegerField()
    time = models.DateTimeField()
    actor_kind = models.CharField(max_length=16, choices=ActorKind.choices)
    actor_label = models.CharField(max_length=150)
    actor_user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
    )
    action = models.CharField(max_length=100)
    data = models.JSONField(default=dict)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64, unique=True)

    class Meta:
        ordering = ["chain", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["chain", "seq"], name="audit_event_chain_seq_unique"),
        ]
        indexes = [
            models.Index(fields=["action"]),
            models.Index(fields=["-time"]),
        ]

    def __str__(self) -> str:
        return f"{self.chain}#{self.seq} {self.action}"


class WorkerHeartbeat(models.Model):
    """The last time each Celery worker reported itself alive."""

    hostname = models.CharField(max_length=255, unique=True)
    pid = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    last_seen = models.DateTimeField()

    def __str__(self) -> str:
        return self.hostname
