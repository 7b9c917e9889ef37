"""GSM8K's answers: reading the final number of an answer (training's rule, and the authors' evaluation rule), the
reference number after ``####``, the 0/1 correctness reward, and where a model-started new question cuts an answer.
Apart from ``cory.tasks.gsm8k`` (prompts, data, the task) so that each reads at one level."""
from __future__ import annotations

import re
import unicodedata

# A number: optional minus (only when not glued to a preceding word/number/closing bracket, so
# the hyphen in "3-4" or "COVID-19" is not a sign), optional currency symbol, digits with
# optional thousands separators, optional decimals (a trailing sentence period is not taken).
_NUMBER = (
    r"(?P<sign>(?<![\w)\]])[-\u2212])?"
    r"[$\u20ac\u00a3]?"
    r"(?P<num>\d+(?:,\d{3}(?!\d))*(?:\.\d+)?|(?<![\d.])\.\d+)"
)
_NUMBER_RE = re.compile(_NUMBER)
# What may sit between "answer is" / "####" and the number: spaces, ':', '=', markdown emphasis,
# currency, LaTeX-ish wrappers.
_LEAD_RE = re.compile(r"^[\s:=*_`'\"(\[{$\u20ac\u00a3]*(?:\\boxed\{|\\\(|\\\[)?[\s*_${(]*")
_ANSWER_IS_RE = re.compile(r"answer\s+is", re.IGNORECASE)


def _ascii_digits(num: str) -> str:
    """``num`` with every Unicode decimal digit (what ``\\d`` matched) written as its ASCII digit: "٤٢" and "４２"
    are 42, as int() and Decimal read them and as this reward read them before its string rewrite."""
    if num.isascii():
        return num
    return "".join(str(unicodedata.decimal(c)) if c.isdecimal() else c for c in num)


def _canonical(sign: str | None, num: str) -> str | None:
    """The number's one spelling: ASCII digits, no commas, leading zeros or trailing decimal zeros ("1,000.50" ->
    "1000.5", "-0.0" -> "0", "٤٢" -> "42"). Written with string operations, exact at any length and linear in it:
    through int() a number of more than 4300 digits raised (Python's limit on int-string conversion) and one far
    longer took quadratic time, in a reward that must return a score for any answer a model writes."""
    whole, _, fraction = _ascii_digits(num).replace(",", "").partition(".")
    whole, fraction = whole.lstrip("0") or "0", fraction.rstrip("0")
    value = f"{whole}.{fraction}" if fraction else whole
    return f"-{value}" if sign and value != "0" else value


def normalize_number(s: str | None) -> str | None:
    """Canonical string of the number a string starts with, else None.

    "1,000", "$1000", "1000.", "1000.00" -> "1000"; "0.50" -> "0.5"; "-3" -> "-3";
    units and "%" after the number are ignored ("18 dollars" -> "18", "45%" -> "45").
    """
    if s is None:
        return None
    text = str(s).strip()
    m = re.match(r"^[\s*_`+]*(?P<sign>[-\u2212])?\s*[$\u20ac\u00a3]?\s*(?P<sign2>[-\u2212])?"
                 r"(?P<num>\d+(?:,\d{3}(?!\d))*(?:\.\d+)?|\.\d+)", text)
    if m is None:
        return None
    return _canonical(m.group("sign") or m.group("sign2"), m.group("num"))


def _first_number(text: str) -> str | None:
    m = _NUMBER_RE.search(text)
    return _canonical(m.group("sign"), m.group("num")) if m else None


def _leading_number(text: str) -> str | None:
    """The number right at the start of ``text`` (after ':', '**', '$', spaces...), else None."""
    lead = _LEAD_RE.match(text)
    rest = text[lead.end():] if lead else text
    m = re.match(r"(?P<sign>[-\u2212])?\s*[$\u20ac\u00a3]?(?P<num>\d+(?:,\d{3}(?!\d))*(?:\.\d+)?|\.\d+)",
                 rest)
    return _canonical(m.group("sign"), m.group("num")) if m else None


# a reference answer is one number and nothing else: read "3/4", "2 1/2", "1e3" or "1 000" by their first
# digits and every model answer would be scored against the wrong number
_REFERENCE_RE = re.compile(r"\s*(?P<sign>[-\u2212])?\s*[$\u20ac\u00a3]?\s*"
                           r"(?P<num>\d+(?:,\d{3})*(?:\.\d+)?|\.\d+)\s*\.?\s*")


def reference_answer(solution: str) -> str:
    """The normalised number after the last ``####`` of a GSM8K solution: one integer or decimal (``18``,
    ``-3``, ``1,080``, ``0.5``); anything else there is a ValueError."""
    _, sep, tail = solution.rpartition("####")
    if not sep:
        raise ValueError(f"GSM8K solution has no '#### <number>' ending: {solution[-80:]!r}")
    m = _REFERENCE_RE.fullmatch(tail)
    if m is None:
        raise ValueError(f"GSM8K solution ends in '#### {tail.strip()[:40]}', not one number (an integer or decimal "
                         "such as 18, -3, 1,080 or 0.5; fractions, exponents and spaced digits are not read)")
    return _canonical(m.group("sign"), m.group("num"))


def extract_answer(text: str) -> str | None:
    """The final numeric answer of a model response, normalised; None if it has no number.

    Order: the number after the last ``####``; else the number after the last "answer is"
    (case-insensitive; tolerates "The answer is: $1,234." and "answer is **12**"); else the last
    number in the text.
    """
    if not text:
        return None
    if "####" in text:
        tail = text.rpartition("####")[2]
        value = _leading_number(tail)
        if value is not None:
            return value
    matches = list(_ANSWER_IS_RE.finditer(text))
    if matches:
        tail = text[matches[-1].end():]
        value = _leading_number(tail)
        if value is None:
            # "The answer is that he has 12 apples." -> first number of that line.
            value = _first_number(tail.split("\n", 1)[0])
        if value is not None:
            return value
    last = None
    for last in _NUMBER_RE.finditer(text):
        pass
    return _canonical(last.group("sign"), last.group("num")) if last else None


# The authors' evaluation reads a number as digits with commas and decimals (a sentence's closing "." may stick to
# it and is dropped afterwards), with an optional minus.
_AUTHORS_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d*)?")


def _authors_clean(number: str) -> str:
    number = number.replace(",", "")
    return number[:-1] if number.endswith(".") else number


def authors_extract(text: str) -> str | None:
    """The answer as the authors' GSM8K evaluation reads it (gsm8k_utils/gsm8k_eval.py of their team): lower-case
    the text; if "the answer is" occurs, the first number after its first occurrence, else the last number of the
    whole text; commas removed, a trailing "." dropped. A string, compared as a string: "3.50" is not "3.5", and
    "####" means nothing here (unlike ``extract_answer``)."""
    low = (text or "").lower()
    if "the answer is" in low:
        numbers = _AUTHORS_NUMBER_RE.findall(low.split("the answer is", 1)[1])
        return _authors_clean(numbers[0]) if numbers else None
    numbers = _AUTHORS_NUMBER_RE.findall(low)
    return _authors_clean(numbers[-1]) if numbers else None


def authors_reference(solution: str) -> str:
    """The reference as the authors' evaluation writes it: the text after the last ``####``, commas removed."""
    return solution.rpartition("####")[2].strip().replace(",", "")


def authors_correct(response: str, solution: str) -> float:
    """1.0 when ``authors_extract`` of the response equals ``authors_reference`` of the GSM8K solution, as strings."""
    got = authors_extract(response)
    return 1.0 if got is not None and got == authors_reference(solution) else 0.0


def correctness_reward(response: str, reference: str) -> float:
    """1.0 if the response's final number equals the (normalised) reference, else 0.0."""
    ref = normalize_number(reference)
    if ref is None:
        return 0.0
    return 1.0 if extract_answer(response) == ref else 0.0


def trim_at_stop(text: str, stop: str = "Question:") -> str:
    """Cut ``text`` where a new ``stop`` starts a line (the one-shot format invites the model to
    write the next "Question:"), and strip the trailing whitespace of what is kept; a last line that is the start
    of ``stop`` ("Question" without its colon, where the token limit ended the answer) is cut too. Unchanged
    otherwise; a ``stop`` inside a line is kept."""
    if not stop:
        return text
    m = re.search(r"(?:^|\n)[ \t]*" + re.escape(stop), text)
    if m is None:
        # the answer ran out of tokens while starting the next question ("...\nQuestion"): cut that too, so that
        # the observer's reference (the answer as the reward read it) ends with the answer
        head, newline, last = text.rpartition("\n")
        if newline and last.strip() and stop.startswith(last.strip()):
            return head.rstrip()
        return text
    return text[: m.start()].rstrip()
