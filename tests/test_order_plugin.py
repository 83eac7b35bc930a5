"""tests/_order.py: the order a parallel run takes the tests in."""

from __future__ import annotations

from dataclasses import dataclass

from _order import AFFINITY, _chunk_sizes, _estimates, plan


@dataclass
class _Item:
    nodeid: str


def _slices(items: list[_Item], workers: int) -> list[list[_Item]]:
    out, start = [], 0
    for size in _chunk_sizes(len(items), workers):
        out.append(items[start : start + size])
        start += size
    return out


def test_chunk_sizes_are_what_worksteal_cuts() -> None:
    # xdist's WorkStealingScheduling.check_schedule: len(pending) // nodes_remaining each.
    assert _chunk_sizes(10, 4) == [2, 2, 3, 3]
    assert sum(_chunk_sizes(2910, 10)) == 2910


def test_every_test_is_kept_once_and_the_slices_are_about_equal() -> None:
    items = [_Item(f"tests/test_a.py::test_{i}") for i in range(40)]
    known = {"tests/test_a.py": 0.1, items[3].nodeid: 30.0, items[17].nodeid: 29.0}
    known |= {items[i].nodeid: 10.0 for i in (5, 6, 7, 8)}
    ordered = plan(items, known, 4)
    assert sorted(i.nodeid for i in ordered) == sorted(i.nodeid for i in items)
    loads = [sum(_estimates(s, known)) for s in _slices(ordered, 4)]
    assert max(loads) - min(loads) <= 10.0 + 0.1 * 10
    for chunk in _slices(ordered, 4):  # the longest first in each slice
        costs = _estimates(chunk, known)
        assert costs == sorted(costs, reverse=True)


def test_tests_sharing_a_costly_resource_stay_in_one_slice_in_their_order() -> None:
    spark = next(prefix for prefix in AFFINITY if "spark" in prefix)
    items = [_Item(f"tests/test_b.py::test_{i}") for i in range(30)]
    items[5:5] = [_Item(f"{spark}test_s.py::test_{i}") for i in range(6)]
    ordered = plan(items, {"tests/test_b.py": 1.0, f"{spark}test_s.py": 2.0}, 3)
    holding = [
        n for n, chunk in enumerate(_slices(ordered, 3)) if any(spark in i.nodeid for i in chunk)
    ]
    assert len(holding) == 1
    assert [i.nodeid for i in ordered if spark in i.nodeid] == [
        f"{spark}test_s.py::test_{i}" for i in range(6)
    ]
