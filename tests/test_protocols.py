"""`specsample.core.protocols.forward_select` on a Model without one of its own: its forward,
the wanted columns taken; no logits for a prefill; features only from a FeatureModel."""

from __future__ import annotations

import numpy as np
import pytest
from specsample_backends.reference.ngram import NGramModel

from specsample.core.protocols import SelectiveModel, forward_select


def _model(vocab: int = 5, order: int = 2) -> NGramModel:
    table = np.random.default_rng(0).dirichlet(np.ones(vocab), size=(vocab,) * order)
    return NGramModel(table)


def test_the_fallback_takes_the_chosen_column_of_each_row() -> None:
    model = _model()
    assert not isinstance(model, SelectiveModel)
    ids = np.array([[1, 2, 3, 4], [0, 4, 4, 1], [2, 2, 0, 3]])
    full, _ = model.forward(ids, model.new_cache(3, 8))
    columns = np.array([3, 0, 2])
    got, features, cache = forward_select(model, ids, model.new_cache(3, 8), columns)
    assert features is None and cache.lengths.tolist() == [4, 4, 4]
    np.testing.assert_array_equal(got, full[np.arange(3), columns])
    assert not np.array_equal(got, full[:, -1])  # a negative control: not simply the last column


def test_a_prefill_computes_no_logits_and_leaves_the_cache_a_forward_leaves() -> None:
    model = _model()
    ids = np.array([[1, 2, 3, 4], [0, 4, 4, 1]])
    none, features, cache = forward_select(model, ids[:, :3], model.new_cache(2, 8), None)
    assert none is None and features is None
    _, reference = model.forward(ids[:, :3], model.new_cache(2, 8))
    step, _ = model.forward(ids[:, 3:], cache)
    want, _ = model.forward(ids[:, 3:], reference)
    np.testing.assert_array_equal(step, want)


def test_features_need_a_feature_model() -> None:
    model = _model()
    with pytest.raises(TypeError, match="model: features were asked for: expected a FeatureModel"):
        forward_select(model, np.array([[1, 2]]), model.new_cache(1, 4), None, features=True)


def test_bad_columns_are_named() -> None:
    model = _model()
    ids = np.array([[1, 2, 3], [0, 4, 4]])
    with pytest.raises(ValueError, match=r"columns: expected values in \[0, 3\), got range \[0, 3\]"):
        forward_select(model, ids, model.new_cache(2, 4), np.array([0, 3]))
    with pytest.raises(ValueError, match=r"columns: expected shape \[2\], got \[3\]"):
        forward_select(model, ids, model.new_cache(2, 4), np.array([0, 1, 2]))
    with pytest.raises(TypeError, match="columns: expected an integer array of column indices"):
        forward_select(model, ids, model.new_cache(2, 4), np.array([0.0, 1.0]))
