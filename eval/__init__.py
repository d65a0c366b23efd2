"""Planning-quality evaluation: goals with hand-written reference plans, scored per strategy.

`python -m eval` (`make eval`) plans every goal of `eval/goals/` with each strategy that applies
and writes `eval/results/<model>.json` and `.md`. Pure Python: the planning core and the packs,
no Django and no database.
"""
