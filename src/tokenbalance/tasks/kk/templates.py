"""Knights & Knaves prompt templates (spec ``kk.md`` §10): ``prefix + quiz + suffix``, the chat template baked in.
``qwen-instruct`` and ``qwen-base`` are Logic-RL's byte for byte (typos kept); ``compact`` and ``plain`` are ours, for
a tiny local tokenizer. docs/tasks.md ("Templates")."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PromptTemplate:
    """``render(quiz) == prefix + quiz + suffix``; ``response_header`` is the tail of the prompt from the reward's
    split marker on (what :func:`~tokenbalance.tasks.kk.reward.score_response` puts in front of a bare response)."""

    name: str
    prefix: str
    suffix: str
    response_header: str
    question_style: str = "quiz"  # "quiz": the natural-language quiz; "compact": compact_question

    def render(self, quiz: str) -> str:
        return self.prefix + quiz + self.suffix

    def render_puzzle(self, quiz: str, statements: str | None, names) -> str:
        """The prompt of a puzzle: from ``quiz``, or for ``compact`` from its statements and names."""
        if self.question_style == "quiz":
            return self.render(quiz)
        if statements is None or names is None:
            raise ValueError(
                f"template {self.name!r} renders the puzzle from its statements and names, "
                "which this example does not carry"
            )
        from tokenbalance.tasks.kk.statements import compact_question

        return self.render(compact_question(statements, names))


QWEN_INSTRUCT = PromptTemplate(
    name="qwen-instruct",
    prefix=(
        "<|im_start|>system\nYou are a helpful assistant. The assistant first thinks about the "
        "reasoning process in the mind and then provides the user with the answer. The reasoning "
        "process and answer are enclosed within <think> </think> and<answer> </answer> tags, "
        "respectively, i.e., <think> reasoning process here </think><answer> answer here "
        "</answer>.  Now the user asks you to solve a logical reasoning problem. After thinking, "
        "when you finally reach a conclusion, clearly state the identity of each character within "
        "<answer> </answer> tags. i.e., <answer> (1) Zoey is a knight\n(2) ... </answer>.\n"
        "<|im_end|>\n<|im_start|>user\n"
    ),
    suffix="\n<|im_end|>\n<|im_start|>assistant\n<think>",
    response_header="<|im_start|>assistant\n<think>",
)

QWEN_BASE = PromptTemplate(
    name="qwen-base",
    prefix=(
        "The user asks a question, and the Assistant solves it.The assistant first thinks about "
        "the reasoning process in the mind and then provides the user with the final answer. The "
        "reasoning process and answer are enclosed within <think> </think> and <answer> </answer> "
        "tags, respectively, i.e., <think> reasoning process here </think><answer> answer here "
        "</answer>. Now the user asks you to solve a logical reasoning problem. After thinking, "
        "when you finally reach a conclusion, clearly state the identity of each character within "
        "<answer> </answer> tags. List the identity of each person one by one, for example, "
        "<answer> (1) Zoey is a knight\n(2) Oliver is a knight\n(3)... </answer>.\n\nUser:"
    ),
    suffix="\nAssistant: <think>",
    response_header="Assistant: <think>",
)

PLAIN = PromptTemplate(
    name="plain",
    prefix=(
        "Solve the logic puzzle. Think inside <think> </think>, then give the role of each "
        "person inside <answer> </answer>, one line each, for example <answer> (1) Zoey is a "
        "knight\n(2) Oliver is a knave </answer>.\n\nUser: "
    ),
    suffix="\nAssistant: <think>",
    response_header="Assistant: <think>",
)

COMPACT = PromptTemplate(
    name="compact",
    prefix="User: ",
    suffix="\nAssistant: <think>",
    response_header="Assistant: <think>",
    question_style="compact",
)

TEMPLATES: dict[str, PromptTemplate] = {t.name: t for t in (QWEN_INSTRUCT, QWEN_BASE, PLAIN, COMPACT)}
TEMPLATE_NAMES = tuple(TEMPLATES)
DEFAULT_TEMPLATE = QWEN_INSTRUCT.name


def get_template(name: str) -> PromptTemplate:
    """The template called ``name``; ``ValueError`` listing the valid names otherwise."""
    try:
        return TEMPLATES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown template {name!r}; valid templates: {', '.join(TEMPLATE_NAMES)}") from None


def render_prompt(quiz: str, template: str = DEFAULT_TEMPLATE) -> str:
    """The full prompt text for ``quiz`` (ends with an opening ``<think>``)."""
    return get_template(template).render(quiz)


def reference_response(solution_text_format: str, thinking: str = "") -> str:
    """A correct response to a prompt that ends in the opening ``<think>``: the (optional) reasoning, ``</think>``,
    then the answer block. It scores 3 under the K&K reward; it is the SFT target and part of the tokenizer corpus."""
    thought = f" {thinking.strip()}" if thinking.strip() else ""
    return f"{thought} </think>\n<answer> {solution_text_format} </answer>"


def reference_cot(row) -> str:
    """The generator's synthetic chain of thought of a K&K row, as one paragraph."""
    return " ".join([row["cot_head"], *row["cot_repeat_steps"], row["cot_foot"]])
