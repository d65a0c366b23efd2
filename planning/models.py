"""Planning models: cases, immutable plan versions and their nodes, agents, tools, packs,
LLM call records, the decomposition cache, and the invoice pack's demo ERP data."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone


class Strategy(models.TextChoices):
    STATIC = "static", "Static methods"
    FORWARD = "forward", "Forward reasoning (SHOP-style)"
    GOAL = "goal", "Goal-oriented search (A*)"
    LLM = "llm", "Recursive LLM decomposition"
    HYBRID = "hybrid", "Hybrid: static first, LLM fallback"


PACK_STRATEGIES = {Strategy.STATIC, Strategy.FORWARD, Strategy.GOAL}
LLM_STRATEGIES = {Strategy.LLM, Strategy.HYBRID}


class CaseStatus(models.TextChoices):
    PLANNING = "planning"
    PLAN_FAILED = "plan_failed"
    AWAITING_APPROVAL = "awaiting_approval"
    APPROVED = "approved"
    EXECUTING = "executing"
    # Every leaf ended and the rules hold: the LLM goal judge decides, outside any transaction.
    VERIFYING = "verifying"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REJECTED = "rejected"


# While a case is in one of these states its page keeps refreshing itself: every status that is
# not an end, where a worker or another person (an officer deciding its plan) moves it on.
LIVE_STATUSES = {
    CaseStatus.PLANNING,
    CaseStatus.AWAITING_APPROVAL,
    CaseStatus.APPROVED,
    CaseStatus.EXECUTING,
    CaseStatus.VERIFYING,
}


class DomainPack(models.Model):
    """A domain method pack registered in code (planning/packs); admins may disable it."""

    slug = models.SlugField(unique=True)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    enabled = models.BooleanField(default=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Tool(models.Model):
    """A tool registered in code; its risk class is editable by admins."""

    class Risk(models.TextChoices):
        READ = "read"
        WRITE = "write"
        FINANCIAL = "financial"
        EXTERNAL = "external"
        DESTRUCTIVE = "destructive"

    name = models.CharField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    pack = models.ForeignKey(DomainPack, null=True, blank=True, on_delete=models.PROTECT)
    risk = models.CharField(max_length=16, choices=Risk.choices)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Agent(models.Model):
    """An agent plans may assign leaves to, configured by admins."""

    class Kind(models.TextChoices):
        TOOL = "tool", "Tool (a registered Python callable)"
        LLM = "llm", "LLM (an OpenAI-compatible chat model)"
        HUMAN = "human", "Human (a work item for a user group)"

    slug = models.SlugField(max_length=100, unique=True)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    capabilities = models.JSONField(default=list, blank=True)
    tools = models.JSONField(default=list, blank=True, help_text="Tool names this agent may call.")
    trust = models.FloatField(default=0.5)
    model = models.CharField(max_length=200, blank=True, help_text="Overrides CASEHUB_LLM_MODEL.")
    system_prompt = models.TextField(blank=True)
    enabled = models.BooleanField(default=True)
    pack = models.ForeignKey(DomainPack, null=True, blank=True, on_delete=models.PROTECT)

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.CheckConstraint(
                condition=Q(trust__gte=0) & Q(trust__lte=1), name="agent_trust_between_0_and_1"
            ),
        ]

    def __str__(self) -> str:
        return self.slug


class Case(models.Model):
    """A goal submitted by an analyst, planned into a DAG and reviewed before it runs."""

    title = models.CharField(max_length=200)
    goal = models.CharField(max_length=500)
    description = models.TextField(blank=True)
    inputs = models.JSONField(default=dict, blank=True)
    domain = models.CharField(max_length=50, blank=True, help_text="Domain pack slug, if any.")
    strategy = models.CharField(max_length=10, choices=Strategy.choices)
    max_depth = models.PositiveSmallIntegerField(default=2)
    submitter = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="cases"
    )
    status = models.CharField(
        max_length=20, choices=CaseStatus.choices, default=CaseStatus.PLANNING
    )
    error = models.TextField(blank=True)
    planning_attempts = models.PositiveSmallIntegerField(
        default=0, help_text="How many planning runs have started for this case."
    )
    planning_lease_until = models.DateTimeField(
        null=True, blank=True, help_text="Until when the running planning attempt holds the case."
    )
    current_version = models.ForeignKey(
        "PlanVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    verification = models.JSONField(
        default=dict,
        blank=True,
        help_text="Goal-level verification once every leaf ended: passed, reasons.",
    )
    judge_lease_until = models.DateTimeField(
        null=True,
        blank=True,
        help_text="While verifying: until when the delivery asking the goal judge holds the case.",
    )
    finished_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["status", "-created_at"]),
            models.Index(fields=["submitter", "-created_at"]),
            models.Index(fields=["domain", "-created_at"]),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(max_depth__gte=1) & Q(max_depth__lte=5), name="case_max_depth_1_to_5"
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.title}"

    @property
    def is_live(self) -> bool:
        return self.status in LIVE_STATUSES


class PlanVersion(models.Model):
    """An immutable snapshot of a materialised plan: its tree and DAG as PlanNode rows."""

    case = models.ForeignKey(Case, on_delete=models.PROTECT, related_name="versions")
    number = models.PositiveIntegerField()
    strategy = models.CharField(max_length=10, choices=Strategy.choices)
    content_hash = models.CharField(max_length=64)
    warnings = models.JSONField(default=list, blank=True)
    llm_calls = models.PositiveIntegerField(default=0)
    leaf_count = models.PositiveIntegerField(default=0)
    critical_path = models.PositiveIntegerField(default=0)
    width = models.PositiveIntegerField(default=0)
    edited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Who made this version by editing the previous one (null: planned).",
    )
    edit = models.JSONField(
        null=True, blank=True, help_text="The edit that made this version: node, changes, reason."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["case", "number"]
        constraints = [
            models.UniqueConstraint(fields=["case", "number"], name="plan_version_number_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.case_id} v{self.number}"

    def save(self, *args: object, **kwargs: object) -> None:
        if self.pk is not None and not kwargs.get("force_insert"):
            raise ValueError("plan versions are immutable: create a new version instead")
        super().save(*args, **kwargs)  # type: ignore[arg-type]


class NodeStatus(models.TextChoices):
    PENDING = "pending"
    AWAITING_APPROVAL = "awaiting_approval"
    READY = "ready"
    RUNNING = "running"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"
    BLOCKED = "blocked"


class PlanNode(models.Model):
    """A compound task or a leaf of one plan version."""

    class Kind(models.TextChoices):
        COMPOUND = "compound"
        LEAF = "leaf"

    # No index of its own: the unique (version, key) index leads with the version, and a
    # second index on it only gave the planner a worse way to look up a node by its key.
    version = models.ForeignKey(
        PlanVersion, on_delete=models.PROTECT, related_name="nodes", db_index=False
    )
    key = models.CharField(max_length=200)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="children"
    )
    position = models.PositiveIntegerField(help_text="Order of the node in the tree (pre-order).")
    depth = models.PositiveSmallIntegerField(default=0)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    name = models.TextField(blank=True)
    description = models.TextField(blank=True)
    agent = models.CharField(max_length=100, blank=True)
    task = models.TextField(blank=True)
    rationale = models.TextField(blank=True)
    tool = models.CharField(max_length=100, blank=True)
    inputs = models.JSONField(default=dict, blank=True)
    depends_on = models.JSONField(default=list, blank=True, help_text="Leaf keys (resolved DAG).")
    declared_depends_on = models.JSONField(
        null=True, blank=True, help_text="Sibling keys as planned; null means after the previous."
    )
    expected_output = models.CharField(max_length=100, blank=True)
    failure_policy = models.CharField(max_length=10, blank=True)
    risk = models.CharField(max_length=16, blank=True)
    provenance = models.JSONField(default=dict)
    content_hash = models.CharField(
        max_length=64, blank=True, help_text="SHA-256 of what a leaf does; approvals bind to it."
    )
    status = models.CharField(max_length=20, choices=NodeStatus.choices, default=NodeStatus.PENDING)
    # Execution state (written by oversight's execution actions once the plan is approved).
    attempts = models.PositiveIntegerField(
        default=0, help_text="Claims so far; the current one is the fencing token of its worker."
    )
    lease_until = models.DateTimeField(
        null=True, blank=True, help_text="Until when the running attempt holds the leaf."
    )
    enqueued_at = models.DateTimeField(
        null=True, blank=True, help_text="When the leaf was last sent to the workers."
    )
    next_attempt_at = models.DateTimeField(
        null=True, blank=True, help_text="When a retrying leaf becomes ready again."
    )
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    output = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    error_class = models.CharField(max_length=20, blank=True)
    finished_after_cancel = models.BooleanField(
        default=False, help_text="Its effect happened although the case was cancelled meanwhile."
    )
    routing = models.JSONField(
        default=dict, blank=True, help_text="Why this agent runs the leaf (trust and load)."
    )

    class Meta:
        ordering = ["version", "position"]
        constraints = [
            models.UniqueConstraint(fields=["version", "key"], name="plan_node_key_unique"),
        ]
        indexes = [
            # The reconciler's scan: only the few leaves in flight, however many plans exist.
            models.Index(
                fields=["status"],
                condition=Q(status__in=["ready", "running", "retrying"]),
                name="plan_node_in_flight",
            ),
        ]

    def __str__(self) -> str:
        return self.key

    @property
    def is_leaf(self) -> bool:
        return self.kind == self.Kind.LEAF


class LlmCall(models.Model):
    """One request to the LLM provider, recorded for the audit trail."""

    case = models.ForeignKey(
        Case, null=True, blank=True, on_delete=models.PROTECT, related_name="llm_calls"
    )
    model = models.CharField(max_length=200)
    purpose = models.CharField(max_length=100, blank=True)
    prompt = models.JSONField(default=list)
    prompt_hash = models.CharField(max_length=64)
    response = models.TextField(blank=True)
    response_hash = models.CharField(max_length=64, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    latency_ms = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.model} call {self.pk}"


class DecompositionCacheEntry(models.Model):
    """A stored LLM decomposition answer, reused for identical requests."""

    key = models.CharField(max_length=64, unique=True)
    response = models.TextField()
    hits = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.key[:12]


# The invoice pack's demo ERP -----------------------------------------------------------------


class ErpSupplier(models.Model):
    supplier_id = models.CharField(max_length=20, unique=True)
    name = models.CharField(max_length=200)
    status = models.CharField(max_length=20)
    bank_account = models.CharField(max_length=64)

    def __str__(self) -> str:
        return f"{self.supplier_id} {self.name}"


class ErpPurchaseOrder(models.Model):
    po_number = models.CharField(max_length=20, unique=True)
    supplier_id = models.CharField(max_length=20)
    amount = models.DecimalField(max_digits=14, decimal_places=2)
    invoiced = models.DecimalField(max_digits=14, decimal_places=2)

    def __str__(self) -> str:
        return self.po_number


class ErpInvoiceDocument(models.Model):
    invoice_id = models.CharField(max_length=20, unique=True)
    text = models.TextField()

    def __str__(self) -> str:
        return self.invoice_id


class ErpPayment(models.Model):
    payment_id = models.CharField(max_length=20, unique=True)
    invoice_id = models.CharField(max_length=20)
    supplier_id = models.CharField(max_length=20, db_index=True)
    amount = models.DecimalField(max_digits=14, decimal_places=2)
    paid_on = models.DateField()

    def __str__(self) -> str:
        return self.payment_id


class ErpPaymentHold(models.Model):
    hold_id = models.CharField(max_length=20, unique=True)
    invoice_id = models.CharField(max_length=20)
    reason = models.TextField()
    idempotency_key = models.CharField(
        max_length=200, unique=True, null=True, blank=True, help_text="One hold per key."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.hold_id


# The incident pack's demo estate (planning.packs.incident.infrastructure) ---------------------


class EstateHost(models.Model):
    name = models.CharField(max_length=100, unique=True)
    description = models.CharField(max_length=200, blank=True)
    is_down = models.BooleanField(default=False, help_text="Down: it does not answer.")
    is_isolated = models.BooleanField(default=False, help_text="Cut off the network.")
    logs = models.JSONField(default=list, blank=True, help_text="Its security log lines.")

    def __str__(self) -> str:
        return self.name


class EstateDatabase(models.Model):
    service = models.CharField(max_length=100, unique=True)
    description = models.CharField(max_length=200, blank=True)
    primary_host = models.CharField(max_length=100, help_text="The primary as configured.")
    replica_host = models.CharField(max_length=100)
    current_primary = models.CharField(max_length=100, help_text="The primary since fail-overs.")
    owners = models.JSONField(default=list, blank=True, help_text="Who hears of its incidents.")

    def __str__(self) -> str:
        return self.service


class LeafEffect(models.Model):
    """An effect a pack's tool had on a demo system, once per the acting leaf's idempotency key
    (none when no leaf acted)."""

    idempotency_key = models.CharField(
        max_length=200, unique=True, null=True, blank=True, help_text="One effect per key."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        abstract = True


class EstateFailover(LeafEffect):
    service = models.CharField(max_length=100)
    old_primary = models.CharField(max_length=100)
    new_primary = models.CharField(max_length=100)

    def __str__(self) -> str:
        return f"{self.service}: {self.old_primary} → {self.new_primary}"


class EstateIsolation(LeafEffect):
    hosts = models.JSONField(default=list)

    def __str__(self) -> str:
        return ", ".join(self.hosts)


class EstateNotice(LeafEffect):
    recipients = models.JSONField(default=list)
    message = models.TextField()

    def __str__(self) -> str:
        return self.message[:80]


# The fraud pack's demo account data (planning.packs.fraud.data) --------------------------------


class FraudAccount(models.Model):
    account_id = models.CharField(max_length=20, unique=True)
    description = models.CharField(max_length=200, blank=True)

    def __str__(self) -> str:
        return self.account_id


class FraudTransaction(models.Model):
    tx_id = models.CharField(max_length=20, unique=True)
    account_id = models.CharField(max_length=20, db_index=True)
    amount = models.DecimalField(max_digits=14, decimal_places=2)
    counterparty = models.CharField(max_length=200)

    def __str__(self) -> str:
        return self.tx_id


class FraudSanctionedParty(models.Model):
    name = models.CharField(max_length=200, unique=True)

    def __str__(self) -> str:
        return self.name


class FraudAccountFreeze(LeafEffect):
    freeze_id = models.CharField(max_length=20, unique=True)
    account_id = models.CharField(max_length=20, db_index=True)
    reason = models.TextField()

    def __str__(self) -> str:
        return self.freeze_id


# Promoted methods ----------------------------------------------------------------------------


class PromotedMethod(models.Model):
    """An LLM-planned subtree, approved and executed once, made a static method of its pack.

    Versioned by name within a pack: approving version n+1 retires the active version. The guard
    and the subtree are JSON checked by pydantic (planning/promotion/methods.py); `content_hash`
    binds the approval to exactly what was proposed.
    """

    class Status(models.TextChoices):
        PROPOSED = "proposed"
        ACTIVE = "active"
        REJECTED = "rejected"
        RETIRED = "retired"

    pack = models.SlugField(max_length=50, help_text="The domain pack's slug.")
    task = models.CharField(max_length=200, help_text="The compound task the method decomposes.")
    name = models.SlugField(max_length=80)
    version = models.PositiveIntegerField()
    description = models.TextField(blank=True)
    guard = models.JSONField(default=list, help_text="Conditions on the planning state.")
    subtree = models.JSONField(default=list, help_text="The children the method plans.")
    content_hash = models.CharField(max_length=64)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PROPOSED)
    source_case = models.ForeignKey(Case, on_delete=models.PROTECT, related_name="+")
    source_version = models.ForeignKey(PlanVersion, on_delete=models.PROTECT, related_name="+")
    source_node = models.ForeignKey(PlanNode, on_delete=models.PROTECT, related_name="+")
    proposed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    proposed_at = models.DateTimeField(auto_now_add=True)
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    approved_at = models.DateTimeField(null=True, blank=True)
    rejected_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    rejected_at = models.DateTimeField(null=True, blank=True)
    rejection_reason = models.TextField(blank=True)
    retired_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    retired_at = models.DateTimeField(null=True, blank=True)
    retire_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["pack", "task", "name", "-version"]
        constraints = [
            models.UniqueConstraint(
                fields=["pack", "name", "version"], name="promoted_method_version_unique"
            ),
            models.UniqueConstraint(
                fields=["pack", "name"],
                condition=Q(status="active"),
                name="promoted_method_one_active",
            ),
            # Separation of duties, also in the schema: nobody approves their own proposal.
            models.CheckConstraint(
                condition=Q(approved_by__isnull=True) | ~Q(approved_by=models.F("proposed_by")),
                name="promoted_method_second_person",
            ),
        ]
        indexes = [models.Index(fields=["pack", "status"])]

    def __str__(self) -> str:
        return f"{self.pack}/{self.name} v{self.version}"

    @property
    def source(self) -> str:
        """Return the provenance source of the nodes this method plans."""
        return f"promoted:{self.name}@v{self.version}"


# The LLM budget ledger (planning/budgets.py); the tables keep their oversight_* names. -------


class LlmUsage(models.Model):
    """What settled LLM calls used in one budget scope: a case (all its calls) or a day (all cases).

    Kept by `planning.budgets`; calls in flight are the live `LlmReservation` rows, not here.
    """

    case = models.ForeignKey(
        "planning.Case", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    day = models.DateField(null=True, blank=True)
    calls = models.PositiveIntegerField(default=0)
    tokens = models.PositiveBigIntegerField(default=0)
    cost_nano_usd = models.PositiveBigIntegerField(default=0)  # billionths of a dollar
    unpriced_calls = models.PositiveIntegerField(default=0)  # not in the cost: no price known
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "oversight_llmusage"
        constraints = [
            models.CheckConstraint(
                condition=Q(case__isnull=True, day__isnull=False)
                | Q(case__isnull=False, day__isnull=True),
                name="llm_usage_case_or_day",
            ),
            models.UniqueConstraint(fields=["case"], name="llm_usage_per_case"),
            models.UniqueConstraint(fields=["day"], name="llm_usage_per_day"),
        ]

    def __str__(self) -> str:
        return f"case {self.case_id}" if self.case_id else f"day {self.day}"


class LlmReservation(models.Model):
    """The worst case of one LLM call in flight, counted against its case's and its day's budget.

    Deleted when the call settles or is released; one left by a process that died counts until
    `expires_at` (when the call could no longer be running).
    """

    case = models.ForeignKey("planning.Case", on_delete=models.CASCADE, related_name="+")
    day = models.DateField()
    model = models.CharField(max_length=200)
    purpose = models.CharField(max_length=100)
    tokens = models.PositiveBigIntegerField()
    cost_nano_usd = models.PositiveBigIntegerField(default=0)
    is_priced = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()

    class Meta:
        db_table = "oversight_llmreservation"
        indexes = [
            models.Index(fields=["day", "expires_at"], name="llm_reservation_day"),
            models.Index(fields=["case", "expires_at"], name="llm_reservation_case"),
        ]

    def __str__(self) -> str:
        return f"{self.model} for case {self.case_id}"
