"""Prefill chunks sized by time: about 0.1 s while others decode or wait, about a second
while a prompt prefills alone, from the rate the last chunk was measured at."""

from engine.runtime.chunking import FIRST, LARGEST, SMALLEST, Chunker


def test_chunks_follow_the_measured_rate_and_grow_when_a_prompt_is_alone():
    c = Chunker()
    assert c.size() == c.size(alone=True) == FIRST  # nothing measured yet
    c.took(64, 0.2)  # 320 tokens/s
    assert c.size() == 32 and c.size(alone=True) == 320
    c.took(10, 10.0)  # 1 token/s: never below the smallest chunk
    assert c.size() == c.size(alone=True) == SMALLEST
    c.took(100_000, 1.0)
    assert c.size() == c.size(alone=True) == LARGEST
    c.took(0, 1.0)  # nothing measured: the last rate stands
    assert c.size() == LARGEST
