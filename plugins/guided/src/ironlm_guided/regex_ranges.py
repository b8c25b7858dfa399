"""Regexes for bounded JSON numbers, for regex-only backends (outlines-core).

``integer_range(lo, hi)`` matches exactly the JSON integers in [lo, hi] (either bound may be
None). ``number_range(...)`` matches JSON numbers (no exponent) within integer-valued bounds,
inclusive or exclusive; a bound that is not an integer is a ValueError (the regex would need
digit-by-digit decimal comparison, which this module does not attempt).
"""

from __future__ import annotations

from decimal import Decimal

_ANY_FRACTION = r"(?:\.[0-9]+)?"
_ZERO_FRACTION = r"(?:\.0+)?"
_NONZERO_FRACTION = r"\.[0-9]*[1-9][0-9]*"


def _same_length(x: str, y: str) -> list[str]:
    """Alternatives matching the fixed-width digit strings from x to y (x <= y, same length)."""
    if x == y:
        return [x]
    n = len(x)
    if x == "0" * n and y == "9" * n:
        return ["[0-9]" if n == 1 else f"[0-9]{{{n}}}"]
    if n == 1:
        return [f"[{x}-{y}]"]
    if x[0] == y[0]:
        return [x[0] + rest for rest in _group(_same_length(x[1:], y[1:]))]
    out = [x[0] + rest for rest in _group(_same_length(x[1:], "9" * (n - 1)))]
    lo, hi = int(x[0]) + 1, int(y[0]) - 1
    if lo <= hi:
        digit = str(lo) if lo == hi else f"[{lo}-{hi}]"
        out.append(digit + ("[0-9]" if n == 2 else f"[0-9]{{{n - 1}}}"))
    out += [y[0] + rest for rest in _group(_same_length("0" * (n - 1), y[1:]))]
    return out


def _group(alts: list[str]) -> list[str]:
    return alts if len(alts) == 1 else ["(?:" + "|".join(alts) + ")"]


def _nonneg_alternatives(lo: int, hi: int | None) -> list[str]:
    """Canonical decimal naturals (no leading zeros) in [lo, hi]; hi None = unbounded."""
    if hi is not None and lo > hi:
        return []
    out: list[str] = []
    width = len(str(lo))
    last = len(str(hi)) if hi is not None else width
    for n in range(width, last + 1):
        start = max(lo, 10 ** (n - 1) if n > 1 else 0)
        end = 10**n - 1 if hi is None else min(hi, 10**n - 1)
        if start <= end:
            out += _same_length(str(start), str(end))
    if hi is None:
        out.append(f"[1-9][0-9]{{{width},}}")
    return out


def _alternation(alts: list[str]) -> str:
    if not alts:
        raise ValueError("the numeric bounds leave no value")
    return "(?:" + "|".join(alts) + ")"


def integer_range(lo: int | None, hi: int | None) -> str:
    """Regex for JSON integers n with lo <= n <= hi."""
    alts: list[str] = []
    if hi is None or hi >= 0:
        alts += _nonneg_alternatives(max(lo, 0) if lo is not None else 0, hi)
    if lo is None or lo < 0:
        neg_lo = 1 if hi is None or hi >= 0 else -hi
        neg_hi = None if lo is None else -lo
        alts += ["-" + a for a in _group(_nonneg_alternatives(neg_lo, neg_hi))]
    return _alternation(alts)


def _magnitudes(a: int, a_excl: bool, h: int | None, h_excl: bool) -> list[str]:
    """Regex alternatives for decimal magnitudes y (no sign) with a </<= y </<= h, a >= 0."""
    alts: list[str] = []
    if h is not None and (h < a or (h == a and (a_excl or h_excl))):
        return alts
    if a_excl:  # y = a.xxx with a nonzero fraction
        if h is None or h > a:
            alts.append(str(a) + _NONZERO_FRACTION)
    first_any = a + 1 if a_excl else a  # integer parts taking any fraction
    last_any = None if h is None else h - 1
    alts += [i + _ANY_FRACTION for i in _group(_nonneg_alternatives(first_any, last_any))] \
        if last_any is None or first_any <= last_any else []
    if h is not None and not h_excl:  # y = h exactly (h, h.0, h.00, ...)
        alts.append(str(h) + _ZERO_FRACTION)
    return alts


def _as_int(value: float | int | None, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not Decimal(str(value)) == Decimal(int(value)):
        raise ValueError(f"{name} {value!r} is not an integer")
    return int(value)


def number_range(
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: float | None = None,
    exclusive_maximum: float | None = None,
) -> str:
    """Regex for JSON numbers x within the bounds (all integer-valued); no exponent form."""
    lo, lo_excl = _as_int(minimum, "minimum"), False
    e_lo = _as_int(exclusive_minimum, "exclusiveMinimum")
    if e_lo is not None and (lo is None or e_lo >= lo):
        lo, lo_excl = e_lo, True
    hi, hi_excl = _as_int(maximum, "maximum"), False
    e_hi = _as_int(exclusive_maximum, "exclusiveMaximum")
    if e_hi is not None and (hi is None or e_hi <= hi):
        hi, hi_excl = e_hi, True
    alts: list[str] = []
    if hi is None or hi > 0 or (hi == 0 and not hi_excl):  # x >= 0
        a, a_excl = (lo, lo_excl) if lo is not None and lo >= 0 else (0, False)
        alts += _magnitudes(a, a_excl, hi, hi_excl)
    if lo is None or lo < 0:  # x < 0, written -y with y > 0
        if hi is None or hi >= 0:
            y_lo, y_lo_excl = 0, True
        else:
            y_lo, y_lo_excl = -hi, hi_excl
        neg = _magnitudes(y_lo, y_lo_excl, None if lo is None else -lo, lo_excl)
        alts += ["-" + a for a in _group(neg)] if neg else []
    return _alternation(alts)
