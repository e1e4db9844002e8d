"""Generate the shipped demo corpus (include/corpus/*.txt): original, licence-clean, deterministic.

Run: python include/tools/make_corpus.py include/corpus
The text is made from small grammars (stories, weather reports, arithmetic facts), so a
tiny model can learn its structure in a few hundred steps on a CPU.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
           "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen"]
ANIMALS = ["fox", "owl", "rabbit", "heron", "badger", "otter", "wren", "deer", "mole", "hare"]
ADJECTIVES = ["small", "quiet", "clever", "old", "young", "brave", "sleepy", "curious", "patient", "quick"]
PLACES = ["the river", "the old mill", "the meadow", "the pine forest", "the stone bridge", "the orchard",
          "the hill", "the lake shore", "the village square", "the garden wall"]
TIMES = ["in the morning", "at noon", "in the evening", "at night", "before dawn", "after the rain"]
VERBS = [("walks to", "walked to"), ("looks for", "looked for"), ("waits near", "waited near"),
         ("sings at", "sang at"), ("runs past", "ran past"), ("rests by", "rested by")]
THINGS = ["a red apple", "a blue stone", "a lost key", "an old map", "a warm loaf", "a silver bell",
          "a wooden box", "a paper boat"]
FEELINGS = ["happy", "tired", "surprised", "hungry", "calm", "proud"]
WEATHER = ["sunny", "cloudy", "windy", "rainy", "foggy", "cold", "warm"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def story(rng: random.Random) -> str:
    a, b = rng.sample(ANIMALS, 2)
    adj = rng.choice(ADJECTIVES)
    place, time = rng.choice(PLACES), rng.choice(TIMES)
    verb_now, verb_past = rng.choice(VERBS)
    thing = rng.choice(THINGS)
    feeling = rng.choice(FEELINGS)
    lines = [
        f"The {adj} {a} {verb_now} {place} {time}.",
        f"There the {a} finds {thing}.",
        f"The {a} shows {thing} to the {b}.",
        f"The {b} is {feeling} and says thank you.",
        f"Yesterday the {a} {verb_past} {rng.choice(PLACES)} as well.",
    ]
    return " ".join(lines[: rng.randint(3, 5)])


def weather(rng: random.Random) -> str:
    day = rng.choice(DAYS)
    w1, w2 = rng.choice(WEATHER), rng.choice(WEATHER)
    t = rng.randint(0, 18)
    return (f"Weather report for {day}: the morning is {w1} and the afternoon is {w2}. "
            f"The temperature is {NUMBERS[t]} degrees.")


def arithmetic(rng: random.Random) -> str:
    x, y = rng.randint(0, 9), rng.randint(0, 9)
    if rng.random() < 0.5:
        return f"{NUMBERS[x].capitalize()} plus {NUMBERS[y]} is {NUMBERS[x + y]}."
    big, small = max(x, y), min(x, y)
    return f"{NUMBERS[big].capitalize()} minus {NUMBERS[small]} is {NUMBERS[big - small]}."


def make(out: Path, files: int = 3, lines_per_file: int = 650, seed: int = 20261129) -> None:
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        chunks = []
        for _ in range(lines_per_file):
            r = rng.random()
            chunks.append(story(rng) if r < 0.6 else weather(rng) if r < 0.8 else arithmetic(rng))
            if rng.random() < 0.05:
                chunks.append("")  # paragraph breaks
        (out / f"part-{i:02d}.txt").write_text("\n".join(chunks) + "\n", encoding="utf-8")


if __name__ == "__main__":
    make(Path(sys.argv[1] if len(sys.argv) > 1 else "include/corpus"))
