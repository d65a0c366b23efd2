"""Accounts: the roles and their permissions, users and groups admin, the two-person requests
(password resets, role grants), sessions, API tokens, sign-in throttling and access denials.
It imports only the audit app below it."""
