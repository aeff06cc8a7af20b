"""Sizes rounded up for static buffers."""

from genrec.utils.sizes import next_power_of_two


def test_next_power_of_two() -> None:
    assert [next_power_of_two(n) for n in (0, 1, 2, 3, 4, 5, 64, 65)] == [1, 1, 2, 4, 4, 8, 64,
                                                                         128]
