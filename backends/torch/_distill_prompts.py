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

__all__ = ["ALL_TOPICS", "code_snippets", "grounded_prompts", "open_prompts"]

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

# Topics past the first 96 (`open_prompts(count, topics)`), for a plan that spreads its
# prompts over more subjects.
MORE_TOPICS = (
    "a village baker who wins a prize", "the invention of the telephone", "jellyfish",
    "a quiet library at dawn",
    "how airplanes stay in the air", "the Silk Road", "a lost dog finding its way home", "tides", "glaciers",
    "the first day of school", "a detective who solves a small mystery", "the history of chocolate",
    "owls", "a storm-chasing scientist", "how vaccines are tested", "the Renaissance", "a ship in a bottle",
    "how to plan a budget", "a talking tree", "the life of a honey farmer", "rain forests in Asia",
    "the Wright brothers", "a city bus driver", "how a compass works", "octopuses", "the Vikings",
    "a grandmother's recipe book", "solar panels", "a magician's last trick", "the Sahara desert",
    "learning to swim", "how cheese is made", "a lonely astronaut", "the Moon's phases", "sharks",
    "a tiny house", "the Ming dynasty", "how a bill becomes a law", "a knight who hates swords",
    "the periodic table", "an island with no people", "the history of the bicycle", "wolves",
    "a farmers' market", "how to write a good email", "the Titanic", "a kite festival", "magnets",
    "a clock that runs backwards", "the Aztecs", "how soap cleans", "a young inventor", "bats",
    "the Northern Lights", "a bookshop cat", "the Cold War", "how to care for a houseplant",
    "a submarine voyage", "the human skeleton", "a street musician", "elephants", "the Mayan calendar",
    "a summer camp", "how maps are made", "a pirate who gets seasick", "the ozone layer", "frogs",
    "a winter market", "the history of money", "a robot gardener", "how rockets work", "the Alps",
    "a school science fair", "tornadoes", "a letter from the future", "ancient Greece", "butterflies",
    "how to make new friends", "a haunted train station", "the life cycle of a star", "a fishing village",
    "the history of the printing of maps", "how a refrigerator works", "a shy giant", "the Nile river",
    "recycling glass", "a lemonade stand", "the invention of the light bulb", "dolphins",
    "a night at the museum", "how to study for an exam", "the Great Barrier Reef", "a clumsy wizard",
    "fossils", "a postman's day", "the history of jazz", "how the heart pumps blood", "a desert oasis",
    "a mystery in a bakery", "tigers", "the first Olympic marathon", "how earthquakes are measured",
    "a talking parrot", "the Andes mountains", "a carpenter's workshop", "how paper is recycled",
    "the Black Death", "a snowman who wants to see summer", "hummingbirds", "a city park in spring",
    "how to brew tea", "the invention of the wheel", "a lost key", "the Arctic", "a young chess champion",
    "how the internet sends messages", "a castle in ruins", "ants", "the history of football",
    "a ferry crossing", "how clouds form", "a retired pilot", "the Inca roads", "a dragon egg",
    "how to start a vegetable garden", "the Hubble telescope", "a noisy classroom", "polar bears",
    "a market in Marrakesh", "the steam engine", "a secret tunnel", "how glass is made", "whales",
    "a baking competition", "the Declaration of Independence", "a forest fire", "how bees make honey",
    "a time traveller's mistake", "the Pacific Ocean", "a music teacher", "how batteries work", "camels",
    "a village festival", "the invention of the printing telegraph", "a broken bicycle", "deserts at night",
    "how to give a speech", "a cloud that cannot rain", "the Moon's craters", "parrots",
    "a night shift nurse",
    "the history of tea", "how a camera works", "a forgotten toy", "the Great Fire of London", "squirrels",
    "a picnic by the lake", "how muscles grow", "a keeper at a wildlife park", "the Mediterranean Sea",
    "an old map", "how to say sorry", "the Space Race", "a mountain rescue", "turtles", "a quiet café",
    "how the eye sees colour", "a talking snowflake", "the history of medicine", "a stolen painting",
    "how wind is made", "the Himalayas", "a spelling bee", "crows", "a harbour at sunrise",
    "how to train a puppy", "the fall of Rome", "a friendly alien", "the history of the alphabet",
    "how to keep a journal", "a storm over the prairie", "lions", "a flower shop", "the invention of radio",
    "a treehouse", "how a volcano erupts", "a stubborn goat", "the Amazon river", "a school play",
    "how to save energy at home", "the first cars", "a message in a bottle", "sea turtles", "a toy factory",
    "how a seed becomes a tree", "the Trojan horse", "a new neighbour", "how to cook pasta", "the Milky Way",
    "a sleepy bear", "a bakery in Paris", "how planes are built", "the Pyramids of Giza", "a snow day",
    "how to read a map", "a brave mouse", "the history of the piano", "lightning", "a city marathon",
    "how to be a good listener", "a shipwreck", "the rainforest canopy", "a clock tower", "foxes",
    "a science museum", "how water is cleaned", "a retired superhero", "the Middle Ages", "a kitchen garden",
    "how to learn to juggle", "a lonely robot", "the history of flight", "a trip to the zoo", "seals",
    "how stars are born", "a village well", "the invention of the internet", "a hot air balloon",
    "how to make a paper boat", "a quiet beach in winter", "the Great Depression", "kangaroos",
    "a neighbourhood cleanup", "how the stomach digests food", "a wandering minstrel", "the Galapagos",
    "a farm in the morning", "how to organise a room", "the Moon's gravity", "a mysterious door", "horses",
    "the history of cinema", "how an engine works", "a rainy bus ride", "the Sahara's past",
    "a young astronaut", "how spiders spin webs", "a library card", "the Greek myths", "a country fair",
    "how to stay calm before a test", "a sunken city", "the history of writing", "eagles", "a village doctor",
    "how sound travels", "a time capsule", "the Arctic tundra", "a potter's wheel", "how to make bread rise",
    "a broken clock", "the Moon and the tides", "zebras", "a city at dawn", "how a bridge holds weight",
    "a cat who wants to fly", "the story of the Mona Lisa", "a snowy forest", "how to plant a tree",
    "the history of sport", "a noisy parrot", "how rain forms", "a small fishing boat", "the Atlantic Ocean",
    "a long winter", "how computers store numbers", "a secret garden", "the Ice Age", "a village school",
    "how to pick a good book", "a runaway balloon", "the history of trains", "giraffes", "an old violin",
    "how the lungs work", "a storm at sea", "the Greek Olympics", "a circus", "how to help a friend",
    "a quiet mountain lake", "the invention of the microscope", "a curious cat", "how islands form",
    "a bus stop conversation", "the history of the calendar", "a garden gnome", "how the Sun makes light",
    "a bicycle race", "the Roman roads", "a lost mitten", "how to write a poem", "the deep sea", "a bee hive",
    "a midnight feast", "how plants drink water", "the history of castles", "a pen pal", "rabbits",
    "a sandcastle", "how to fix a flat tyre", "the first maps of the world", "a wise old turtle",
    "how to count calories", "the planets", "a village blacksmith", "a cold morning", "how thunder works",
    "the history of the Olympic torch", "a radio show", "how to write a thank-you note", "a swan",
    "a mountain train", "how to make compost", "the story of a raindrop", "a young king", "how ice melts",
)

ALL_TOPICS = len(TOPICS) + len(MORE_TOPICS)

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


def open_prompts(count: int, topics: int = len(TOPICS)) -> list[str]:
    """`count` distinct open prompts (topic x instruction) on the first `topics` topics (the
    96 of `TOPICS`, then `MORE_TOPICS`)."""
    check_int("topics", topics, 1, ALL_TOPICS + 1)
    check_int("count", count, 1, topics * len(OPEN_STYLES) + 1)
    return _interleave(OPEN_STYLES, (TOPICS + MORE_TOPICS)[:topics], count)


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
