"""Execution: claims, endings, reconcile, work items, the worker loop, judging, replanning, the
runners by agent kind and trust. It imports the apps below it (web, observability, audit,
accounts, planning, oversight); only quality and the project import it."""
