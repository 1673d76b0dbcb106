"""Hypothesis strategies shared by the property tests."""

from __future__ import annotations

from hypothesis import strategies as st

# hypothesis' characters() never draws a surrogate; a lone one is what a JavaScript producer sends
# for a string cut inside an emoji (JSON's "\ud800"), so they are mixed in explicitly.
SURROGATES = st.integers(min_value=0xD800, max_value=0xDFFF).map(chr)
ANY_CHARACTER = st.one_of(st.characters(), SURROGATES)


def any_text(min_size: int = 0, max_size: int = 40) -> st.SearchStrategy[str]:
    """Text of any code point, lone surrogates included."""
    return st.text(alphabet=ANY_CHARACTER, min_size=min_size, max_size=max_size)
