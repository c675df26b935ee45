"""Synthetic drafter-training prompts, written for this project from templates (no dataset text):

  * :func:`math_problems`: competition-math problems in the MATH-500 style (LaTeX, rendered
    with :func:`dflash_jax.prompts.math_prompt` by the caller): algebra, number theory,
    counting and probability, geometry, sequences and functions, with seeded random numbers;
  * :func:`chat_requests`: single user turns in the MT-Bench flavour over its eight categories
    (writing, roleplay, reasoning, math, coding, extraction, stem, humanities), from templates
    with seeded random slots; :func:`stdlib_requests` adds requests about the standard
    library's modules (:func:`stdlib_topics`).

Each pool is a fixed list for a given size: its own seed (not the caller's), duplicates skipped,
so ``corpus.training_prompts`` samples from the same pool whatever its seed. The MT-Bench
turns are single: the drafter's training data is one user turn answered by the target.
"""

from __future__ import annotations

import random
import re
from fractions import Fraction
from math import gcd
from typing import Callable

MATH_SEED, CHAT_SEED = 18_001, 18_002


# ------------------------------------------------------------------------------ LaTeX helpers
def _frac(x) -> str:
    x = Fraction(x)
    if x.denominator == 1:
        return str(x.numerator)
    return f"{'-' if x < 0 else ''}\\frac{{{abs(x.numerator)}}}{{{x.denominator}}}"


def _pow(var: str, p: int) -> str:
    return var if p == 1 else f"{var}^{p}" if p < 10 else f"{var}^{{{p}}}"


def _terms(terms) -> str:
    """[(coef, monomial)] as a LaTeX sum, zero terms dropped ("" monomial: a constant)."""
    out = ""
    for c, m in terms:
        if c == 0:
            continue
        mag = abs(c)
        body = (str(mag) if mag != 1 or not m else "") + m
        out += ("-" if c < 0 else "") + body if not out else (" - " if c < 0 else " + ") + body
    return out or "0"


def _poly(coefs, var: str = "x") -> str:
    """Coefficients, highest power first, as a polynomial: [2, -3, 1] -> 2x^2 - 3x + 1."""
    n = len(coefs) - 1
    return _terms([(c, _pow(var, n - i) if n - i else "") for i, c in enumerate(coefs)])


def _nz(r: random.Random, lo: int, hi: int) -> int:
    while True:
        v = r.randint(lo, hi)
        if v:
            return v


def _a(phrase: str) -> str:
    return ("an " if phrase[0].lower() in "aeiou" else "a ") + phrase


def _bare(phrase: str) -> str:
    return phrase.split(" ", 1)[1] if phrase.split(" ", 1)[0] in ("a", "an") else phrase


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}^{{\\text{{{suffix}}}}}"


VARS = "xyntkam"
NAMES = ("Ava", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonah", "Kira", "Liam",
         "Maya", "Nikhil", "Olga", "Pedro", "Quinn", "Rosa", "Sami", "Tara", "Umar", "Vera", "Wes", "Xin",
         "Yara", "Zane", "Amir", "Bea", "Carlos", "Dana", "Emeka", "Freya", "Gus", "Hana", "Ivan", "Jia",
         "Kofi", "Lena", "Marco", "Noor", "Oscar", "Priya", "Raj", "Sofia", "Theo", "Uma", "Victor", "Wen")
WORDS = ("CANOE", "TOMATO", "PARROT", "BUTTER", "LETTER", "COFFEE", "RABBIT", "GARDEN", "PUZZLE", "CIRCLE",
         "SEASON", "TEACHER", "KITTEN", "BALLOT", "MIRROR", "CARROT", "ORANGE", "PEPPERS", "SUMMER", "WINTER",
         "MARBLE", "PILLOW", "TUNNEL", "COOKIE", "SILVER", "HAMMER", "CASTLE", "DINNER", "BOTTLE", "RIDDLE",
         "APPLE", "ATLAS", "BANJO", "DELTA", "EAGLE", "FIELD", "GLOBE", "HONEY", "IGLOO", "JELLY")
OBJECTS = ("marbles", "balls", "socks", "chips", "cards", "tokens", "beads", "pens")
COLORS = ("red", "blue", "green", "yellow", "white", "black", "purple", "orange")


# -------------------------------------------------------------------------------- math: algebra
def _m_linear(r):
    v = r.choice(VARS)
    x, a = r.randint(-12, 15), _nz(r, -9, 9)
    c = r.choice([k for k in range(-9, 10) if k != a])
    b = r.randint(-30, 30)
    d = a * x + b - c * x
    lhs, rhs = _poly([a, b], v), _poly([c, d], v)
    return r.choice([f"Solve for ${v}$: ${lhs} = {rhs}$.", f"What value of ${v}$ satisfies ${lhs} = {rhs}$?",
                     f"Find ${v}$ if ${lhs} = {rhs}$.", f"If ${lhs} = {rhs}$, what is the value of ${v}$?"])


def _m_linear_expr(r):
    x, a, b = r.randint(-10, 12), _nz(r, -8, 8), r.randint(-20, 20)
    p, q = _nz(r, -6, 6), r.randint(-15, 15)
    return r.choice([f"If ${_poly([a, b])} = {a * x + b}$, what is the value of ${_poly([p, q])}$?",
                     f"Given that ${_poly([a, b])} = {a * x + b}$, find ${_poly([p, q])}$.",
                     f"Suppose ${_poly([a, b])} = {a * x + b}$. Compute ${_poly([p, q])}$."])


def _m_quadratic(r):
    r1, r2, k = r.randint(-12, 12), r.randint(-12, 12), r.choice([1, 1, 1, 2, 3])
    c = [k, -k * (r1 + r2), k * r1 * r2]
    if r.random() < 0.3 and c[2]:
        eq = f"{_poly([c[0], c[1], 0])} = {-c[2]}"
    else:
        eq = f"{_poly(c)} = 0"
    return r.choice([f"What is the sum of the roots of ${eq}$?", f"What is the product of the roots of ${eq}$?",
                     f"Find the positive difference between the solutions of ${eq}$.",
                     f"Find all solutions to ${eq}$. Enter all the solutions, separated by commas.",
                     f"What is the largest value of $x$ such that ${eq}$?",
                     f"What is the smallest value of $x$ that satisfies ${eq}$?",
                     f"The equation ${eq}$ has two solutions $a$ and $b$. What is $a^2 + b^2$?"])


def _m_system(r):
    x, y = r.randint(-9, 12), r.randint(-9, 12)
    while True:
        a1, b1, a2, b2 = (_nz(r, -7, 7) for _ in range(4))
        if a1 * b2 != a2 * b1:
            break
    e1 = f"{_terms([(a1, 'x'), (b1, 'y')])} = {a1 * x + b1 * y}"
    e2 = f"{_terms([(a2, 'x'), (b2, 'y')])} = {a2 * x + b2 * y}"
    ask = r.choice(["what is the value of $x + y$?", "what is the value of $xy$?", "what is $x - y$?",
                    "what is the value of $x$?", "what is $y$?", "find $2x + y$."])
    return r.choice([f"If ${e1}$ and ${e2}$, {ask}",
                     f"Solve the system\n\\begin{{align*}}\n{e1.replace(' = ', ' &= ')},\\\\\n"
                     f"{e2.replace(' = ', ' &= ')}.\n\\end{{align*}}\nExpress your answer as an ordered pair $(x, y)$.",
                     f"Find the ordered pair $(x, y)$ that satisfies ${e1}$ and ${e2}$."])


def _m_fractions(r):
    a, b, c, d = r.randint(1, 15), r.randint(2, 16), r.randint(1, 15), r.randint(2, 16)
    op = r.choice(["+", "-", "\\cdot", "\\div"])
    expr = f"\\frac{{{a}}}{{{b}}} {op} \\frac{{{c}}}{{{d}}}"
    return r.choice([f"Simplify ${expr}$. Express your answer as a common fraction.",
                     f"What is ${expr}$? Express your answer in simplest form.",
                     f"Compute ${expr}$ and write the result as a fraction in lowest terms.",
                     f"Find the value of ${expr}$."])


def _m_exponents(r):
    b, m, n, k = r.choice([2, 3, 5, 7, 10, "a", "x"]), r.randint(2, 9), r.randint(2, 9), r.randint(1, 8)
    form = r.choice([f"\\frac{{{b}^{m} \\cdot {b}^{n}}}{{{b}^{k}}}", f"({b}^{m})^{n} \\div {b}^{{{m * n - k}}}",
                     f"{b}^{m} \\cdot {b}^{n} \\cdot {b}^{{-{k}}}"])
    if isinstance(b, str):
        return r.choice([f"Simplify ${form}$.", f"Write ${form}$ as a single power of ${b}$."])
    return r.choice([f"What is the value of ${form}$?", f"Simplify ${form}$ and express your answer as an integer "
                     "or a common fraction.", f"Evaluate ${form}$."])


def _m_radical(r):
    s, m = r.randint(2, 15), r.choice([2, 3, 5, 6, 7, 10, 11, 13, 14, 15, 17, 19, 21, 22, 23])
    n = s * s * m
    a, b = r.randint(2, 30), r.randint(2, 30)
    return r.choice([f"Express $\\sqrt{{{n}}}$ in simplest radical form.",
                     f"Write $\\sqrt{{{n}}}$ as $a\\sqrt{{b}}$ with $b$ square-free. What is $a + b$?",
                     f"Simplify $\\sqrt{{{a}}} \\cdot \\sqrt{{{b}}} \\cdot \\sqrt{{{m}}}$ completely.",
                     f"Rationalize the denominator: $\\frac{{{a}}}{{\\sqrt{{{m}}}}}$.",
                     f"Simplify $\\sqrt{{{n}}} + \\sqrt{{{m * r.randint(1, 9) ** 2}}}$."])


def _m_evaluate(r):
    x, y = _nz(r, -6, 7), _nz(r, -6, 7)
    terms = [(r.randint(-4, 4), "x^2"), (r.randint(-5, 5), "xy"), (r.randint(-4, 4), "y^2"),
             (r.randint(-6, 6), "x"), (r.randint(-9, 9), "")]
    e = _terms(terms)
    return r.choice([f"Evaluate ${e}$ when $x = {x}$ and $y = {y}$.",
                     f"What is the value of ${e}$ if $x = {x}$ and $y = {y}$?",
                     f"If $x = {x}$ and $y = {y}$, compute ${e}$."])


def _m_lines(r):
    a, b, c, d = (r.randint(-10, 10) for _ in range(4))
    if a == c:
        c = a + r.randint(1, 6)
    p, q = f"({a}, {b})", f"({c}, {d})"
    return r.choice([f"What is the slope of the line containing the points ${p}$ and ${q}$? Express your "
                     "answer as a common fraction.",
                     f"What is the $y$-intercept of the line passing through ${p}$ and ${q}$?",
                     f"The line through ${p}$ and ${q}$ has equation $y = mx + b$. What is $m + b$?",
                     f"What are the coordinates of the midpoint of the segment with endpoints ${p}$ and ${q}$?",
                     f"A line passes through ${p}$ and is perpendicular to the line through ${p}$ and ${q}$. "
                     "What is its slope?",
                     f"Find the equation of the line through ${p}$ and ${q}$. Write it in the form $y = mx + b$."])


def _m_inequality(r):
    k, c = _nz(r, 2, 7), r.randint(-10, 10)
    lo = r.randint(-30, 10)
    hi = lo + r.randint(10, 60)
    a, b = _nz(r, 2, 9), r.randint(-20, 20)
    return r.choice([f"How many integers $n$ satisfy ${lo} \\le {_poly([k, c], 'n')} < {hi}$?",
                     f"What is the smallest integer $x$ such that ${_poly([a, b])} > {hi}$?",
                     f"What is the largest integer $x$ for which ${_poly([-a, b])} \\ge {lo}$?",
                     f"Find all $x$ such that $|x - {c}| < {k}$. Express your answer in interval notation.",
                     f"How many positive integers $x$ satisfy ${_poly([a, b])} \\le {hi + a * 5}$?"])


def _m_absolute(r):
    a, b, c = _nz(r, 1, 6), r.randint(-15, 15), r.randint(1, 25)
    e = f"|{_poly([a, b])}| = {c}"
    return r.choice([f"What is the sum of all values of $x$ such that ${e}$?",
                     f"What is the product of all solutions of ${e}$? Express your answer as a common fraction.",
                     f"Find the positive difference between the two solutions of ${e}$.",
                     f"Solve ${e}$ for $x$. Enter all solutions, separated by commas."])


def _m_vertex(r):
    h, k, a = r.randint(-9, 9), r.randint(-20, 20), r.choice([1, 1, 2, 3, -1, -2])
    c = [a, -2 * a * h, a * h * h + k]
    f = _poly(c)
    ext = "minimum" if a > 0 else "maximum"
    return r.choice([f"What is the {ext} value of the expression ${f}$ for real $x$?",
                     f"The graph of $y = {f}$ is a parabola. What are the coordinates of its vertex?",
                     f"For what value of $x$ does ${f}$ attain its {ext} value?",
                     f"The parabola $y = {f}$ has vertex $(h, k)$. What is $h + k$?"])


def _m_percent(r):
    p, q, a, b = r.choice([5, 10, 12, 15, 20, 25, 30, 40, 45, 60, 75, 120, 150]), r.randint(2, 80) * 10, \
        r.randint(1, 7), r.randint(2, 9)
    q = q * 2  # a multiple of 20: p % of it is whole
    return r.choice([f"What is ${p}\\%$ of ${q}$?", f"${p}\\%$ of what number is ${p * q // 100}$?",
                     f"If $\\frac{{{a}}}{{{b}}}$ of a number is ${a * r.randint(2, 40)}$, what is the number? Express "
                     "your answer as a common fraction if needed.",
                     f"A price of $\\${q}$ is increased by ${p}\\%$ and then decreased by ${p}\\%$. What is the "
                     "final price, in dollars?",
                     f"The ratio of $a$ to $b$ is ${a}:{b}$ and $a + b = {(a + b) * r.randint(2, 20)}$. What is $b$?"])


# ---------------------------------------------------------------------------- math: number theory
def _m_gcd(r):
    g = r.choice([2, 3, 4, 6, 7, 8, 9, 12, 14, 15, 18, 21, 24, 36])
    m, n = r.randint(2, 40), r.randint(2, 40)
    A, B = g * m, g * n
    if A == B:
        B += g
    return r.choice([f"What is the greatest common divisor of ${A}$ and ${B}$?",
                     f"What is the least common multiple of ${A}$ and ${B}$?",
                     f"What is the sum of the greatest common divisor and the least common multiple of ${A}$ and "
                     f"${B}$?",
                     f"Find $\\gcd({A}, {B}) \\cdot \\operatorname{{lcm}}({A}, {B})$.",
                     f"Find the greatest common factor of ${A}$, ${B}$ and ${g * r.randint(2, 30)}$.",
                     f"What is the smallest positive integer that is a multiple of both ${A}$ and ${B}$?"])


def _m_remainder(r):
    N, m, a, k = r.randint(1_000, 999_999), r.randint(3, 19), r.randint(2, 19), r.randint(10, 200)
    n = r.randint(20, 300)
    return r.choice([f"What is the remainder when ${N}$ is divided by ${m}$?",
                     f"What is the remainder when ${a}^{{{k}}}$ is divided by ${m}$?",
                     f"Find the remainder when $1 + 2 + 3 + \\cdots + {n}$ is divided by ${m}$.",
                     f"What is the remainder when ${r.randint(100, 999)} \\cdot {r.randint(100, 999)} \\cdot "
                     f"{r.randint(100, 999)}$ is divided by ${m}$?",
                     f"What is ${N} \\pmod{{{m}}}$? Express your answer as an integer from $0$ to ${m - 1}$.",
                     f"Today is a {r.choice(DAYS)}."
                     f" What day of the week will it be ${N % 5000 + 10}$ days from now?"])


def _m_divisors(r):
    ps = r.sample([2, 3, 5, 7, 11, 13], r.randint(2, 3))
    n = 1
    for p in ps:
        n *= p ** r.randint(1, 4 if p < 5 else 2)
    return r.choice([f"How many positive divisors does ${n}$ have?",
                     f"What is the sum of the positive divisors of ${n}$?",
                     f"What is the sum of the distinct prime factors of ${n}$?",
                     f"What is the largest prime factor of ${n}$?",
                     f"How many positive divisors of ${n}$ are perfect squares?",
                     f"How many of the positive divisors of ${n}$ are even?",
                     f"What is the product of the distinct prime factors of ${n}$?"])


def _m_digits(r):
    a, b, x, y = r.randint(2, 19), r.randint(10, 400), r.randint(3, 20), r.randint(3, 20)
    return r.choice([f"What is the units digit of ${a}^{{{b}}}$?", f"What is the tens digit of ${a}^{{{b % 60 + 5}}}$?",
                     f"What is the sum of the digits of the decimal representation of $2^{{{x}}} \\times 5^{{{y}}}$?",
                     f"How many digits does $2^{{{x}}} \\cdot 5^{{{y}}}$ have when written in base 10?",
                     f"What is the sum of the digits of $2^{{{x}}}$?",
                     f"How many positive two-digit integers have digits whose sum is ${r.randint(2, 17)}$?",
                     f"What is the units digit of the sum $1! + 2! + 3! + \\cdots + {x}!$?"])


def _m_base(r):
    b, n = r.randint(2, 9), r.randint(20, 2000)
    digits = "".join(str(r.randint(0, b - 1)) for _ in range(r.randint(3, 5)))
    digits = str(r.randint(1, b - 1)) + digits[1:]
    d2 = str(r.randint(1, b - 1)) + "".join(str(r.randint(0, b - 1)) for _ in range(r.randint(1, 3)))
    return r.choice([f"Convert ${n}_{{10}}$ to base ${b}$.", f"Express ${digits}_{b}$ in base 10.",
                     f"What is ${digits}_{b} + {d2}_{b}$? Express your answer in base ${b}$.",
                     f"What is the base-${b}$ representation of the decimal number ${n}$?",
                     f"What is ${digits}_{b} - {d2}_{b}$ in base ${b}$?",
                     f"How many digits does the base-${b}$ representation of ${n}$ have?"])


def _m_congruence(r):
    m = r.choice([7, 9, 11, 13, 17, 19, 23, 25, 29, 31, 37, 41, 43, 47])
    a = r.choice([k for k in range(2, m) if gcd(k, m) == 1])
    c = r.randint(1, m - 1)
    return r.choice([f"Find the smallest positive integer $x$ such that ${a}x \\equiv {c} \\pmod{{{m}}}$.",
                     f"What is the modular inverse of ${a}$ modulo ${m}$? Express your answer as an integer from $0$ "
                     f"to ${m - 1}$.",
                     f"How many integers $n$ with $1 \\le n \\le {m * r.randint(5, 40)}$ satisfy "
                     f"$n \\equiv {c} \\pmod{{{m}}}$?",
                     f"Find the largest three-digit integer that is congruent to ${c}$ modulo ${m}$."])


def _m_multiples(r):
    k, N = r.randint(3, 29), r.randint(100, 5000)
    p, q = r.sample([2, 3, 4, 5, 6, 7, 8, 9, 10, 12], 2)
    A = r.randint(1, 200)
    B = A + r.randint(100, 2000)
    a = r.randint(1, 5)
    return r.choice([f"How many positive multiples of ${k}$ are less than ${N}$?",
                     f"How many integers between ${A}$ and ${B}$ are divisible by both ${p}$ and ${q}$?",
                     f"How many positive three-digit integers are divisible by ${k}$?",
                     f"What is the smallest positive integer divisible by each of the integers ${a}$ through "
                     f"${a + r.randint(3, 7)}$?",
                     f"How many positive integers less than ${N}$ are divisible by ${p}$ or ${q}$?",
                     f"What is the greatest multiple of ${k}$ that is less than ${N}$?"])


# --------------------------------------------------------------------- math: counting, probability
def _m_binom(r):
    n = r.randint(5, 40)
    k = r.randint(1, n - 1)
    return r.choice([f"Find the value of $\\dbinom{{{n}}}{{{k}}}$.", f"Evaluate $\\binom{{{n}}}{{{k}}}$.",
                     f"What is $\\dbinom{{{n}}}{{{k}}} + \\dbinom{{{n}}}{{{k - 1}}}$?",
                     f"What is the coefficient of $x^{k}$ in the expansion of $(x + 1)^{{{n}}}$?",
                     f"What is the coefficient of $x^{{{min(k, 6)}}}$ in the expansion of "
                     f"$(x + {r.randint(2, 4)})^{{{min(n, 9)}}}$?"])


def _m_committee(r):
    n, k = r.randint(6, 25), r.randint(2, 5)
    b, g = r.randint(3, 12), r.randint(3, 12)
    grp = r.choice(["club", "team", "class", "choir", "chess club", "book club", "robotics team"])
    return r.choice([f"In how many ways can a committee of ${k}$ people be chosen from a {grp} of ${n}$ members?",
                     f"A {grp} has ${n}$ members. In how many ways can it choose a president, a vice-president and a "
                     "treasurer, if no member can hold more than one office?",
                     f"A {grp} has ${b}$ boys and ${g}$ girls. In how many ways can a committee of "
                     f"${min(k, b)}$ boys and ${min(k - 1, g)}$ girls be chosen?",
                     f"In how many ways can ${k}$ people be seated in a row of ${n}$ chairs?",
                     f"In how many ways can ${min(n, 9)}$ people sit around a round table if rotations of a seating "
                     "are considered the same?",
                     f"A {grp} of ${n}$ must send ${k}$ members to a meeting, and two particular members refuse to go "
                     "together. In how many ways can the delegation be chosen?"])


def _m_arrangements(r):
    w = r.choice(WORDS)
    return r.choice([f"How many distinct arrangements of the letters in the word {w} are there?",
                     f"In how many ways can the letters of the word {w} be arranged?",
                     f"How many different ways are there to arrange the letters of {w} if the first letter must stay "
                     "first?"])


def _m_dice(r):
    s = r.choice([4, 6, 8, 10, 12, 20])
    t = r.randint(3, 2 * s - 1)
    k = r.randint(1, s)
    dice = "Two fair ${}$-sided dice".format(s)
    return r.choice([f"{dice} are rolled. What is the probability that the sum of the numbers rolled is ${t}$? "
                     "Express your answer as a common fraction.",
                     f"{dice} are rolled. What is the probability that at least one die shows a ${k}$? Express your "
                     "answer as a common fraction.",
                     f"{dice} are rolled. What is the probability that the product of the two numbers is even?",
                     f"{dice} are rolled. What is the probability that the two numbers differ by "
                     f"${r.randint(1, s - 1)}$?",
                     f"A fair ${s}$-sided die is rolled ${r.randint(2, 4)}$ times. What is the probability that every "
                     f"roll is greater than ${r.randint(1, s - 1)}$? Express your answer as a common fraction.",
                     f"{dice} are rolled. What is the expected value of the larger of the two numbers?"])


def _m_coins(r):
    n = r.randint(3, 12)
    k = r.randint(0, n)
    return r.choice([f"A fair coin is flipped ${n}$ times. What is the probability of getting exactly ${k}$ heads? "
                     "Express your answer as a common fraction.",
                     f"A fair coin is flipped ${n}$ times. What is the probability of getting at least ${max(k, 1)}$ "
                     "heads?",
                     f"A fair coin is tossed ${n}$ times. What is the probability that no two consecutive tosses are "
                     "both heads?",
                     f"A coin lands heads with probability $\\frac{{{r.randint(1, 4)}}}{{5}}$. If it is flipped ${n}$ "
                     f"times, what is the expected number of heads?"])


def _m_marbles(r):
    obj = r.choice(OBJECTS)
    c1, c2, c3 = r.sample(COLORS, 3)
    a, b, c = r.randint(2, 12), r.randint(2, 12), r.randint(1, 10)
    box = r.choice(["A bag", "A box", "A jar", "An urn", "A drawer"])
    return r.choice([f"{box} contains ${a}$ {c1} {obj} and ${b}$ {c2} {obj}. Two {obj} are drawn at random without "
                     f"replacement. What is the probability that both are {c1}? Express your answer as a common "
                     "fraction.",
                     f"{box} contains ${a}$ {c1}, ${b}$ {c2} and ${c}$ {c3} {obj}. If one is drawn at random, what is "
                     f"the probability that it is not {c2}?",
                     f"{box} holds ${a}$ {c1} {obj} and ${b}$ {c2} {obj}. Two are drawn with replacement. What is the "
                     "probability that they are different colors?",
                     f"{box} contains ${a}$ {c1} {obj} and some {c2} {obj}. The probability of drawing a {c1} one is "
                     f"${_frac(Fraction(a, a + b))}$. How many {c2} {obj} are there?"])


def _m_handshake(r):
    n = r.randint(5, 40)
    who = r.choice(["people", "guests", "players", "students", "delegates"])
    ev = r.choice(["party", "meeting", "conference", "reunion", "tournament"])
    return r.choice([f"At a {ev}, each of ${n}$ {who} shakes hands exactly once with each of the other {who}. How "
                     "many handshakes take place?",
                     f"In a round-robin tournament with ${n}$ teams, each team plays every other team "
                     f"{r.choice(['once', 'twice', 'three times'])}. How many games are played?",
                     f"How many diagonals does a convex polygon with ${n}$ sides have?",
                     f"How many line segments can be drawn between ${n}$ points, no three of which are collinear?"])


def _m_count_integers(r):
    N, d = r.randint(50, 5000), r.randint(3, 27)
    return r.choice([f"How many positive integers less than ${N}$ are perfect squares?",
                     f"How many positive integers less than ${N * 10}$ are perfect cubes?",
                     f"How many three-digit positive integers have digits whose sum is ${d}$?",
                     f"How many positive integers less than ${N}$ are both perfect squares and perfect cubes?",
                     f"How many even three-digit integers have all distinct digits and no digit equal to "
                     f"${r.randint(0, 9)}$?",
                     f"How many four-digit positive integers have digits that are strictly increasing and end in "
                     f"${r.randint(4, 9)}$?"])


# ------------------------------------------------------------------------------ math: geometry
def _m_rectangle(r):
    w, k, a = r.randint(2, 30), r.randint(2, 5), r.randint(1, 12)
    return r.choice([f"A rectangle has a perimeter of ${2 * (w + k * w)}$ units and its length is ${k}$ times its "
                     "width. What is the area of the rectangle, in square units?",
                     f"The length of a rectangle is ${a}$ cm more than its width, and its area is ${w * (w + a)}$ "
                     "square cm. What is its perimeter, in cm?",
                     f"A square has the same perimeter as a rectangle measuring ${w}$ by ${w + 2 * a}$. What is the "
                     "area of the square?",
                     f"A rectangular garden is ${w}$ feet by ${w + a}$ feet and is surrounded by a path ${k}$ feet "
                     "wide. What is the area of the path, in square feet?"])


def _m_pythagorean(r):
    m = r.randint(2, 8)
    n = r.randint(1, m - 1)
    s = r.randint(1, 4)
    a, b, c = s * (m * m - n * n), s * 2 * m * n, s * (m * m + n * n)
    x, y = r.randint(1, 15), r.randint(1, 15)
    return r.choice([f"A right triangle has legs of length ${a}$ and ${b}$. What is the length of its hypotenuse?",
                     f"The hypotenuse of a right triangle is ${c}$ units and one leg is ${a}$ units. What is the area "
                     "of the triangle, in square units?",
                     f"A right triangle has legs of length ${x}$ and ${y}$. What is the length of the hypotenuse? "
                     "Express your answer in simplest radical form.",
                     f"A ${c}$-foot ladder leans against a wall with its foot ${a}$ feet from the wall. How high up "
                     "the wall does the ladder reach?",
                     f"In right triangle $ABC$ with $\\angle C = 90^\\circ$, $AC = {a}$ and $AB = {c}$. What is "
                     "$\\sin A$? Express your answer as a common fraction."])


def _m_circle(r):
    k, h, j, rad = r.randint(1, 20), r.randint(-9, 9), r.randint(-9, 9), r.randint(1, 12)
    eq = f"{_terms([(1, 'x^2'), (-2 * h, 'x'), (1, 'y^2'), (-2 * j, 'y'), (h * h + j * j - rad * rad, '')])} = 0"
    return r.choice([f"A circle has area ${k * k}\\pi$ square units. What is its circumference? Express your answer in "
                     "terms of $\\pi$.",
                     f"A circle has circumference ${2 * k}\\pi$. What is its area? Express your answer in terms of "
                     "$\\pi$.",
                     f"What is the area of a circle with diameter ${k}$? Express your answer in terms of $\\pi$.",
                     f"What is the radius of the circle with equation ${eq}$?",
                     f"Find the center of the circle with equation ${eq}$.",
                     f"A sector of a circle of radius ${rad}$ has a central angle of "
                     f"${r.choice([30, 45, 60, 72, 90, 120, 150])}^\\circ$. What is the area of the sector? Express "
                     "your answer in terms of $\\pi$."])


def _m_triangle_area(r):
    while True:
        p = [(r.randint(-8, 10), r.randint(-8, 10)) for _ in range(3)]
        area2 = abs((p[1][0] - p[0][0]) * (p[2][1] - p[0][1]) - (p[2][0] - p[0][0]) * (p[1][1] - p[0][1]))
        if area2:
            break
    pts = ", ".join(f"$({x}, {y})$" for x, y in p[:2]) + f" and $({p[2][0]}, {p[2][1]})$"
    return r.choice([f"What is the area, in square units, of the triangle with vertices {pts}?",
                     f"Find the area of the triangle whose vertices are {pts}.",
                     f"A triangle has vertices {pts}. What is the length of its longest side? Express your answer in "
                     "simplest radical form."])


def _m_polygon(r):
    n = r.choice([k for k in range(3, 37) if 360 % k == 0] + [7, 11, 13, 14])
    e = r.choice([10, 12, 15, 18, 20, 24, 30, 36, 40, 45, 60, 72])
    return r.choice([f"What is the measure, in degrees, of each interior angle of a regular polygon with ${n}$ sides?",
                     f"Each exterior angle of a regular polygon measures ${e}^\\circ$. How many sides does the polygon "
                     "have?",
                     f"What is the sum of the interior angles, in degrees, of a convex polygon with ${n + 2}$ sides?",
                     f"The interior angles of a convex polygon add up to ${180 * (n - 2)}^\\circ$. How many sides does "
                     "it have?"])


def _m_distance(r):
    a, b, c, d = (r.randint(-12, 12) for _ in range(4))
    return r.choice([f"What is the distance between the points $({a}, {b})$ and $({c}, {d})$? Express your answer in "
                     "simplest radical form.",
                     f"How far is the point $({a}, {b})$ from the origin?",
                     f"What is the distance from the point $({a}, {b})$ to the line $y = {_poly([c or 1, d])}$?"])


def _m_solids(r):
    rad, h, a, b, c = r.randint(1, 12), r.randint(1, 20), r.randint(1, 12), r.randint(1, 12), r.randint(1, 12)
    return r.choice([f"A cylinder has radius ${rad}$ and height ${h}$. What is its volume? Express your answer in "
                     "terms of $\\pi$.",
                     f"What is the surface area of a sphere with radius ${rad}$? Express your answer in terms of "
                     "$\\pi$.",
                     f"A cube has surface area ${6 * a * a}$ square units. What is its volume, in cubic units?",
                     f"A rectangular box measures ${a}$ by ${b}$ by ${c}$. What is the length of its longest "
                     "diagonal? Express your answer in simplest radical form.",
                     f"A cone has radius ${rad}$ and height ${h}$. What is its volume? Express your answer in terms of "
                     "$\\pi$.",
                     f"How many cubes with edge length ${a}$ fit inside a box measuring ${a * b}$ by ${a * c}$ by "
                     f"${a * h}$?"])


def _m_angles(r):
    A, B = r.randint(20, 100), r.randint(20, 100)
    while A + B >= 170:
        B -= 30
    p, s = r.randint(1, 9), r.randint(1, 9)
    q = r.choice([v for v in range(1, 10) if gcd(v, p) == 1 and v != p] or [1])
    k, m = r.randint(2, 5), r.randint(5, 40)
    return r.choice([f"In triangle $ABC$, $\\angle A = {A}^\\circ$ and $\\angle B = {B}^\\circ$. What is the measure "
                     "of $\\angle C$, in degrees?",
                     f"The angles of a triangle are in the ratio ${p}:{q}:{s}$. What is the measure, in degrees, of "
                     "the largest angle?",
                     f"Two angles are supplementary, and one is ${m}^\\circ$ more than ${k}$ times the other. What is "
                     "the measure of the smaller angle, in degrees?",
                     f"Two angles are complementary, and their ratio is ${p}:{q}$. What is the measure, in degrees, of "
                     "the larger angle?",
                     f"An isosceles triangle has a vertex angle of ${A}^\\circ$. What is the measure of each base "
                     "angle, in degrees?"])


# ----------------------------------------------------------------------------- math: sequences
def _m_arithmetic(r):
    a, d, n = r.randint(-20, 30), _nz(r, -9, 12), r.randint(10, 120)
    i, j = r.randint(2, 8), r.randint(9, 20)
    return r.choice([f"The first term of an arithmetic sequence is ${a}$ and the common difference is ${d}$. What is "
                     f"the ${_ordinal(n)}$ term?",
                     f"What is the sum of the first ${n}$ terms of the arithmetic sequence ${a}, {a + d}, {a + 2 * d}, "
                     "\\ldots$?",
                     f"The ${_ordinal(i)}$ term of an arithmetic sequence is ${a + (i - 1) * d}$ and the "
                     f"${_ordinal(j)}$ term is ${a + (j - 1) * d}$. What is the ${_ordinal(n)}$ term?",
                     f"How many terms does the arithmetic sequence ${a}, {a + d}, {a + 2 * d}, \\ldots, "
                     f"{a + (n - 1) * d}$ have?"])


def _m_geometric(r):
    a, q, n = r.randint(1, 12), r.choice([2, 3, -2, -3, Fraction(1, 2), Fraction(1, 3), Fraction(-1, 2),
                                          Fraction(2, 3), Fraction(3, 4)]), r.randint(4, 12)
    seq = ", ".join(f"{_frac(a * q ** e)}" for e in range(3))
    out = [f"What is the ${_ordinal(n)}$ term of the geometric sequence ${seq}, \\ldots$? Express your answer as a "
           "common fraction if needed.",
           f"The first term of a geometric sequence is ${a}$ and the common ratio is ${_frac(q)}$. What is the sum of "
           f"the first ${n}$ terms?"]
    if abs(q) < 1:
        terms = " + ".join(_frac(a * q ** e) for e in range(3)).replace("+ -", "- ")
        out.append(f"Evaluate the infinite geometric series ${terms} + \\cdots$.")
    return r.choice(out)


def _m_sums(r):
    a, n, k = r.randint(1, 40), r.randint(10, 150), r.randint(2, 12)
    b = a + 2 * r.randint(10, 200)
    return r.choice([f"What is the sum of all odd integers from ${a | 1}$ to ${b | 1}$, inclusive?",
                     f"What is the sum of all even integers between ${a}$ and ${b}$?",
                     f"Compute $1 + 2 + 3 + \\cdots + {n}$.",
                     f"What is the sum of the first ${n}$ positive multiples of ${k}$?",
                     f"Compute $1^2 + 2^2 + 3^2 + \\cdots + {min(n, 40)}^2$.",
                     f"Compute $1 - 2 + 3 - 4 + \\cdots + {2 * n - 1} - {2 * n}$.",
                     f"What is the value of $\\sum_{{k=1}}^{{{n}}} (2k - 1)$?"])


# ----------------------------------------------------------------------------- math: functions
def _m_function_value(r):
    f = _poly([r.randint(-5, 5) or 1, r.randint(-9, 9), r.randint(-12, 12)])
    k, j = r.randint(-6, 6), r.randint(-6, 6)
    a, b, c, d = _nz(r, -5, 5), r.randint(-9, 9), _nz(r, 1, 5), r.randint(-9, 9)
    return r.choice([f"If $f(x) = {f}$, what is the value of $f({k})$?", f"Let $f(x) = {f}$. Find $f({k}) - f({j})$.",
                     f"If $f(x) = \\frac{{{_poly([a, b])}}}{{{_poly([c, d])}}}$, what is $f({k})$? Express your answer "
                     "as a common fraction.",
                     f"Given $f(x) = {f}$, for how many integers $x$ with ${-abs(k) - 2} \\le x \\le {abs(j) + 2}$ is "
                     "$f(x) > 0$?"])


def _m_compose(r):
    f = _poly([_nz(r, -6, 6), r.randint(-9, 9)])
    g = _poly([_nz(r, -3, 3), r.randint(-5, 5), r.randint(-9, 9)])
    k = r.randint(-5, 5)
    return r.choice([f"Let $f(x) = {f}$ and $g(x) = {g}$. What is $f(g({k}))$?",
                     f"Let $f(x) = {f}$ and $g(x) = {g}$. What is $g(f({k}))$?",
                     f"If $f(x) = {f}$, find $f(f({k}))$.",
                     f"Let $f(x) = {f}$ and $g(x) = {g}$. Express $f(g(x))$ as a polynomial in $x$.",
                     f"Let $f(x) = {f}$ and $g(x) = {g}$. Find $f(g(x)) - g(f(x))$."])


def _m_inverse(r):
    a, b, c, k = _nz(r, -8, 8), r.randint(-12, 12), _nz(r, 2, 7), r.randint(-20, 20)
    return r.choice([f"If $f(x) = {_poly([a, b])}$, what is $f^{{-1}}({k})$?",
                     f"Let $f(x) = \\frac{{{_poly([a, b])}}}{{{c}}}$. Find $f^{{-1}}(x)$.",
                     f"Find the inverse of the function $f(x) = \\frac{{x + {abs(b) + 1}}}{{x - {c}}}$.",
                     f"If $f(x) = {_poly([a, b])}$ and $g(x) = f^{{-1}}(x)$, what is $g({k}) + g({k + a})$?"])


def _m_piecewise(r):
    a, b, c, d, e = _nz(r, -5, 5), r.randint(-9, 9), r.randint(-4, 4), _nz(r, -3, 3), r.randint(-9, 9)
    p, q = r.randint(-8, 8), r.randint(-8, 8)
    f = (f"\\[f(x) = \\left\\{{\n\\begin{{array}}{{cl}} {_poly([a, b])} & \\text{{if }} x < {c}, \\\\\n"
         f"{_poly([d, 0, e])} & \\text{{if }} x \\ge {c}.\n\\end{{array}}\n\\right.\\]")
    return r.choice([f"Let {f} Find $f({p}) + f({q})$.", f"Let {f} What is $f(f({p}))$?",
                     f"Let {f} How many values of $x$ satisfy $f(x) = {r.randint(-5, 10)}$?"])


def _m_domain(r):
    a, b, s, p = r.randint(1, 30), _nz(r, 1, 6), r.randint(-9, 9), r.randint(-20, 20)
    h, k = r.randint(-9, 9), r.randint(-9, 9)
    return r.choice([f"What is the domain of the function $f(x) = \\sqrt{{{a} - {b}x}}$? Express your answer in "
                     "interval notation.",
                     f"For what values of $x$ is the expression $\\frac{{1}}{{{_poly([1, s, p])}}}$ undefined?",
                     f"What is the range of the function $f(x) = |x {'-' if h >= 0 else '+'} {abs(h)}| "
                     f"{'+' if k >= 0 else '-'} {abs(k)}$? Express your answer in interval notation.",
                     f"What is the domain of $g(x) = \\frac{{\\sqrt{{x - {h}}}}}{{x - {h + a}}}$?"])


def _m_parameter(r):
    a, b, c, k = _nz(r, -6, 6), r.randint(-9, 9), r.randint(-12, 12), _nz(r, -5, 5)
    v = a * k * k + b * k + c
    return r.choice([f"If $f(x) = ax^2 {'+' if b >= 0 else '-'} {abs(b)}x {'+' if c >= 0 else '-'} {abs(c)}$ and "
                     f"$f({k}) = {v}$, what is the value of $a$?",
                     f"The point $({k}, {v})$ lies on the graph of "
                     f"$y = {_poly([a, 0, 0])} + bx {'+' if c >= 0 else '-'} {abs(c)}$. What is $b$?",
                     f"For what value of $c$ does the equation ${_poly([1, 2 * b, 0])} + c = 0$ have exactly one real "
                     "solution?"])


MATH_TEMPLATES: tuple[Callable[[random.Random], str], ...] = (
    _m_linear, _m_linear_expr, _m_quadratic, _m_system, _m_fractions, _m_exponents, _m_radical, _m_evaluate,
    _m_lines, _m_inequality, _m_absolute, _m_vertex, _m_percent,
    _m_gcd, _m_remainder, _m_divisors, _m_digits, _m_base, _m_congruence, _m_multiples,
    _m_binom, _m_committee, _m_arrangements, _m_dice, _m_coins, _m_marbles, _m_handshake, _m_count_integers,
    _m_rectangle, _m_pythagorean, _m_circle, _m_triangle_area, _m_polygon, _m_distance, _m_solids, _m_angles,
    _m_arithmetic, _m_geometric, _m_sums,
    _m_function_value, _m_compose, _m_inverse, _m_piecewise, _m_domain, _m_parameter)


def _generate(templates, size: int, seed: int) -> list[str]:
    """Up to ``size`` distinct texts, templates taken in turn (a template whose variety runs out
    is skipped), from one seeded stream: the same list for the same arguments."""
    r, seen, out = random.Random(seed), set(), []
    for i in range(20 * size):
        if len(out) >= size:
            break
        t = templates[i % len(templates)](r)
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


def math_problems(size: int) -> list[str]:
    """``size`` distinct competition-math problems (question text, LaTeX; no answer suffix)."""
    return _generate(MATH_TEMPLATES, size, MATH_SEED)


# ------------------------------------------------------------------------------------ chat
RECIPIENTS = ("your landlord", "a hiring manager", "your team at work", "a local newspaper editor", "your neighbour",
              "the city council", "a professor you admire", "your school's principal", "a potential investor",
              "an old friend you lost touch with", "your gym's manager", "a customer who complained",
              "the organisers of a charity run", "your sister", "a software vendor", "the head of a library")
ACTIONS = ("fix a leaking roof before winter", "sponsor a community garden", "allow remote work on Fridays",
           "extend a deadline by one week", "join a weekend hiking group", "donate old laptops to a school",
           "try a vegetarian menu for a month", "reduce single-use plastic in the office", "attend a poetry reading",
           "fund a bicycle lane on Main Street", "switch to a four-day work week", "adopt a rescue dog",
           "keep the library open later on weekdays", "mentor a junior colleague", "learn a second language",
           "volunteer at a food bank", "replace paper forms with an online system", "visit a small coastal town")
FORMS = ("haiku", "limerick", "sonnet", "short free-verse poem", "ballad of four stanzas", "six-word story",
         "short fable with a moral", "diary entry", "news headline and lead paragraph", "product slogan")
SUBJECTS = ("a rainy Monday morning", "the first snowfall of the year", "a lost umbrella", "a lighthouse at night",
            "a cat that refuses to move", "an old bicycle", "the smell of fresh bread", "a crowded train station",
            "a garden in late autumn", "a forgotten birthday", "learning to swim", "the last day of school",
            "a broken clock", "a thunderstorm over the sea", "moving to a new city", "a grandparent's kitchen",
            "a robot learning to paint", "the night shift at a hospital", "a quiet library", "a mountain sunrise")
PRODUCTS = ("a solar-powered phone charger", "a foldable electric scooter", "a smart water bottle",
            "a noise-cancelling sleep mask", "an ergonomic office chair", "a reusable beeswax food wrap",
            "a language-learning app", "a portable espresso maker", "a weather-proof hiking jacket",
            "a plant-watering sensor", "a budget-tracking notebook", "a wooden puzzle for toddlers")
AUDIENCES = ("busy parents", "university students", "retired travellers", "small-business owners",
             "first-time home buyers", "amateur athletes", "remote workers", "teenagers", "gardening enthusiasts")
TONES = ("formal", "friendly", "humorous", "concise", "enthusiastic", "calm and reassuring", "professional")
PERSONAS = ("a ship's captain from the 1800s", "a detective in a foggy city", "a medieval blacksmith",
            "a tour guide in an ancient city", "a personal fitness coach", "a strict but fair chess teacher",
            "a botanist on a remote island", "a friendly customer-support agent", "a museum curator",
            "a chef who only cooks with five ingredients", "an astronaut on a long mission",
            "a librarian who loves mysteries", "a career counsellor", "a wise old gardener",
            "a travel agent", "a sports commentator", "a patient piano teacher", "a village mayor",
            "a weather forecaster", "a zookeeper", "a retired sea captain", "a street magician",
            "an airline pilot", "a park ranger")
PROBLEMS = ("cannot decide which job offer to accept", "keeps procrastinating on a big project",
            "wants to start running but has never exercised", "is nervous about a job interview tomorrow",
            "is planning a trip on a very small budget", "wants to learn to cook healthy meals",
            "has trouble sleeping before exams", "is arguing with a roommate about chores",
            "wants to save money for a first car", "is preparing a speech for a friend's wedding")
PEOPLE_TRAITS = (("taller", "shorter"), ("older", "younger"), ("faster", "slower"), ("heavier", "lighter"))
SYLLOGISM = ("cats", "mammals", "pets", "birds", "animals", "flyers", "squares", "rectangles", "polygons",
             "violinists", "musicians", "teachers", "roses", "flowers", "red things", "cars", "vehicles",
             "electric machines", "poets", "writers", "painters")
CODE_TASKS = ("reverses the words in a sentence", "checks whether a string is a palindrome, ignoring punctuation",
              "returns the n-th Fibonacci number", "merges two sorted lists into one sorted list",
              "finds the most frequent element in a list", "removes duplicate values while keeping order",
              "counts the vowels in a string", "computes the greatest common divisor of two integers",
              "flattens a nested list of arbitrary depth", "rotates a matrix by 90 degrees",
              "finds the longest common prefix of a list of strings", "converts a Roman numeral to an integer",
              "checks whether two strings are anagrams", "returns all prime numbers below n",
              "groups a list of words by their first letter", "validates that brackets in a string are balanced",
              "computes the running average of a stream of numbers", "finds the second largest number in a list",
              "parses a date in the form YYYY-MM-DD and returns the weekday",
              "splits a list into chunks of a given size", "finds the k closest points to the origin",
              "implements binary search on a sorted list", "counts word frequencies in a text file",
              "returns the length of the longest increasing subsequence", "detects a cycle in a linked list",
              "finds the shortest path in an unweighted graph", "compresses a string using run-length encoding",
              "checks whether a number is a power of two", "transposes a list of lists",
              "returns the median of two sorted arrays")
LANGUAGES = ("Python", "JavaScript", "C++", "Rust", "Go", "Java", "TypeScript", "C")
CONSTRAINTS = ("", " Use O(n) time.", " Do not use any library functions.", " Include a few test cases.",
               " Add comments explaining each step.", " Handle empty input gracefully.",
               " Explain its time and space complexity.")
DATA_STRUCTURES = ("a stack", "a queue", "a hash map", "a binary search tree", "a heap", "a linked list",
                   "a trie", "a graph", "a set", "a deque", "an array", "a B-tree", "a skip list", "a bloom filter")
CS_CLASS = ("a LRU cache", "a min-heap", "a circular buffer", "a simple bank account with deposits and withdrawals",
            "a to-do list with priorities", "a rate limiter", "a matrix with addition and multiplication",
            "an undo/redo history", "a tiny key-value store that saves to a file", "a deck of playing cards")
COMPANIES = ("Northwind Labs", "Bluepeak Foods", "Orbitline Travel", "Greenfield Energy", "Quillsoft",
             "Harbor & Finch", "Atlas Robotics", "Maple Street Bakery", "Silverline Bank", "Cobalt Media")
CITIES = ("Lisbon", "Nairobi", "Osaka", "Toronto", "Valparaiso", "Krakow", "Melbourne", "Hanoi", "Reykjavik",
          "Marrakesh", "Edinburgh", "Bogota", "Tallinn", "Seville", "Kyoto", "Accra")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
ROLES = ("engineer", "designer", "accountant", "sales lead", "data analyst", "product manager", "nurse", "chef",
         "teacher", "lawyer")
STEM_PAIRS = (("mitosis", "meiosis"), ("weather", "climate"), ("speed", "velocity"), ("mass", "weight"),
              ("an element", "a compound"), ("a virus", "a bacterium"), ("nuclear fission", "nuclear fusion"),
              ("AC current", "DC current"), ("RAM", "disk storage"), ("TCP", "UDP"), ("an acid", "a base"),
              ("kinetic energy", "potential energy"), ("a comet", "an asteroid"), ("DNA", "RNA"),
              ("a compiler", "an interpreter"), ("heat", "temperature"), ("a series circuit", "a parallel circuit"),
              ("correlation", "causation"), ("precision", "accuracy"), ("a process", "a thread"),
              ("renewable energy", "non-renewable energy"), ("a star", "a planet"), ("osmosis", "diffusion"))
STEM_PROCESSES = ("photosynthesis", "the water cycle", "how vaccines train the immune system",
                  "how a refrigerator keeps food cold", "how GPS determines a location", "plate tectonics",
                  "how a rainbow forms", "how public-key encryption works", "how batteries store energy",
                  "how the heart pumps blood", "how airplanes generate lift", "how a search engine ranks pages",
                  "the greenhouse effect", "how tides are caused by the moon", "how neurons transmit signals",
                  "how solar panels produce electricity", "how an MRI scanner works", "how bread rises",
                  "how noise-cancelling headphones work", "how a hash function is used to store passwords")
HUMANITIES_TOPICS = ("the printing press", "the invention of the telephone", "the spread of public libraries",
                     "the rise of cities in the industrial era", "the Silk Road trade routes",
                     "the invention of writing",
                     "the growth of international tourism", "social media", "the railway", "the Renaissance",
                     "the Enlightenment", "the abolition of slavery", "the space race", "mass vaccination campaigns",
                     "the invention of photography", "the spread of universal education", "the Olympic Games",
                     "the first public museums", "the invention of the mechanical clock", "paper money",
                     "the postal service", "radio broadcasting", "the encyclopaedia")
DOMAINS = ("politics", "family life", "the economy", "art and literature", "science", "education",
           "religion", "everyday communication", "urban planning", "the environment")
DEBATES = ("a universal basic income", "banning cars from city centres", "a four-day school week",
           "compulsory voting", "free public transport", "school uniforms", "a tax on sugary drinks",
           "daylight saving time", "requiring a second language in schools", "open-plan offices")
PHILOSOPHIES = ("Stoicism", "Epicureanism", "utilitarianism", "existentialism", "Confucianism", "Kantian ethics",
                "pragmatism", "virtue ethics")
VALUES = ("happiness", "freedom", "duty", "friendship", "justice", "the good life", "wealth", "death")
ITEMS = ("apples", "notebooks", "tickets", "bottles of water", "chairs", "stamps", "cookies", "boxes")
DIRECTIONS = ("north", "east", "south", "west")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
OCCASIONS = ("a retirement party", "a school graduation", "a team kickoff", "a charity dinner", "a wedding toast")
ADVISERS = ("a career counsellor", "a personal fitness coach", "a travel agent", "a librarian who loves mysteries")
PETS = ("cat", "dog", "parrot", "rabbit", "turtle")
VERDICTS = ("great value", "broke after a week", "works as described", "too noisy", "arrived late")


def _c_writing(r):
    return r.choice([
        f"Write a short persuasive email to {r.choice(RECIPIENTS)} asking them to {r.choice(ACTIONS)}. Keep it under "
        f"{r.choice([80, 100, 120, 150, 200])} words.",
        f"Compose a {r.choice(FORMS)} about {r.choice(SUBJECTS)}.",
        f"Write a {r.choice(TONES)} product description for {r.choice(PRODUCTS)} aimed at {r.choice(AUDIENCES)}.",
        f"Write the opening paragraph of a story in which {r.choice(NAMES)} finds "
        f"{r.choice(['a map', 'a key', 'a letter', 'a photograph', 'a locked box'])} in "
        f"{r.choice(['an attic', 'a library book', 'a second-hand coat', 'a train compartment', 'a garden shed'])}.",
        f"Draft a {r.choice(TONES)} blog post about a weekend trip to {r.choice(CITIES)}, covering food, sights and "
        "one unexpected moment.",
        f"Write a {r.choice(TONES)} speech for {r.choice(OCCASIONS)} that mentions {r.choice(SUBJECTS)}.",
        f"Write a cover letter for {_a(r.choice(ROLES))} position at {r.choice(COMPANIES)} that highlights teamwork "
        "and one concrete achievement.",
        f"Write a {r.choice(TONES)} reply to {r.choice(RECIPIENTS)} declining an invitation to {r.choice(ACTIONS)}.",
        f"Create an outline for an article titled \"Why you should {r.choice(ACTIONS)}\", with three sections and a "
        "short conclusion.",
        f"Write a short advertisement script (30 seconds) for {r.choice(PRODUCTS)}."])


def _c_roleplay(r):
    p = r.choice(PERSONAS)
    return r.choice([
        f"Pretend you are {p}. Describe a typical day in your life, staying in character.",
        f"Act as {p}. A visitor asks you for advice because they {r.choice(PROBLEMS)}. Respond in character.",
        f"You are {p}. Introduce yourself to a group of {r.choice(AUDIENCES)} and tell them one lesson you have "
        "learned.",
        f"Imagine you are {p} and you have just arrived in {r.choice(CITIES)}. What do you do first, and why?",
        f"Take on the role of {r.choice(ADVISERS)}. "
        f"I am someone who {r.choice(PROBLEMS)}. Ask me two questions and then give me a plan.",
        f"Role-play as {p} explaining {r.choice(STEM_PROCESSES)} to a curious child.",
        f"You are {p} writing a letter home about {r.choice(SUBJECTS)}. Write the letter.",
        f"You are {p}. Persuade me to buy {r.choice(PRODUCTS)}, without breaking character.",
        f"Speak as {p} and describe {r.choice(SUBJECTS)}.",
        f"As {p}, give three tips to {r.choice(AUDIENCES)}.",
        f"Play {p}. I am a newcomer who {r.choice(PROBLEMS)}. Start the conversation."])


def _c_reasoning(r):
    names = r.sample(NAMES, 4)
    more, less = r.choice(PEOPLE_TRAITS)
    x, y, z = r.sample(SYLLOGISM, 3)
    start, turn = r.choice(DIRECTIONS), r.choice([90, 180, 270])
    n, k, m = r.randint(8, 60), r.randint(2, 7), r.randint(1, 5)
    seq_a, seq_d = r.randint(1, 9), r.randint(2, 7)
    return r.choice([
        f"{names[0]} is {more} than {names[1]}, and {names[1]} is {more} than {names[2]}. {names[3]} is {less} than "
        f"{names[2]}. Who is the {more.replace('er', 'est')}? Explain your reasoning.",
        f"If all {x} are {y} and some {y} are {z}, does it follow that some {x} are {z}? Explain.",
        f"{names[0]} faces {start}, turns {turn} degrees clockwise, then turns 90 degrees counter-clockwise. Which "
        f"direction is {names[0]} facing now? Explain step by step.",
        f"There are {n} {r.choice(ITEMS)} in a box. {names[0]} takes out {k}, {names[1]} puts back {m}, and then "
        f"{names[2]} takes out half of what is left, rounded down. How many are left in the box?",
        f"What comes next in the sequence {', '.join(str(seq_a + i * seq_d) for i in range(5))}, ...? Explain the "
        "rule.",
        f"{names[0]} is {names[1]}'s {r.choice(['mother', 'father', 'aunt', 'uncle'])}, and {names[1]} is "
        f"{names[2]}'s {r.choice(['mother', 'father', 'brother', 'sister'])}. How is {names[0]} related to {names[2]}?",
        f"{names[0]}, {names[1]} and {names[2]} each own one pet: a {', a '.join(r.sample(PETS, 3))}. "
        f"{names[0]} is allergic to fur, and {names[1]} does not own the dog. Can you tell who owns which pet? If not, "
        "what extra clue would settle it?",
        f"A train leaves at {r.randint(6, 11)}:{r.choice(['00', '15', '30', '45'])} a.m. and travels "
        f"{r.randint(40, 120)} km at {r.choice([40, 60, 80])} km/h, then stops for {r.randint(5, 40)} minutes. When "
        "does it complete the journey after the stop?"])


def _c_math(r):
    a, b, c = r.randint(2, 12), r.randint(2, 12), r.randint(2, 30)
    return r.choice([
        f"Solve the equation {a}x + {c} = {a * r.randint(1, 20) + c} and explain each step.",
        f"A rectangle is {a} cm by {b} cm. By how much does its area grow if both sides increase by {c % 5 + 1} cm?",
        f"What is the probability of rolling a total of {r.randint(3, 11)} with two fair dice? Show your work.",
        f"If x + y = {a + b} and x - y = {a - b}, what are x and y?",
        f"How many ways can {r.randint(3, 7)} different books be arranged on a shelf? Explain.",
        f"The sum of {r.randint(3, 6)} consecutive integers is {r.randint(3, 6) * c}. Is that possible? If so, find "
        "them.",
        f"{r.choice(NAMES)} invests ${c * 100} at {a}% interest compounded yearly. How much is there after {b} years?",
        f"A triangle has sides {a}, {b} and {a + b - 1}. Find its area using Heron's formula.",
        f"Explain how to compute the greatest common divisor of {a * c} and {b * c} with the Euclidean algorithm."])


def _c_coding(r):
    lang = r.choice(LANGUAGES)
    d1, d2 = r.sample(DATA_STRUCTURES, 2)
    snippet_n = r.randint(2, 9)
    return r.choice([
        f"Write a {lang} function that {r.choice(CODE_TASKS)}.{r.choice(CONSTRAINTS)}",
        f"Implement {r.choice(CS_CLASS)} as a class in {lang}.{r.choice(CONSTRAINTS)}",
        f"What is the difference between {d1} and {d2}? When would you use each? Give a {lang} example.",
        f"Find the bug in this Python function and fix it:\n```python\ndef average(values):\n    total = 0\n"
        f"    for v in values[{r.choice([1, 0])}:]:\n        total += v\n"
        f"    return total / {r.choice(['len(values)', 'len(values) - 1', str(snippet_n)])}\n```",
        f"Explain what this Python code prints and why:\n```python\n"
        f"items = [{', '.join(str(r.randint(0, 9)) for _ in range(snippet_n))}]\n"
        f"print(sorted(set(items))[{r.randint(-2, 1)}], items.count({r.randint(0, 9)}))\n```",
        f"Rewrite this loop as a list comprehension and explain the change:\n```python\nresult = []\n"
        f"for i in range({snippet_n * 3}):\n    if i % {r.randint(2, 5)} == 0:\n        result.append(i ** 2)\n```",
        f"Write unit tests in {lang} for a function that {r.choice(CODE_TASKS)}."])


def _extraction_text(r) -> str:
    people = r.sample(NAMES, 3)
    lines = []
    for p in people:
        lines.append(f"{p} joined {r.choice(COMPANIES)} as {_a(r.choice(ROLES))} in {r.choice(MONTHS)} "
                     f"{r.randint(2005, 2024)} and now works in {r.choice(CITIES)}.")
    return " ".join(lines)


def _c_extraction(r):
    text = _extraction_text(r)
    reviews = "\n".join(f"- \"{r.choice(['Loved', 'Returned', 'Enjoyed', 'Disliked', 'Recommend'])} the "
                        f"{_bare(r.choice(PRODUCTS))}; {r.choice(VERDICTS)}.\""
                        for _ in range(3))
    rows = "\n".join(f"{c}, {r.randint(2, 40)} degrees, {r.randint(0, 30)} mm rain" for c in r.sample(CITIES, 4))
    return r.choice([
        f"Extract each person's name, employer, job title and start year from the following text and return them "
        f"as a JSON list:\n{text}",
        f"From the reviews below, extract the product and whether the review is positive or negative, as a "
        f"table:\n{reviews}",
        f"Identify every city mentioned in this text and the person linked to it:\n{text}",
        f"Here are weather reports:\n{rows}\nExtract the warmest city and the wettest city, and output them as "
        "JSON with keys \"warmest\" and \"wettest\".",
        f"Summarise the following text in one sentence, then list all years it mentions in ascending order:\n{text}",
        f"Read these notes and return only the company names, one per line, sorted alphabetically:\n{text}"])


def _c_stem(r):
    a, b = r.choice(STEM_PAIRS)
    return r.choice([
        f"Explain the difference between {a} and {b}.",
        f"Describe {r.choice(STEM_PROCESSES)} in terms a high-school student would understand.",
        f"What are the main steps of {r.choice(STEM_PROCESSES)}? Use a numbered list.",
        f"Give a real-world example that shows the difference between {a} and {b}, and explain it.",
        f"A {r.choice(['car', 'ball', 'cyclist', 'train'])} speeds up from {r.randint(0, 10)} to "
        f"{r.randint(11, 40)} m/s "
        f"in {r.randint(2, 12)} seconds. What is its average acceleration, and what assumptions are you making?",
        f"Explain {r.choice(STEM_PROCESSES)} and one common misconception about it."])


def _c_humanities(r):
    p1, p2 = r.sample(PHILOSOPHIES, 2)
    return r.choice([
        f"Discuss the impact of {r.choice(HUMANITIES_TOPICS)} on {r.choice(DOMAINS)}.",
        f"Compare how {p1} and {p2} think about {r.choice(VALUES)}.",
        f"What are the strongest arguments for and against {r.choice(DEBATES)}?",
        f"How did {r.choice(HUMANITIES_TOPICS)} change {r.choice(DOMAINS)}? Give two examples.",
        f"Write a short lesson plan for teaching {r.choice(HUMANITIES_TOPICS)} to "
        f"{r.choice(['ten-year-olds', 'high-school students', 'adult learners'])}.",
        f"Explain the central idea of {p1} and how someone might apply it to {r.choice(DOMAINS)} today.",
        f"Write a short dialogue between a supporter and a critic of {r.choice(DEBATES)}.",
        f"How might a follower of {p1} advise someone who {r.choice(PROBLEMS)}?",
        f"What can {r.choice(HUMANITIES_TOPICS)} teach us about {r.choice(DOMAINS)} today?",
        f"In about {r.choice([150, 200, 300, 400])} words, argue whether {r.choice(HUMANITIES_TOPICS)} did more good "
        f"than harm to {r.choice(DOMAINS)}.",
        f"Summarise the ethical questions raised by {r.choice(DEBATES)} from the point of view of {p1}."])


CHAT_TEMPLATES = (_c_writing, _c_roleplay, _c_reasoning, _c_math, _c_coding, _c_extraction, _c_stem, _c_humanities)
CHAT_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


_MODULE_DOC = re.compile(r"\A(?:[ \t]*(?:#[^\n]*)?\n)*[ \t]*[rRuU]?(\"\"\"|''')(.*?)\1", re.S)


def stdlib_topics(files: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(module name, first line of its docstring) of the standard library files that have a
    module docstring (``corpus.stdlib_files``), in their order."""
    out = []
    for path, text in files:
        parts = path[:-3].replace("\\", "/").split("/")
        if parts[-1] == "__init__":
            parts = parts[:-1]
        m = _MODULE_DOC.match(text)
        if not parts or any(p.startswith("_") for p in parts) or not m:
            continue
        line = m.group(2).strip().splitlines()[0].strip() if m.group(2).strip() else ""
        if 10 <= len(line) <= 160 and "`" not in line:
            out.append((".".join(parts), line))
    return out


def stdlib_requests(topics: list[tuple[str, str]]) -> list[str]:
    """Chat requests about standard library modules (:func:`stdlib_topics`): up to three per
    module (the comparison's other module drawn with a fixed seed)."""
    r, out = random.Random(CHAT_SEED + 1), []
    for mod, line in topics:
        other = topics[r.randrange(len(topics))][0] if len(topics) > 1 else None
        out.append(f"The Python module `{mod}` is documented as: \"{line}\" Explain what it is for and show a small "
                   "example of using it.")
        out.append(f"I am new to Python. When would I reach for the `{mod}` module? Give two practical use cases.")
        if other and other != mod:
            out.append(f"Explain the difference between Python's `{mod}` and `{other}` modules.")
    return out


def chat_requests(size: int) -> list[str]:
    """``size`` distinct single-turn chat requests over the eight MT-Bench categories (in turn;
    a category whose variety runs out leaves its turn to the others)."""
    return _generate(CHAT_TEMPLATES, size, CHAT_SEED)
