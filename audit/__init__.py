"""The tamper-evident audit trail: the event models, the hash chain, scans, checkpoints, signing
keys, export bundles and the registry of event codes. The bottom of the Django apps: it imports
no other app."""
