"""The calculator as a Python tool (`--tools nanorllm/envs/calc_tool.py:calc`), and the calculator tasks under
the math env (`--env nanorllm.envs.calc_tool:CalcTasks`): `--env calc`'s task with the tool called through
the model's tool-call format (docs/tools.md) instead of a fenced calc block.

    python launch/train.py --env nanorllm.envs.calc_tool:CalcTasks --tools nanorllm/envs/calc_tool.py:calc
"""

from nanorllm.envs.calc_env import CalculatorTool
from nanorllm.envs.calculator import calculate
from nanorllm.envs.math_env import MathSelfRefine


def calc(expression: str) -> str:
    """Calculate an arithmetic expression exactly: numbers, + - * / and parentheses.

    Args:
        expression: the expression, e.g. "37 * 52 - 64"
    """
    return calculate(expression)


TOOLS_PROMPT = ("You are a careful math assistant with tools. Call one when it helps and stop: its result comes "
                "back. Then give the final answer as a number in \\boxed{}.")
SYSTEM_PROMPT = ("You are a careful math assistant with a calculator tool. To calculate, call calc with one "
                 "arithmetic expression and stop: its result comes back. Then give the final answer as a number "
                 "in \\boxed{}.")
EXAMPLE = [{"role": "user", "content": "What is 12 * 34 + 5?"},
           {"role": "assistant", "content": "", "tool_calls": [
               {"type": "function", "function": {"name": "calc", "arguments": {"expression": "12 * 34 + 5"}}}]},
           {"role": "tool", "name": "calc", "content": "413"},
           {"role": "assistant", "content": "The answer is \\boxed{413}."}]


class CalcTasks(MathSelfRefine):
    """The math env's \\boxed{} answers and grading on the calculator env's tasks, with a prompt and a worked
    exchange that call the tool (rendered in the model's tool format: policy/chat_render.py). With --tools that
    hold no `calc`, the prompt names no tool and shows no call: it would teach a call the episodes cannot make."""

    name = "calc-tasks"
    system_prompt, example = SYSTEM_PROMPT, EXAMPLE
    default_tasks, default_eval_tasks = CalculatorTool.default_tasks, CalculatorTool.default_eval_tasks

    def load_tasks(self, spec: str, *, limit: int | None = None) -> list[dict]:
        return CalculatorTool(self.settings).load_tasks(spec, limit=limit)

    def use_tools(self, names: list[str]) -> None:
        if "calc" not in names:
            self.system_prompt, self.example = TOOLS_PROMPT, None

    def demonstrations(self, task: dict) -> list[dict]:
        """The worked exchange's moves on `task`: one `calc` call of the question's expression, its result, the
        boxed answer."""
        expression = task["question"].removeprefix("What is ").removesuffix("?")
        return [{"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "calc", "arguments": {"expression": expression}}}]},
                {"role": "tool", "name": "calc", "content": calc(expression)},
                {"role": "assistant", "content": f"The answer is \\boxed{{{task['answer']}}}."}]
