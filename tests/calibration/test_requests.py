from __future__ import annotations

from calibration.prompts import Prompt
from calibration.requests import encode_prompt, plan

PREFIX = "The following are multiple choice questions (with answers) about anatomy.\n\nIs 1 odd?\nAnswer: A\n\n"


def lettered(query: str, prefix: str = PREFIX) -> Prompt:
    return Prompt(prefix, query + "\nAnswer:", (" A", " B", " C", " D"), (1, 1, 1, 1))


def test_encode_prompt_moves_trailing_space_to_the_continuation(tokenizer):
    ctx, conts = encode_prompt(tokenizer, "Question: Is it red?\nAnswer: ", ["yes", "no"])
    assert ctx == tokenizer.encode("Question: Is it red?\nAnswer:")
    assert tokenizer.decode(conts[0]) == " yes" and tokenizer.decode(conts[1]) == " no"


def test_single_token_choices_share_one_row_per_question(tokenizer):
    prompts = [lettered("Is 2 even?"), lettered("Is 3 a prime number?")]
    (group,) = plan(tokenizer, prompts)
    assert len(group.rows) == 2
    for index, (row, prompt) in enumerate(zip(group.rows, prompts)):
        ctx, conts = encode_prompt(tokenizer, prompt.prefix + prompt.query, prompt.continuations)
        assert group.prefix + row.tokens == ctx  # sharing never changes the scored tokens
        assert [(r.position, r.target, r.question, r.choice) for r in row.reads] == [
            (len(row.tokens) - 1, c[0], index, k) for k, c in enumerate(conts)]
    assert len(group.prefix) >= len(tokenizer.encode(PREFIX)) - 1


def test_prefix_is_a_token_prefix_and_leaves_one_context_token(tokenizer):
    (group,) = plan(tokenizer, [lettered("Same?"), lettered("Same?")])
    ctx = tokenizer.encode(PREFIX + "Same?\nAnswer:")
    assert group.prefix == ctx[:-1] and [row.tokens for row in group.rows] == [ctx[-1:], ctx[-1:]]


def test_multi_token_choices_get_one_row_each_batched_across_questions(tokenizer):
    prompts = [Prompt("", f"Question: What is {x}?\nAnswer:", (" a red fruit", " a car"), (11, 5))
               for x in ("an apple", "a bus")]
    (group,) = plan(tokenizer, prompts)
    assert group.prefix == tokenizer.encode("Question: What is")  # the common token prefix
    assert len(group.rows) == 4
    for index, prompt in enumerate(prompts):
        ctx, conts = encode_prompt(tokenizer, prompt.query, prompt.continuations)
        for k, (row, cont) in enumerate(zip(group.rows[2 * index: 2 * index + 2], conts)):
            assert group.prefix + row.tokens == ctx + cont[:-1]
            start = len(ctx) - 1 - len(group.prefix)
            assert [(r.position, r.target, r.question, r.choice) for r in row.reads] == [
                (start + t, token, index, k) for t, token in enumerate(cont)]


def test_no_sharing_is_one_group_without_prefix(tokenizer):
    prompts = [lettered("Is 2 even?"), Prompt("", "Question: Q?\nAnswer:", (" a long answer", " b"), (13, 1))]
    (group,) = plan(tokenizer, prompts, share_prefix=False)
    assert group.prefix == [] and len(group.rows) == 1 + 2
