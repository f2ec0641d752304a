"""Kubernetes resource quantities ("500m", "4Gi", "1e3") parsed exactly, with fractions kept."""

from __future__ import annotations

import re
from fractions import Fraction

_BINARY: dict[str, int] = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL: dict[str, int | Fraction] = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": 1,
            "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)|[eE]([+-]?\d+))?$")


def parse_quantity(value: str | int | float) -> Fraction:
    """Return the exact value of a quantity; raises ValueError with the reason for a malformed one."""
    if isinstance(value, bool):
        raise ValueError("a quantity is a number or a string like '500m' or '4Gi', not a boolean")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(str(value))
    match = _QUANTITY.match(value.strip()) if isinstance(value, str) else None
    if not match:
        raise ValueError("not a Kubernetes quantity (examples: 2, 500m, 4Gi, 1e9)")
    number, suffix, exponent = match.groups()
    amount = Fraction(number)
    if exponent is not None:
        if abs(int(exponent)) > 30:
            raise ValueError("exponent out of range")
        return amount * Fraction(10) ** int(exponent)
    if suffix in _BINARY:
        return amount * _BINARY[suffix]
    return amount * _DECIMAL[suffix or ""]


_LARGEST_FIRST = (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def format_quantity(value: Fraction) -> str:
    """A quantity as Kubernetes writes one: whole numbers plain, or in the largest binary unit that divides
    them exactly (memory); fractions in milli-units (CPU), else as a decimal."""
    if value.denominator == 1:
        whole = value.numerator
        for suffix, size in _LARGEST_FIRST:
            if whole >= size and whole % size == 0:
                return f"{whole // size}{suffix}"
        return str(whole)
    milli = value * 1000
    if milli.denominator == 1:
        return f"{milli.numerator}m"
    return f"{float(value):g}"
