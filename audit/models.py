"""The audit trail's rows: one chain head per chain and the append-only, hash-chained events.

The tables keep the names they had in the oversight app (`oversight_auditevent`, with its
append-only triggers, and `oversight_auditchainhead`).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class ActorKind(models.TextChoices):
    USER = "user"
    AGENT = "agent"
    SYSTEM = "system"
    ANONYMOUS = "anonymous"


class AuditChainHead(models.Model):
    """The last sequence number and hash of one audit chain; locked to serialise appends.

    `prev_hash` is the hash the last event follows (its own `prev_hash`): one append's UPDATE
    moves `head_hash` into it, so the statement returns the old hash without a locking read
    before it. Empty for a chain with no event yet.
    """

    chain = models.CharField(max_length=64, primary_key=True)
    seq = models.PositiveBigIntegerField(default=0)
    head_hash = models.CharField(max_length=64)
    prev_hash = models.CharField(max_length=64, db_default="", blank=True)

    class Meta:
        db_table = "oversight_auditchainhead"

    def __str__(self) -> str:
        return f"{self.chain}@{self.seq}"


class AuditEvent(models.Model):
    """One append-only, hash-chained event. Written only through audit.chain.append_event."""

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
    # Not indexed: no read looks an event up by its hash, and (chain, seq) identifies it. A unique
    # index on a SHA-256 value is a random-key B-tree insert (two, with its LIKE index) on every
    # append, which grew with the table; the chain is verified by recomputing the hashes.
    hash = models.CharField(max_length=64)

    class Meta:
        db_table = "oversight_auditevent"
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
