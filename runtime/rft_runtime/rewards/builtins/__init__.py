"""Builtin evaluators. Importing this package registers them in ``rft_runtime.rewards.BUILTINS``:
``math``, ``string_check``, ``regex``, ``code_sandbox``, ``llm_judge``."""

from .code_sandbox import CodeSandboxEvaluator
from .llm_judge import LLMJudgeEvaluator
from .math_rule import MathEvaluator
from .regex_match import RegexEvaluator
from .string_check import StringCheckEvaluator

__all__ = ["CodeSandboxEvaluator", "LLMJudgeEvaluator", "MathEvaluator", "RegexEvaluator", "StringCheckEvaluator"]
