"""The LLM budget ledger's models now belong to the planning app, which spends the budgets
(planning/migrations/0008_llm_budget_models_moved.py): removed from this app's state only;
their tables stay."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("oversight", "0013_execution_models_moved"),
        ("planning", "0008_llm_budget_models_moved"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(
                    model_name='llmreservation',
                    name='llm_reservation_day',
                ),
                migrations.RemoveIndex(
                    model_name='llmreservation',
                    name='llm_reservation_case',
                ),
                migrations.RemoveConstraint(
                    model_name='llmusage',
                    name='llm_usage_case_or_day',
                ),
                migrations.RemoveConstraint(
                    model_name='llmusage',
                    name='llm_usage_per_case',
                ),
                migrations.RemoveConstraint(
                    model_name='llmusage',
                    name='llm_usage_per_day',
                ),
                migrations.RemoveField(
                    model_name='llmusage',
                    name='case',
                ),
                migrations.DeleteModel(
                    name='LlmReservation',
                ),
                migrations.DeleteModel(
                    name='LlmUsage',
                ),
            ],
        ),
    ]
