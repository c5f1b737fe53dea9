"""Write the small GLUE-format sample bundled in ``recipes/data/glue_sample/``.

Every sentence is generated here from templates and word lists written for this package
(nothing is taken from GLUE); the output is deterministic (fixed seed), so rerunning the
script reproduces the committed files byte for byte::

    python recipes/data/make_glue_sample.py [--out recipes/data/glue_sample]

Files (column names and label conventions as in GLUE):

* ``sst2/{train,validation}.tsv`` (sentence, label: 0 negative / 1 positive) and
  ``sst2/test.tsv`` (idx, sentence; no labels), single-sentence classification;
* ``mrpc/{train,validation}.csv`` (sentence1, sentence2, label: 1 paraphrase), pairs;
* ``stsb/{train,validation}.json`` (JSON lines: sentence1, sentence2, label float in [0, 5]),
  regression;
* ``mnli/{train,validation_matched,validation_mismatched}.json`` (JSON lines: premise,
  hypothesis, genre, label: 0 entailment / 1 neutral / 2 contradiction); the mismatched
  split uses genres absent from training.

Validation sizes are odd so that evaluation padding in multi-process runs would show.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent / "glue_sample"

# ---------------------------------------------------------------- SST-2 format
POS_ADJ = ["wonderful", "delightful", "charming", "brilliant", "moving", "funny", "warm", "gripping",
           "beautiful", "clever", "lovely", "superb", "touching", "joyful", "smart", "fresh", "tender",
           "excellent", "thrilling", "graceful"]
NEG_ADJ = ["dull", "boring", "clumsy", "tedious", "awful", "lifeless", "bland", "messy", "painful",
           "tiresome", "shallow", "stale", "weak", "forgettable", "sloppy", "grating", "hollow",
           "terrible", "pointless", "muddled"]
NOUNS = ["film", "movie", "story", "script", "cast", "ending", "soundtrack", "plot", "picture", "comedy",
         "drama", "performance", "director", "dialogue", "camera work", "sequel", "thriller", "romance"]
POS_VERB = ["loved", "enjoyed", "adored", "admired", "treasured"]
NEG_VERB = ["hated", "disliked", "regretted", "endured", "resented"]
POS_PHRASE = ["a real pleasure to watch", "worth every minute", "full of life", "a small triumph",
              "easy to recommend", "a joy from start to finish"]
NEG_PHRASE = ["a waste of an evening", "hard to sit through", "a chore to watch", "a total mess",
              "easy to forget", "a long slog"]
INTENS = ["very", "truly", "rather", "quite", "so", "really", "utterly", "simply"]
SUBJ = ["i", "we", "my friends", "the audience", "everyone i know", "my sister"]


def _sentiment_sentence(rng: random.Random, label: int) -> str:
    adj = POS_ADJ if label else NEG_ADJ
    verb = POS_VERB if label else NEG_VERB
    phrase = POS_PHRASE if label else NEG_PHRASE
    noun = rng.choice(NOUNS)
    templates = [
        lambda: f"the {noun} is {rng.choice(INTENS)} {rng.choice(adj)}",
        lambda: f"a {rng.choice(adj)} {noun}",
        lambda: f"{rng.choice(SUBJ)} {rng.choice(verb)} this {noun}",
        lambda: f"the {noun} was {rng.choice(adj)} and {rng.choice(adj)}",
        lambda: f"this {noun} is {rng.choice(phrase)}",
        lambda: f"{rng.choice(INTENS)} {rng.choice(adj)} , {rng.choice(phrase)}",
        lambda: f"with a {rng.choice(adj)} {rng.choice(NOUNS)} , the {noun} feels {rng.choice(adj)}",
    ]
    return rng.choice(templates)()


def make_sst2(rng: random.Random, n_train: int, n_val: int, n_test: int):
    seen: set[str] = set()
    rows = []
    while len(rows) < n_train + n_val + n_test:
        label = len(rows) % 2 if rng.random() < 0.5 else 1 - len(rows) % 2
        sentence = _sentiment_sentence(rng, label)
        if sentence in seen:
            continue
        seen.add(sentence)
        rows.append({"sentence": sentence, "label": label})
    rng.shuffle(rows)
    test = [{"idx": i, "sentence": r["sentence"]} for i, r in enumerate(rows[n_train + n_val:])]
    return rows[:n_train], rows[n_train:n_train + n_val], test


# ---------------------------------------------------------------- MRPC / STS-B format
PEOPLE = ["the mayor", "a local baker", "the new coach", "our teacher", "the pilot", "a young farmer",
          "the museum guide", "the company founder", "a retired nurse", "the team captain"]
ACTIONS = [("opened", "launched"), ("visited", "toured"), ("repaired", "fixed"), ("painted", "decorated"),
           ("sold", "sold off"), ("cleaned", "tidied"), ("bought", "purchased"), ("closed", "shut")]
OBJECTS = ["the old bridge", "a small bakery", "the city library", "a red truck", "the school garden",
           "a wooden boat", "the main station", "a corner shop", "the town hall", "a football pitch"]
PLACES = ["in the north", "near the river", "downtown", "by the harbour", "in the valley", "on the hill",
          "outside the village", "at the market square"]
TIMES = ["on monday", "last week", "in march", "yesterday", "on friday evening", "this spring",
         "early on sunday", "in the autumn"]


def _event(rng: random.Random) -> dict:
    return {"who": rng.choice(PEOPLE), "act": rng.choice(ACTIONS), "what": rng.choice(OBJECTS),
            "where": rng.choice(PLACES), "when": rng.choice(TIMES)}


def _render(ev: dict, variant: int) -> str:
    a, b = ev["act"]
    if variant == 0:
        return f"{ev['who']} {a} {ev['what']} {ev['where']} {ev['when']} ."
    if variant == 1:
        return f"{ev['when']} , {ev['who']} {b} {ev['what']} {ev['where']} ."
    return f"{ev['what']} {ev['where']} was {b} by {ev['who']} {ev['when']} ."


def _alter(rng: random.Random, ev: dict, slots: list[str]) -> dict:
    pools = {"who": PEOPLE, "act": ACTIONS, "what": OBJECTS, "where": PLACES, "when": TIMES}
    new = dict(ev)
    for slot in slots:
        while new[slot] == ev[slot]:
            new[slot] = rng.choice(pools[slot])
    return new


def make_mrpc(rng: random.Random, n: int):
    rows = []
    for i in range(n):
        ev = _event(rng)
        label = int(rng.random() < 0.55)
        other = ev if label else _alter(rng, ev, rng.sample(["who", "act", "what", "where", "when"], rng.choice([1, 2])))
        rows.append({"sentence1": _render(ev, 0), "sentence2": _render(other, rng.choice([1, 2])), "label": label})
    return rows


def make_stsb(rng: random.Random, n: int):
    slots = ["who", "act", "what", "where", "when"]
    rows = []
    for _ in range(n):
        ev = _event(rng)
        k = rng.randint(0, 5)  # number of slots that differ
        other = _alter(rng, ev, rng.sample(slots, k))
        score = max(0.0, min(5.0, 5.0 - k + rng.choice([-0.4, -0.2, 0.0, 0.0, 0.2, 0.4])))
        rows.append({"sentence1": _render(ev, rng.choice([0, 1])), "sentence2": _render(other, rng.choice([0, 2])),
                     "label": round(score, 2)})
    return rows


# ---------------------------------------------------------------- MNLI format
# genre -> (subjects, activities: (core, detail), unrelated extra facts)
GENRES = {
    "kitchen": (["a man", "a woman", "the chef", "two students", "my uncle"],
                [("is cooking", "pasta in a large pot"), ("is baking", "bread for the neighbours"),
                 ("is chopping", "onions on a board"), ("is washing", "the dishes after dinner")],
                ["for a wedding", "because guests are coming", "while listening to the radio"]),
    "sports": (["a girl", "the players", "an old man", "the goalkeeper", "a boy"],
               [("is running", "around the track"), ("is kicking", "a ball across the field"),
                ("is swimming", "in the cold lake"), ("is climbing", "a steep wall")],
               ["to win a medal", "after a long injury", "in front of a big crowd"]),
    "travel": (["a tourist", "the family", "a couple", "the guide", "my cousin"],
               [("is boarding", "a crowded train"), ("is reading", "a map of the city"),
                ("is carrying", "a heavy suitcase"), ("is photographing", "the cathedral")],
               ["on their honeymoon", "for the first time", "before the museum closes"]),
    # mismatched genres (never in train)
    "garden": (["a gardener", "the children", "an artist", "the farmer", "my grandmother"],
               [("is planting", "tulips along the fence"), ("is watering", "the tomato plants"),
                ("is digging", "a hole near the tree"), ("is cutting", "the tall grass")],
               ["to prepare for winter", "as a birthday surprise", "to sell at the fair"]),
    "office": (["a clerk", "the manager", "an intern", "the lawyer", "my colleague"],
               [("is typing", "a long report"), ("is printing", "the new contracts"),
                ("is calling", "an important client"), ("is sorting", "old letters into boxes")],
               ["before the deadline", "to impress the board", "during the lunch break"]),
}
MATCHED = ["kitchen", "sports", "travel"]
MISMATCHED = ["garden", "office"]


def _nli_pair(rng: random.Random, genre: str) -> dict:
    subjects, acts, extras = GENRES[genre]
    subj = rng.choice(subjects)
    core, detail = rng.choice(acts)
    premise = f"{subj} {core} {detail} ."
    label = rng.randrange(3)
    if label == 0:  # entailment: a part of the premise
        hypothesis = rng.choice([f"{subj} {core} .", f"someone {core} {detail} .", f"{subj} {core} something ."])
    elif label == 1:  # neutral: adds an unsupported fact
        hypothesis = f"{subj} {core} {detail} {rng.choice(extras)} ."
    else:  # contradiction: negated or impossible
        other_core = rng.choice([c for c, _ in acts if c != core])
        neg = core.replace("is ", "is not ", 1)
        hypothesis = rng.choice([f"{subj} {neg} {detail} .", f"nobody {core} {detail} .",
                                 f"{subj} {other_core} instead and never {core.split(' ', 1)[1]} ."])
    return {"premise": premise, "hypothesis": hypothesis, "genre": genre, "label": label}


def make_mnli(rng: random.Random, n: int, genres: list[str]):
    return [_nli_pair(rng, rng.choice(genres)) for _ in range(n)]


# ---------------------------------------------------------------- writers
def write_delimited(path: Path, rows: list[dict], delimiter: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter=delimiter, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--seed", type=int, default=20240611)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)

    train, val, test = make_sst2(rng, 400, 101, 21)
    write_delimited(args.out / "sst2" / "train.tsv", train, "\t")
    write_delimited(args.out / "sst2" / "validation.tsv", val, "\t")
    write_delimited(args.out / "sst2" / "test.tsv", test, "\t")

    write_delimited(args.out / "mrpc" / "train.csv", make_mrpc(rng, 160), ",")
    write_delimited(args.out / "mrpc" / "validation.csv", make_mrpc(rng, 51), ",")

    write_jsonl(args.out / "stsb" / "train.json", make_stsb(rng, 160))
    write_jsonl(args.out / "stsb" / "validation.json", make_stsb(rng, 51))

    write_jsonl(args.out / "mnli" / "train.json", make_mnli(rng, 180, MATCHED))
    write_jsonl(args.out / "mnli" / "validation_matched.json", make_mnli(rng, 45, MATCHED))
    write_jsonl(args.out / "mnli" / "validation_mismatched.json", make_mnli(rng, 45, MISMATCHED))
    print(f"wrote the GLUE-format sample to {args.out}")


if __name__ == "__main__":
    main()
