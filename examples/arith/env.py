"""Arith: a multi-step ORS environment with a task-specific tool and an end-of-episode reward.

Each task is an expression over hidden integer operands, e.g. `(a + b) * c`. The model must:
  1. read every operand with `get_operand(name)`: a task-specific tool (`@tool(shared=False)`, listed through
     `list_task_tools`) whose schema enumerates this task's operand names;
  2. compute with `calculator(expression)` (integers, + - * and parentheses);
  3. `submit(answer)`: reward 1.0 when right, 0.0 when wrong, and the episode ends.
Only `submit` is rewarded: an episode that never submits ends `no_answer` (`rollout.unanswered_reward`, 0.0).

Serve it:  python examples/arith/env.py --port 8001        (binds 127.0.0.1)
Use it:    envs: {arith: {kind: ors, environment: examples/arith/env.py:ArithEnvironment}}
"""

from __future__ import annotations

import ast
import operator

from openreward.environments import Environment, JSONObject, TextBlock, ToolOutput, tool
from openreward.environments.types import ListToolsOutput, ToolSpec
from pydantic import BaseModel

# (expression, operands): small integers so every answer is an integer the tiny tokenizer has seen.
_TRAIN = [
    ("a + b", {"a": 12, "b": 30}),
    ("a * b", {"a": 7, "b": 6}),
    ("a - b", {"a": 100, "b": 58}),
    ("(a + b) * c", {"a": 3, "b": 4, "c": 5}),
    ("a * b + c", {"a": 9, "b": 9, "c": 19}),
    ("a - b * c", {"a": 50, "b": 2, "c": 4}),
    ("(a - b) * (c + a)", {"a": 8, "b": 3, "c": 2}),
    ("a + b + c", {"a": 111, "b": 222, "c": 333}),
]
_TEST = [
    ("a * (b + c)", {"a": 6, "b": 5, "c": 2}),
    ("a - b", {"a": 7, "b": 19}),
]

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_MAX_ABS = 10**12


def evaluate(expression: str, names: dict[str, int] | None = None) -> int:
    """Evaluate an integer expression with + - * and parentheses (no calls, no attributes, bounded size).

    Raises:
        ValueError: Anything else, with a message meant for the model.
    """
    if len(expression) > 200:
        raise ValueError("expression too long (200 characters at most)")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not a valid expression ({exc.msg})") from None

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name) and names is not None and node.id in names:
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            value = _BINARY[type(node.op)](walk(node.left), walk(node.right))
            if abs(value) > _MAX_ABS:
                raise ValueError("result too large")
            return value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](walk(node.operand))
        if isinstance(node, ast.Name):
            raise ValueError(f"unknown name {node.id!r}: read operands with get_operand and use their values")
        raise ValueError("only integers, + - * and parentheses are allowed")

    return walk(tree)


def _tasks(rows: list[tuple[str, dict[str, int]]]) -> list[JSONObject]:
    return [
        {"expression": expr, "operands": dict(ops), "answer": evaluate(expr, ops)}
        for expr, ops in rows
    ]


class ArithTaskSpec(BaseModel):
    expression: str
    operands: dict[str, int]
    answer: int


class OperandParams(BaseModel):
    name: str


class CalculatorParams(BaseModel):
    expression: str


class SubmitParams(BaseModel):
    answer: int


class ArithEnvironment(Environment):
    """Compute an expression whose operands must be looked up first; only the submitted answer is rewarded.

    Args:
        task_spec: `{"expression": str, "operands": {name: int}, "answer": int}`.
        secrets: Per-session secrets (unused).
    """

    def __init__(self, task_spec: JSONObject = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec)
        self.config = ArithTaskSpec.model_validate(task_spec)
        self.read: dict[str, int] = {}

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train", "test"]

    @classmethod
    def list_tasks(cls, split: str) -> list[JSONObject]:
        return _tasks(_TRAIN if split == "train" else _TEST)

    def get_prompt(self) -> list[TextBlock]:
        names = ", ".join(sorted(self.config.operands))
        return [TextBlock(type="text", text=(
            f"Compute {self.config.expression}. The operands ({names}) are hidden: read each one with get_operand, "
            "compute with calculator, then submit the integer answer."
        ))]

    def list_task_tools(self) -> ListToolsOutput:
        """This task's own tool: `get_operand`, whose `name` may only be one of the task's operand names."""
        names = sorted(self.config.operands)
        return ListToolsOutput(tools=[ToolSpec(
            name="get_operand",
            description=f"Read the value of one hidden operand of this task ({', '.join(names)}).",
            input_schema={
                "type": "object",
                "properties": {"name": {"type": "string", "enum": names, "description": "Operand name."}},
                "required": ["name"],
            },
        )])

    @tool(shared=False)
    async def get_operand(self, params: OperandParams) -> ToolOutput:
        """Read the value of one hidden operand of this task."""
        value = self.config.operands.get(params.name)
        if value is None:
            names = ", ".join(sorted(self.config.operands))
            return ToolOutput(blocks=[TextBlock(text=f"Error: no operand {params.name!r}; this task has {names}.")])
        self.read[params.name] = value
        return ToolOutput(blocks=[TextBlock(text=f"{params.name} = {value}")])

    @tool
    async def calculator(self, params: CalculatorParams) -> ToolOutput:
        """Evaluate an integer expression with + - * and parentheses, e.g. "(3 + 4) * 5".

        Args:
            expression: The expression, with numbers (not operand names).
        """
        try:
            value = evaluate(params.expression)
        except ValueError as exc:
            return ToolOutput(blocks=[TextBlock(text=f"Error: {exc}")])
        return ToolOutput(blocks=[TextBlock(text=str(value))])

    @tool(exclusive=True)
    async def submit(self, params: SubmitParams) -> ToolOutput:
        """Submit the final integer answer. Ends the episode: reward 1.0 if correct, else 0.0.

        Args:
            answer: The value of the expression.
        """
        correct = params.answer == self.config.answer
        return ToolOutput(
            blocks=[TextBlock(text="correct" if correct else "wrong")],
            reward=1.0 if correct else 0.0,
            finished=True,
        )


if __name__ == "__main__":
    from raygrpo.envs.ors.server import main

    main(ArithEnvironment)
