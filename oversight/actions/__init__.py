"""Oversight use cases, one module per area. Each state change runs in a transaction and writes
its audit event: `gates` (opening, deciding, expiring gates), `edits` (plan edits as new versions),
`policies` (the gating policy's versions), `users` (user and role administration), `workers`."""
