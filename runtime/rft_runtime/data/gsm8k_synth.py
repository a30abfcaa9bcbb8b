"""``gsm8k_synth``: GSM8K-style word problems from our own offline template generator.

Each task's reference solution (``metadata["solution"]``) is written the GSM8K way: one line per
step with ``<<expression=value>>`` calculator annotations and a last line ``#### N``.
``ground_truth`` is ``N`` as a string. All intermediate and final values are non-negative integers.
"""

from __future__ import annotations

import random
from typing import Any, Callable

from .registry import register_dataset
from .task import DatasetError, Task

__all__ = ["gsm8k_synth", "GSM8K_INSTRUCTION", "TEMPLATES"]

GSM8K_INSTRUCTION = "Solve the problem step by step. Give the final answer after '####'."

_NAMES = ["Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jamal",
          "Kira", "Liam", "Maya", "Noah", "Olga", "Priya", "Quinn", "Rosa", "Sami", "Tara"]
_ITEMS = ["apples", "pencils", "stickers", "marbles", "cookies", "books", "shells", "cards"]

Problem = tuple[str, list[str], int]


def _calc(expr: str, value: int) -> str:
    return f"{expr} = <<{expr.replace(' ', '')}={value}>>{value}"


def _buy_and_pay(r: random.Random) -> Problem:
    name, item = r.choice(_NAMES), r.choice(_ITEMS)
    k, price, paid_extra = r.randint(2, 9), r.randint(2, 12), r.randint(1, 20)
    cost = k * price
    paid = cost + paid_extra
    q = (f"{name} buys {k} {item} that cost ${price} each. {name} pays with ${paid}. "
         f"How many dollars of change does {name} get?")
    steps = [f"The {item} cost {_calc(f'{k} * {price}', cost)} dollars.",
             f"The change is {_calc(f'{paid} - {cost}', paid_extra)} dollars."]
    return q, steps, paid_extra


def _share_equally(r: random.Random) -> Problem:
    name, item = r.choice(_NAMES), r.choice(_ITEMS)
    friends, each, kept = r.randint(2, 8), r.randint(2, 10), r.randint(0, 15)
    total = friends * each + kept
    q = (f"{name} has {total} {item}. {name} keeps {kept} and shares the rest equally among "
         f"{friends} friends. How many {item} does each friend get?")
    shared = total - kept
    steps = [f"{name} shares {_calc(f'{total} - {kept}', shared)} {item}.",
             f"Each friend gets {_calc(f'{shared} / {friends}', each)} {item}."]
    return q, steps, each


def _weekly_savings(r: random.Random) -> Problem:
    name = r.choice(_NAMES)
    per_day, days, weeks, spent = r.randint(2, 9), r.randint(2, 7), r.randint(2, 6), r.randint(1, 20)
    week = per_day * days
    total = week * weeks
    spent = min(spent, total)
    left = total - spent
    q = (f"{name} saves ${per_day} a day for {days} days each week. After {weeks} weeks, {name} "
         f"spends ${spent} on a gift. How many dollars does {name} have left?")
    steps = [f"Each week {name} saves {_calc(f'{per_day} * {days}', week)} dollars.",
             f"In {weeks} weeks that is {_calc(f'{week} * {weeks}', total)} dollars.",
             f"After the gift {name} has {_calc(f'{total} - {spent}', left)} dollars."]
    return q, steps, left


def _twice_as_many(r: random.Random) -> Problem:
    a, b = r.sample(_NAMES, 2)
    item = r.choice(_ITEMS)
    x, mult, more = r.randint(3, 20), r.randint(2, 4), r.randint(1, 10)
    y = x * mult
    z = y + more
    q = (f"{a} has {x} {item}. {b} has {mult} times as many {item} as {a}, and then finds {more} "
         f"more. How many {item} do {a} and {b} have together?")
    total = x + z
    steps = [f"{b} first has {_calc(f'{x} * {mult}', y)} {item}.",
             f"After finding more, {b} has {_calc(f'{y} + {more}', z)} {item}.",
             f"Together they have {_calc(f'{x} + {z}', total)} {item}."]
    return q, steps, total


def _rows_of_seats(r: random.Random) -> Problem:
    rows, per_row, empty = r.randint(3, 12), r.randint(4, 15), r.randint(0, 20)
    seats = rows * per_row
    empty = min(empty, seats)
    taken = seats - empty
    q = (f"A theater has {rows} rows with {per_row} seats in each row. {empty} seats are empty. "
         f"How many seats are taken?")
    steps = [f"The theater has {_calc(f'{rows} * {per_row}', seats)} seats.",
             f"Taken seats: {_calc(f'{seats} - {empty}', taken)}."]
    return q, steps, taken


def _speed_time(r: random.Random) -> Problem:
    name = r.choice(_NAMES)
    speed, hours, back = r.randint(3, 60), r.randint(2, 6), r.randint(1, 3)
    out = speed * hours
    ret = speed * back
    total = out + ret
    q = (f"{name} drives at {speed} miles per hour for {hours} hours, then drives back for "
         f"{back} hours at the same speed. How many miles does {name} drive in total?")
    steps = [f"Going out: {_calc(f'{speed} * {hours}', out)} miles.",
             f"Coming back: {_calc(f'{speed} * {back}', ret)} miles.",
             f"In total: {_calc(f'{out} + {ret}', total)} miles."]
    return q, steps, total


def _bake_sale(r: random.Random) -> Problem:
    name = r.choice(_NAMES)
    trays, per_tray, eaten, price = r.randint(2, 6), r.randint(6, 12), r.randint(1, 5), r.randint(1, 4)
    made = trays * per_tray
    sold = made - eaten
    money = sold * price
    q = (f"{name} bakes {trays} trays of {per_tray} muffins. The family eats {eaten} muffins and "
         f"{name} sells the rest for ${price} each. How many dollars does {name} make?")
    steps = [f"{name} bakes {_calc(f'{trays} * {per_tray}', made)} muffins.",
             f"{name} sells {_calc(f'{made} - {eaten}', sold)} muffins.",
             f"That makes {_calc(f'{sold} * {price}', money)} dollars."]
    return q, steps, money


def _pages_per_day(r: random.Random) -> Problem:
    name = r.choice(_NAMES)
    per_day, days, pages_left = r.randint(5, 30), r.randint(2, 9), r.randint(0, 40)
    read = per_day * days
    book = read + pages_left
    q = (f"{name}'s book has {book} pages. {name} reads {per_day} pages a day for {days} days. "
         f"How many pages are left to read?")
    steps = [f"{name} reads {_calc(f'{per_day} * {days}', read)} pages.",
             f"Pages left: {_calc(f'{book} - {read}', pages_left)}."]
    return q, steps, pages_left


TEMPLATES: dict[str, Callable[[random.Random], Problem]] = {
    "buy_and_pay": _buy_and_pay,
    "share_equally": _share_equally,
    "weekly_savings": _weekly_savings,
    "twice_as_many": _twice_as_many,
    "rows_of_seats": _rows_of_seats,
    "speed_time": _speed_time,
    "bake_sale": _bake_sale,
    "pages_per_day": _pages_per_day,
}


@register_dataset("gsm8k_synth")
def gsm8k_synth(
    n: int, seed: int, *, instruction: bool = True, id_prefix: str | None = None, **unknown: Any
) -> list[Task]:
    """``n`` seeded GSM8K-style word problems.

    Options: ``instruction`` (append :data:`GSM8K_INSTRUCTION` to each question), ``id_prefix``
    (task ids ``{id_prefix}-{i}``; default ``gsm8k_synth-s{seed}``).
    """
    if unknown:
        raise DatasetError(f"builtin dataset 'gsm8k_synth': unknown option(s) {sorted(unknown)}; "
                           "known: instruction, id_prefix")
    rng = random.Random(f"gsm8k_synth:{seed}")
    names = sorted(TEMPLATES)
    prefix = id_prefix or f"gsm8k_synth-s{seed}"
    tasks = []
    for i in range(n):
        template = names[rng.randrange(len(names))]
        question, steps, answer = TEMPLATES[template](rng)
        solution = "\n".join(steps + [f"#### {answer}"])
        content = f"{question} {GSM8K_INSTRUCTION}" if instruction else question
        tasks.append(
            Task(
                task_id=f"{prefix}-{i}",
                messages=[{"role": "user", "content": content}],
                ground_truth=str(answer),
                domain="math",
                metadata={"template": template, "solution": solution},
            )
        )
    return tasks
