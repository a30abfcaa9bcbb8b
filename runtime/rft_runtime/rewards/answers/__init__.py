"""Math answers: extraction from completions and equivalence checking."""

from .equivalence import Verdict, answers_equal, numeric_core
from .extract import STRATEGIES, Extracted, extract_answer, find_boxed, ground_truth_answers
from .numbers import Number, clean_answer, numbers_equal, parse_number
from .symbolic import SymbolicChecker, default_checker

__all__ = [
    "Verdict", "answers_equal", "numeric_core", "STRATEGIES", "Extracted", "extract_answer", "find_boxed",
    "ground_truth_answers", "Number", "clean_answer", "numbers_equal", "parse_number", "SymbolicChecker",
    "default_checker",
]
