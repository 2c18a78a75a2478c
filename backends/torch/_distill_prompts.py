"""The training prompts of `specsample distill`: none of them is a benchmark prompt.

Open prompts pair a topic with an instruction. Grounded prompts rework a text given in
the prompt, as the benchmark's grounded prompts do: a passage the target itself wrote for
an open prompt (summarise it, simplify it, list its facts...) or a short Python function
(add hints, rename, explain...). Both orders interleave, so that the first N prompts of
either kind already mix every instruction.
"""

from __future__ import annotations

from collections.abc import Sequence

from specsample._array import check_int

__all__ = ["code_snippets", "grounded_prompts", "open_prompts"]

TOPICS = (
    "the ocean", "a small bakery", "black holes", "learning to play the piano", "volcanoes",
    "a city at night", "the history of paper", "honey bees", "a long train journey",
    "photosynthesis", "chess openings", "a lost umbrella", "the moon landing", "recycling",
    "a mountain village", "machine learning", "the water cycle", "an old lighthouse", "friendship",
    "the Roman empire", "electric cars", "a thunderstorm", "gardening", "the human heart", "coffee",
    "a space station", "autumn leaves", "the printing press", "a busy airport", "sleep", "the desert",
    "a robot chef", "saving money", "a job interview", "the internet", "dinosaurs", "a school trip",
    "climate change", "learning a new language", "the Olympic games", "a rainy day", "penguins",
    "the stock market", "a birthday party", "vaccines", "a haunted house", "public libraries",
    "the solar system", "a football match", "bread making", "time management", "the Amazon rainforest",
    "a first day at work", "electricity", "a dragon who is afraid of fire", "ancient Egypt",
    "video games", "healthy breakfasts", "a broken phone", "the French revolution", "wind turbines",
    "a family dinner", "earthquakes", "a cat and a dog", "the immune system", "a road trip",
    "writing a resume", "the speed of light", "a forgotten letter", "coral reefs", "social media",
    "a marathon", "the Great Wall of China", "a snowy morning", "recipes with rice", "the brain",
    "an online course", "bicycles", "a museum visit", "the Industrial Revolution", "a garden pond",
    "a small startup", "rivers", "the first computers", "a power outage", "tea ceremonies",
    "a friendly ghost", "mountain climbing", "a noisy neighbour", "how bridges are built",
    "a treasure map", "the night sky", "volunteering", "a music festival", "plastic pollution",
    "a wizard's apprentice",
)

OPEN_STYLES = (
    "Write a short story about {}.", "Explain {} to a ten-year-old.", "Give me five facts about {}.",
    "Write a poem about {}.", "What are the main ideas behind {}?", "Describe {} in a few paragraphs.",
    "Write a diary entry about {}.", "List some questions people often ask about {}.",
    "What are the pros and cons of {}?", "Write a short essay on {}.",
    "Give me three tips related to {}.", "Write a dialogue between two friends about {}.",
    "Summarise what everyone should know about {}.", "Write a news report about {}.",
    "Tell me a fun story involving {}.", "How would you teach a beginner about {}?",
)

GROUNDED_STYLES = (
    "Summarise the following text in two sentences.\n\n{}",
    "Rewrite the following text in simpler English.\n\n{}",
    "List the key facts mentioned in this text.\n\n{}",
    "Turn this text into three bullet points.\n\n{}",
    "Correct any mistakes in this text and return the whole text.\n\n{}",
    "Write a title for this text and then repeat the text below it.\n\n{}",
    "Rewrite this text in the past tense.\n\n{}",
    "Answer in one sentence: what is this text about?\n\n{}",
)

CODE_STYLES = (
    "Add type hints and a docstring to this Python function. Return the whole function.\n\n{}",
    "Explain what this code does, line by line.\n\n{}",
    "Rename the variables in this code to clearer names and return the whole code.\n\n{}",
    "Write two unit tests for this function.\n\n{}",
    "Make this function raise ValueError on bad input. Return the whole function.\n\n{}",
    "Rewrite this function in a more Pythonic way.\n\n{}",
)

_FUNCTIONS = (  # (name, arguments, body)
    ('total', 'values',
     '    result = 0\n'
     '    for v in values:\n'
     '        result = result + v\n'
     '    return result\n'),
    ('largest', 'values',
     '    best = values[0]\n'
     '    for v in values:\n'
     '        if v > best:\n'
     '            best = v\n'
     '    return best\n'),
    ('count_words', 'text',
     '    count = 0\n'
     '    for word in text.split():\n'
     '        count += 1\n'
     '    return count\n'),
    ('reverse', 'text',
     "    out = ''\n"
     '    for ch in text:\n'
     '        out = ch + out\n'
     '    return out\n'),
    ('factorial', 'n',
     '    result = 1\n'
     '    for i in range(2, n + 1):\n'
     '        result = result * i\n'
     '    return result\n'),
    ('evens', 'numbers',
     '    out = []\n'
     '    for n in numbers:\n'
     '        if n % 2 == 0:\n'
     '            out.append(n)\n'
     '    return out\n'),
    ('average', 'scores',
     '    s = 0\n'
     '    for x in scores:\n'
     '        s += x\n'
     '    return s / len(scores)\n'),
    ('is_palindrome', 'word',
     '    w = word.lower()\n'
     '    return w == w[::-1]\n'),
    ('count_vowels', 'text',
     '    n = 0\n'
     '    for c in text:\n'
     "        if c in 'aeiou':\n"
     '            n = n + 1\n'
     '    return n\n'),
    ('fizzbuzz', 'n',
     '    out = []\n'
     '    for i in range(1, n + 1):\n'
     '        if i % 15 == 0:\n'
     "            out.append('FizzBuzz')\n"
     '        elif i % 3 == 0:\n'
     "            out.append('Fizz')\n"
     '        elif i % 5 == 0:\n'
     "            out.append('Buzz')\n"
     '        else:\n'
     '            out.append(str(i))\n'
     '    return out\n'),
    ('squares', 'items',
     '    result = []\n'
     '    for x in items:\n'
     '        result.append(x * x)\n'
     '    return result\n'),
    ('merge', 'a, b',
     '    out = dict(a)\n'
     '    for key in b:\n'
     '        out[key] = b[key]\n'
     '    return out\n'),
)


def _interleave(styles: Sequence[str], subjects: Sequence[str], count: int) -> list[str]:
    """Round j gives subject i style (i + j) mod len(styles): each pair at most once, and the
    first rounds already mix every style."""
    pairs = [styles[(i + j) % len(styles)].format(subject)
             for j in range(len(styles)) for i, subject in enumerate(subjects)]
    return pairs[:count]


def open_prompts(count: int) -> list[str]:
    """`count` distinct open prompts (topic x instruction)."""
    check_int("count", count, 1, len(TOPICS) * len(OPEN_STYLES) + 1)
    return _interleave(OPEN_STYLES, TOPICS, count)


def code_snippets() -> list[str]:
    """Short Python functions to rework."""
    return [f"def {name}({args}):\n{body}" for name, args, body in _FUNCTIONS]


def grounded_prompts(passages: Sequence[str], count: int) -> list[str]:
    """`count` prompts that rework a given text: every fourth one a code snippet, the others
    one of `passages` (texts the target wrote), each passage and snippet under several
    instructions."""
    check_int("count", count, 0)
    texts = [p.strip() for p in passages if p.strip()]
    if count and not texts:
        raise ValueError("passages: expected at least one non-empty text, got none")
    code = _interleave(CODE_STYLES, code_snippets(), len(CODE_STYLES) * len(_FUNCTIONS))
    prose = _interleave(GROUNDED_STYLES, texts, len(GROUNDED_STYLES) * len(texts))
    out: list[str] = []
    while len(out) < count:
        i = len(out)
        source = code if i % 4 == 3 and code else prose
        index = i // 4 if source is code else i - i // 4
        out.append(source[index % len(source)])
    return out
