"""A statistical toolkit to check that a sampler follows the law it should.

- `goodness_of_fit`: samples against a known law (TV concentration, then a G-test).
- `homogeneity`: two samples against each other (e.g. speculative vs plain sampling).
- `tree_samples`: many speculative and plain samples of a real model's first tokens, each
  distinct prefix evaluated once (`PrefixLaws`).
- `most_likely_sequences`, `project_sequences`: the most likely first tokens of an
  autoregressive law with their exact probabilities, as the outcomes of a goodness-of-fit
  test chosen before sampling.
- `samples_needed`, `samples_needed_two_sample`, `detectable_tv`: sizes and power.
- `exact_round_law`, `exact_sequence_law`, `autoregressive_law`, `accepted_length_law`,
  `expected_tokens_per_round`: exact laws of speculative sampling, with Fractions
  (token-wise or block verification); `block_thresholds`: block verification's p_i, h_i.

The tests' tail probabilities come from scipy, which the core does not need: it is the
`testing` extra (`pip install 'specsample[testing]'`).
"""

from __future__ import annotations

try:
    import scipy.stats  # noqa: F401
except ImportError as err:
    raise ImportError("specsample.testing needs scipy, which specsample installs only with an extra: "
                      "pip install 'specsample[testing]'") from err

from specsample.testing._exact import (
    accepted_length_law,
    autoregressive_law,
    block_thresholds,
    exact_round_law,
    exact_sequence_law,
    expected_tokens_per_round,
)
from specsample.testing._gof import FitResult, goodness_of_fit
from specsample.testing._homogeneity import HomogeneityResult, homogeneity
from specsample.testing._power import detectable_tv, samples_needed, samples_needed_two_sample
from specsample.testing._prefix import PrefixLaws
from specsample.testing._top import most_likely_sequences, project_sequences
from specsample.testing._tree import tree_samples

__all__ = ["FitResult", "HomogeneityResult", "PrefixLaws", "accepted_length_law",
           "autoregressive_law", "block_thresholds", "detectable_tv", "exact_round_law", "exact_sequence_law",
           "expected_tokens_per_round", "goodness_of_fit", "homogeneity", "most_likely_sequences",
           "project_sequences", "samples_needed",
           "samples_needed_two_sample", "tree_samples"]
