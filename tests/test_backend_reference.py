"""The reference backend: n-gram models of known law, spec strings, the backend object."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from specsample_backends.reference import NGramModel, ReferenceBackend, create, random_ngram
from specsample_backends.reference.backend import DEFAULT_TARGET, noisy, parse_spec

from specsample.core.cache import ConsumedCacheError, rollback
from specsample.core.protocols import Drafter, Model
from specsample.drafters.model import ModelDrafter


def _expected_logits(model: NGramModel, history: list[int], start: int, width: int) -> np.ndarray:
    """log table[context] for positions start..start+width-1 of `history` (0 before the start)."""
    rows = []
    for t in range(start, start + width):
        context = tuple(history[s] if s >= 0 else 0 for s in range(t - model.order + 1, t + 1))
        with np.errstate(divide="ignore"):
            rows.append(np.log(model.table[context]))
    return np.array(rows)


@pytest.fixture
def model() -> NGramModel:
    return random_ngram(5, order=2, seed=1, zeros=0.3)


def test_is_a_model(model: NGramModel) -> None:
    assert isinstance(model, Model)
    assert model.vocab_size == 5
    assert model.order == 2
    assert model.table.shape == (5, 5, 5)


def test_new_cache(model: NGramModel) -> None:
    cache = model.new_cache(3, 10)
    assert cache.lengths.tolist() == [0, 0, 0]
    assert cache.lengths.dtype == np.int64
    assert cache.capacity == 10
    assert cache.buffers.shape == (3, 10)


def test_forward_logits_are_log_table_rows(model: NGramModel) -> None:
    tokens = np.array([[1, 2, 3, 4], [3, 0, 1, 1]], dtype=np.int64)
    logits, cache = model.forward(tokens, model.new_cache(2, 8))
    assert logits.shape == (2, 4, 5)
    assert logits.dtype == np.float64
    for b in range(2):
        np.testing.assert_array_equal(logits[b], _expected_logits(model, tokens[b].tolist(), 0, 4))
    # the first position reads token 0 before the start: context (0, x)
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(logits[0, 0], np.log(model.table[0, 1]))
    assert np.any(np.isneginf(logits))  # zeros of the table are -inf logits
    assert cache.lengths.tolist() == [4, 4]
    assert cache.buffers[:, :4].tolist() == tokens.tolist()


def test_forward_continues_from_the_cache(model: NGramModel) -> None:
    first = np.array([[2, 4, 1]], dtype=np.int64)
    _, cache = model.forward(first, model.new_cache(1, 8))
    second = np.array([[3, 3]], dtype=np.int64)
    logits, cache = model.forward(second, cache)
    np.testing.assert_array_equal(logits[0], _expected_logits(model, [2, 4, 1, 3, 3], 3, 2))
    assert cache.lengths.tolist() == [5]


def test_forward_ragged_rows_and_stale_positions(model: NGramModel) -> None:
    _, cache = model.forward(np.array([[1, 2], [3, 3]], dtype=np.int64), model.new_cache(2, 8))
    cache = rollback(cache, np.array([2, 0], dtype=np.int64))  # row 1 restarts; its buffer is stale
    tokens = np.array([[0, 4], [2, 2]], dtype=np.int64)
    logits, new = model.forward(tokens, cache)
    np.testing.assert_array_equal(logits[0], _expected_logits(model, [1, 2, 0, 4], 2, 2))
    # row 1 at position 0 sees token 0 before the start, not the stale 3
    np.testing.assert_array_equal(logits[1], _expected_logits(model, [2, 2], 0, 2))
    assert new.lengths.tolist() == [4, 2]


def test_forward_order_one_and_three() -> None:
    for order in (1, 3):
        model = random_ngram(4, order=order, seed=order)
        tokens = np.array([[3, 1, 2, 0, 1]], dtype=np.int64)
        logits, _ = model.forward(tokens, model.new_cache(1, 6))
        np.testing.assert_array_equal(logits[0], _expected_logits(model, tokens[0].tolist(), 0, 5))


def test_forward_capacity_overflow(model: NGramModel) -> None:
    with pytest.raises(ValueError, match="exceeds the cache capacity 3"):
        model.forward(np.zeros((1, 4), dtype=np.int64), model.new_cache(1, 3))
    _, cache = model.forward(np.zeros((2, 2), dtype=np.int64), model.new_cache(2, 3))
    model.forward(np.zeros((2, 1), dtype=np.int64), cache)  # exactly full is fine
    with pytest.raises(ValueError, match=r"lengths \[2, 2\] exceeds the cache capacity 3"):
        model.forward(np.zeros((2, 2), dtype=np.int64), cache)


def test_forward_consumes_its_cache(model: NGramModel) -> None:
    _, cache = model.forward(np.array([[1, 2]], dtype=np.int64), model.new_cache(1, 6))
    _, new = model.forward(np.array([[4, 4, 4]], dtype=np.int64), cache)
    assert new is not cache and new.live and not cache.live
    assert new.buffers[0, :5].tolist() == [1, 2, 4, 4, 4]
    # The consumed cache raises instead of reading buffers a later forward overwrote.
    with pytest.raises(ConsumedCacheError, match="cache: this cache was consumed by a later forward"):
        model.forward(np.array([[0]], dtype=np.int64), cache)
    # A rollback of the live cache is live: a different continuation from position 2.
    logits, other = model.forward(np.array([[0]], dtype=np.int64), rollback(new, np.array([2])))
    np.testing.assert_array_equal(logits[0], _expected_logits(model, [1, 2, 0], 2, 1))
    assert other.buffers[0, :3].tolist() == [1, 2, 0]
    with pytest.raises(ConsumedCacheError):
        model.forward(np.array([[0]], dtype=np.int64), rollback(new, np.array([2])))


@pytest.mark.parametrize(("vocab", "order", "zeros", "concentration"),
                         [(2, 1, 0.0, 1.0), (5, 2, 0.5, 0.3), (7, 1, 0.9, 5.0), (3, 3, 0.2, 1.0)])
def test_random_ngram_rows_sum_to_exactly_one(vocab: int, order: int, zeros: float,
                                              concentration: float) -> None:
    model = random_ngram(vocab, order=order, seed=11, zeros=zeros, concentration=concentration)
    table = model.table
    assert table.shape == (vocab,) * (order + 1)
    assert np.all(table >= 0)
    assert np.all(table.sum(axis=-1) == 1.0)
    assert np.all((table > 0).sum(axis=-1) >= 1)
    for context in itertools.product(range(vocab), repeat=order):
        assert sum(Fraction(float(x)) for x in table[context]) == 1


def test_random_ngram_zeros_and_seed() -> None:
    sparse = random_ngram(6, order=1, seed=0, zeros=0.8)
    assert np.any(sparse.table == 0)
    assert np.all((sparse.table > 0).sum(axis=-1) >= 1)  # never a whole row of zeros
    np.testing.assert_array_equal(random_ngram(6, seed=4).table, random_ngram(6, seed=4).table)
    assert not np.array_equal(random_ngram(6, seed=4).table, random_ngram(6, seed=5).table)


@pytest.mark.parametrize(("vocab", "order"), [(1, 1), (0, 2), (4, 0)])
def test_random_ngram_bad_arguments(vocab: int, order: int) -> None:
    with pytest.raises(ValueError, match="vocab/order"):
        random_ngram(vocab, order=order)


def test_law_is_exact_and_reads_the_last_order_tokens(model: NGramModel) -> None:
    for context in [(), (3,), (1, 4), (2, 2, 0, 4, 1)]:
        law = model.law(context)
        assert len(law) == 5
        assert all(isinstance(x, Fraction) for x in law)
        assert sum(law) == 1
        padded = (0, 0, *context)
        assert law == [Fraction(float(x)) for x in model.table[padded[-2], padded[-1]]]
    assert model.law(()) == [Fraction(float(x)) for x in model.table[0, 0]]
    assert model.law((3,)) == [Fraction(float(x)) for x in model.table[0, 3]]


@pytest.mark.parametrize(("table", "match"), [
    (np.full((3,), 1 / 3), "shape"),
    (np.full((3, 4), 0.25), "shape"),
    (np.array([[0.5, 0.6], [0.5, 0.5]]), "sum to 1"),
    (np.array([[1.5, -0.5], [0.5, 0.5]]), "non-negative"),
    (np.array([[np.nan, 1.0], [0.5, 0.5]]), "finite"),
])
def test_ngram_table_validation(table: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        NGramModel(table)


def test_parse_spec() -> None:
    assert parse_spec("ngram") == {"vocab": 8, "order": 2, "seed": 0, "concentration": 1.0, "zeros": 0.0}
    values = parse_spec("ngram:vocab=5,order=3,seed=9,concentration=0.5,zeros=0.25")
    assert values == {"vocab": 5, "order": 3, "seed": 9, "concentration": 0.5, "zeros": 0.25}
    assert isinstance(values["vocab"], int) and isinstance(values["zeros"], float)
    assert parse_spec("ngram:vocab=4,")["vocab"] == 4


@pytest.mark.parametrize(("spec", "match"), [
    ("gpt2", r"target: expected 'ngram\[:vocab=V"),
    ("", "target: expected"),
    ("ngram:size=3", r"target: unknown key 'size' in 'ngram:size=3'; known: \['concentration', "),
    ("ngram:vocab=x", "vocab"),
    ("ngram:zeros=lots", "zeros"),
])
def test_parse_spec_errors(spec: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_spec(spec)


def test_backend_object() -> None:
    backend = create({})
    assert isinstance(backend, ReferenceBackend)
    assert backend.name == "reference"
    ids = backend.asarray([[1, 2], [3, 4]])
    assert ids.dtype == np.int64 and ids.shape == (2, 2)
    with pytest.raises(ValueError, match=r"options: the reference backend takes none, got \['device'\]"):
        create({"device": "cpu"})


def test_load_target() -> None:
    backend = create({})
    default = backend.load_target()
    expected = parse_spec(DEFAULT_TARGET)
    assert default.vocab_size == expected["vocab"] and default.order == expected["order"]
    np.testing.assert_array_equal(backend.load_target(None).table, default.table)
    model = backend.load_target("ngram:vocab=4,order=1,seed=2,zeros=0.5")
    np.testing.assert_array_equal(model.table, random_ngram(4, order=1, seed=2, zeros=0.5).table)
    with pytest.raises(ValueError, match="target: expected"):
        backend.load_target("llama")


def test_load_drafter_noisy_and_ngram() -> None:
    backend = create({})
    target = backend.load_target("ngram:vocab=6,order=2,seed=1")
    drafter = backend.load_drafter(None, target)
    assert isinstance(drafter, ModelDrafter) and isinstance(drafter, Drafter)
    draft = drafter.model
    assert isinstance(draft, NGramModel)
    assert draft.table.shape == target.table.shape
    np.testing.assert_allclose(draft.table.sum(axis=-1), 1.0, atol=1e-12)
    assert not np.array_equal(draft.table, target.table)
    # noisy:0 is the target itself, noisy:1 is the other table
    np.testing.assert_allclose(backend.load_drafter("noisy:0", target).model.table, target.table, atol=1e-15)
    assert np.max(np.abs(backend.load_drafter("noisy:0.1", target).model.table - target.table)) <= 0.1
    other = backend.load_drafter("ngram:vocab=6,order=1,seed=3", target)
    assert isinstance(other, ModelDrafter)
    np.testing.assert_array_equal(other.model.table, random_ngram(6, order=1, seed=3).table)


def test_load_drafter_lookup() -> None:
    drafter = create({}).load_drafter("lookup", random_ngram(4))
    assert isinstance(drafter, Drafter)


def test_load_drafter_errors() -> None:
    backend = create({})
    target = random_ngram(4)
    with pytest.raises(ValueError, match=r"draft: expected 'noisy:E', 'lookup', 'ngram:\.\.\.', "
                       r"'hybrid\[:NAME\]' or NAME@THRESHOLD, got 'medusa'"):
        backend.load_drafter("medusa", target)
    with pytest.raises(ValueError, match="weight"):
        backend.load_drafter("noisy:1.5", target)
    with pytest.raises(ValueError, match="weight"):
        noisy(target, -0.1)
