"""The benchmarks' built-in prompts (user messages; `specsample.api.runner.encode_text` formats them)."""

from __future__ import annotations

__all__ = ["BATCH_PROMPTS", "GREEDY_EXTRA", "MEMORY_PROMPT", "PROMPTS", "greedy_prompts"]

_PARAGRAPH = (
    "The lighthouse at Point Reyes was built in 1870 to warn ships away from the rocky "
    "headland, one of the foggiest places on the Pacific coast. Its first-order Fresnel lens, "
    "made in France, was hauled up the cliff in pieces and assembled on site. For more than a "
    "century keepers wound the clockwork every two hours through the night so that the lens "
    "kept turning. In 1975 the Coast Guard replaced it with an automated light, and the old "
    "lens became the centrepiece of a small museum.")
_CODE = (
    "def mean(values):\n"
    "    total = 0\n"
    "    for v in values:\n"
    "        total = total + v\n"
    "    return total / len(values)\n")

# (tag, prompt): "open" asks for new text; "grounded" reworks text given in the prompt
# (where copying drafts such as prompt lookup shine). Alternating, so the first N mix.
PROMPTS: tuple[tuple[str, str], ...] = (
    ("open", "Write a short story about a robot who learns to paint."),
    ("grounded", f"Summarise the following paragraph in two sentences.\n\n{_PARAGRAPH}"),
    ("open", "Explain how a rainbow forms, for a ten-year-old."),
    ("grounded", "Add type hints and a docstring to this Python function, and make it raise "
                 f"ValueError on an empty list. Return the whole function.\n\n{_CODE}"),
    ("open", "Give me five ideas for a rainy Sunday afternoon."),
    ("grounded", f"Rewrite the following paragraph in simpler English.\n\n{_PARAGRAPH}"),
    ("open", "What are the pros and cons of working from home?"),
    ("grounded", "Rename the variable `total` to `running_sum` and `v` to `value` in this "
                 f"code, and return the whole code.\n\n{_CODE}"),
    ("grounded", f"List the dates and numbers mentioned in this paragraph.\n\n{_PARAGRAPH}"),
)

# Eight prompts of very different lengths: one ragged batch.
BATCH_PROMPTS: tuple[str, ...] = (
    "Write a haiku about the sea.",
    "Rewrite this sentence in the passive voice: The committee approved the new budget after a long debate.",
    "What is 17 times 23? Explain step by step.",
    "List three uses of copper.",
    "Summarise: Photosynthesis converts light energy into chemical energy stored in glucose, "
    "releasing oxygen as a by-product. It takes place mainly in the chloroplasts of leaf cells.",
    "Translate to French: Good morning, how are you today?",
    "def add(a, b):\n    return a + b\n\nAdd type hints and a docstring to this function.",
    "Why is the sky blue?",
)

GREEDY_EXTRA: tuple[str, ...] = (
    "Describe the water cycle in four sentences.",
    "Write a limerick about a cat who loves cheese.",
    "Convert this list to JSON: name Alice, age 30, city Paris.",
    "Explain recursion to a beginner programmer, with a short Python example.",
    "What should I pack for a weekend hiking trip?",
)

MEMORY_PROMPT = "Tell me a very long story about a lighthouse keeper."


def greedy_prompts() -> list[str]:
    """The models prompts, the batch prompts and a few more: 22 distinct user messages."""
    return list(dict.fromkeys([text for _, text in PROMPTS] + list(BATCH_PROMPTS) + list(GREEDY_EXTRA)))
