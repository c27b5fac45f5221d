"""MathAgent: the chat agent with the math prompt and one worked example (teaches the \\boxed{} format)."""

from nanorllm.agents.chat_agent import ChatAgent

DEFAULT_SYSTEM_PROMPT = ("You are a careful math assistant. Solve the problem and give the final "
                         "answer as a number in \\boxed{}.")
# One worked example in the prompt teaches a small model the answer format.
DEFAULT_EXAMPLE = ("What is 2 + 5?", "2 + 5 = 7. The answer is \\boxed{7}.")


class MathAgent(ChatAgent):
    def __init__(self, *, system_prompt: str = DEFAULT_SYSTEM_PROMPT,
                 example: tuple[str, str] | None = DEFAULT_EXAMPLE):
        super().__init__(system_prompt=system_prompt, example=example)
