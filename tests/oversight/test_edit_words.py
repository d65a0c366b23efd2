"""A refused plan edit's reasons in sentences: the validation's terse problems, translated."""

from __future__ import annotations

from oversight.actions.edit_words import problems_in_words, sentence


def test_each_problem_becomes_a_sentence_naming_the_step() -> None:
    said = problems_in_words(
        "'x': unknown agent 'ghost'; "
        "'y': input 'report' refers to 'check-po', which is not upstream"
    )
    assert said == (
        "Step x: there is no agent “ghost”. "
        "Step y: input “report” takes the output of check-po, which does not run before it."
    )


def test_a_tools_input_problems_say_what_is_missing_extra_or_wrong_without_paths() -> None:
    said = problems_in_words(
        "'s': inputs invalid for tool 't': invoice: Field required; colour: Extra inputs are not "
        "permitted; invoice.lines.0.quantity: Input should be a valid integer"
    )
    assert said == (
        "Step s: the inputs do not fit tool t: “invoice” is missing; “colour” is not one of its "
        "inputs; “invoice → lines → item 1 → quantity”: input should be a valid integer."
    )


def test_a_cycle_and_an_unknown_problem_still_read_as_sentences() -> None:
    assert problems_in_words("dependency cycle: 'a' -> 'b' -> 'a'") == (
        "The steps would wait for each other in a circle: a → b → a."
    )
    assert problems_in_words("plan has 300 leaves, limit 200") == "Plan has 300 leaves, limit 200."
    # Braces in what a user typed are text, not a format.
    assert problems_in_words("'k': unknown agent '{0}{x}'") == "Step k: there is no agent “{0}{x}”."


def test_a_sentence_starts_with_a_capital_and_ends_with_a_full_stop() -> None:
    assert sentence("a reason code is required to edit") == "A reason code is required to edit."
    assert sentence("Done!") == "Done!" and sentence("") == ""
