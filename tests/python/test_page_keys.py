"""Page keys: the Rust keys equal an independent hashlib implementation of the
documented format, chain over parents, and separate fingerprints and namespaces."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_helpers import ref_page_key

import kvcore
from kvcore import InvalidArgumentError, InvalidDTypeError, KVCacheManager

VERSION = 1


def ref_root(fingerprint: bytes) -> bytes:
    data = b"kvcore.page-key" + bytes([VERSION]) + struct.pack("<Q", len(fingerprint)) + fingerprint
    return hashlib.sha256(data).digest()[:16]


def ref_keys(
    tokens: list[int], page_size: int, fingerprint: bytes = b"", namespace: str | None = None
) -> list[bytes]:
    """The format of docs/api.md, written from the docs alone."""
    parent, keys = ref_root(fingerprint), []
    for i in range(len(tokens) // page_size):
        parent = ref_page_key(parent, namespace, tokens[i * page_size : (i + 1) * page_size], VERSION)
        keys.append(parent)
    return keys


def as_bytes(keys: np.ndarray) -> list[bytes]:
    assert keys.dtype == np.uint8 and keys.ndim == 2 and keys.shape[1] == 16
    return [bytes(row) for row in keys]


# The test vectors printed in docs/api.md.
VECTORS = [
    (list(range(8)), 4, b"", None),
    (list(range(8)), 4, b"llama-3.1-8b|bf16|16|HND|v1", None),
    (list(range(8)), 4, b"", "tenant-a"),
    (list(range(8)), 4, b"", "*"),
]


EXPECTED = [  # pinned: a change of format must bump the version (and these)
    ["06b911dbf1cab835645347fc2796860e", "9063070537fb1c559cbaa96bc2cea95d"],
    ["817464431dc0734648be642bfc3d93a7", "f77609c3a08b5d45b6966efb4e0c09b8"],
    ["90201b7b1aa890c180a5e1f54468f2ab", "e346e063ee2bd5677c7bbe0e6bcb1b93"],
    ["4804f02c2f45ddb38ab7237a6c469920", "06bd2c3a7951aa8f53882281b102303d"],
]


@pytest.mark.parametrize(("vector", "expected"), list(zip(VECTORS, EXPECTED, strict=True)))
def test_the_documented_vectors(
    vector: tuple[list[int], int, bytes, str | None], expected: list[str]
) -> None:
    tokens, page_size, fingerprint, namespace = vector
    got = as_bytes(kvcore.page_keys(tokens, page_size, fingerprint, namespace))
    assert got == ref_keys(tokens, page_size, fingerprint, namespace)
    assert [k.hex() for k in got] == expected
    assert KVCacheManager(8, 4, fingerprint=fingerprint).root_key() == ref_root(fingerprint)


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 2**32 - 1), max_size=40),
    page_size=st.integers(1, 7),
    fingerprint=st.binary(max_size=20),
    namespace=st.one_of(st.none(), st.just("*"), st.text(max_size=8).filter(lambda s: s != "*")),
)
def test_rust_keys_equal_the_reference(
    tokens: list[int], page_size: int, fingerprint: bytes, namespace: str | None
) -> None:
    try:
        namespace.encode() if namespace else None  # lone surrogates are refused below
    except UnicodeEncodeError:
        return
    got = as_bytes(kvcore.page_keys(np.array(tokens, dtype=np.uint32), page_size, fingerprint, namespace))
    assert got == ref_keys(tokens, page_size, fingerprint, namespace)


def test_a_sequences_keys_are_its_full_pages_keys() -> None:
    fp = b"model-x|fp8|4"
    m = KVCacheManager(64, 4, fingerprint=fp)
    assert m.root_key() == ref_root(fp)
    m.add_sequence(1, list(range(10)), namespace="t")
    assert as_bytes(m.page_keys(1)) == ref_keys(list(range(10)), 4, fp, "t")
    m.fork(1, 2)
    assert m.append(2, [7, 7])  # 12 tokens: a third full page
    assert as_bytes(m.page_keys(2)) == ref_keys([*range(10), 7, 7], 4, fp, "t")
    m.add_sequence(3, list(range(10)))  # the default namespace: other keys for the same tokens
    assert as_bytes(m.page_keys(3))[0] != as_bytes(m.page_keys(1))[0]
    m.add_sequence(4, list(range(200, 220)), cache_prompt=False, reserve=6)  # reserved pages only
    assert m.page_keys(4).shape == (1, 16)


def test_bad_arguments() -> None:
    with pytest.raises(InvalidDTypeError, match="fingerprint"):
        KVCacheManager(8, 4, fingerprint="model")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="page_size"):
        kvcore.page_keys([1, 2], 0)
    with pytest.raises(InvalidDTypeError):
        kvcore.page_keys([1.5], 1)
