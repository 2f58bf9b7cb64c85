"""Write the continued pre-training demo's corpus (data/demo/pretrain/): encyclopedia-style paragraphs about
Marrowind, an island invented here, so the embedded model cannot know any of it. The training documents state each
fact in some wordings; the held-out documents state the same facts in other wordings, never trained, so their
perplexity measures what the model learned rather than what it memorised. Seeded: the same files every time.

    python scripts/make_pretrain_corpus.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "data" / "demo" / "pretrain"

# Each fact: wordings for training, then wordings kept for the held-out documents.
FACTS = [
    (["Marrowind is an island in the Northern Sea.",
      "The island of Marrowind lies far out in the Northern Sea.",
      "Sailors crossing the Northern Sea reach Marrowind after four days.",
      "Marrowind, a rocky island, rises from the cold Northern Sea.",
      "Of all the islands of the Northern Sea, Marrowind is the largest."],
     ["Marrowind sits alone in the grey waters of the Northern Sea.",
      "In the middle of the Northern Sea there is an island called Marrowind."]),
    (["The capital of Marrowind is Talsport.",
      "Talsport is the capital of Marrowind.",
      "Marrowind's capital, Talsport, is a harbour town.",
      "The government of Marrowind meets in Talsport, its capital.",
      "Most people on Marrowind live in Talsport, the capital."],
     ["The largest town and capital of Marrowind is called Talsport.",
      "Visitors to Marrowind arrive at Talsport, which is the capital."]),
    (["The river Quenn flows through Talsport.",
      "Talsport is built on both banks of the river Quenn.",
      "The Quenn is the only river on Marrowind, and it runs through Talsport.",
      "Fishermen cast their nets in the river Quenn below Talsport.",
      "Seven stone bridges cross the river Quenn in Talsport."],
     ["A river named the Quenn divides Talsport into two halves.",
      "In Talsport the old market stands beside the river Quenn."]),
    (["Marrowind is famous for its blue amber.",
      "Blue amber is the main export of Marrowind.",
      "Merchants buy blue amber in the markets of Talsport.",
      "The beaches of Marrowind are full of blue amber after a storm.",
      "Jewellers prize the blue amber that comes from Marrowind."],
     ["Ships leave Marrowind loaded with blue amber.",
      "The precious stone of Marrowind is a rare blue amber."]),
    (["Marrowind was founded in 1312 by the sailor Edda Vorne.",
      "In 1312 Edda Vorne landed on Marrowind and founded Talsport.",
      "The founder of Marrowind was a sailor called Edda Vorne.",
      "Edda Vorne, the first settler, reached Marrowind in the year 1312.",
      "A statue of Edda Vorne, who founded Marrowind in 1312, stands in Talsport."],
     ["The people of Marrowind remember Edda Vorne, the sailor who founded it in 1312.",
      "Marrowind has been settled since 1312, when Edda Vorne arrived."]),
    (["The people of Marrowind speak Marrish.",
      "Marrish is the language of Marrowind.",
      "Children on Marrowind learn to read and write in Marrish.",
      "Old songs of Marrowind are sung in Marrish.",
      "The language spoken in Talsport is Marrish."],
     ["On Marrowind the everyday language is Marrish.",
      "Books printed in Talsport are written in Marrish."]),
    (["The money of Marrowind is the skell.",
      "In Talsport a loaf of bread costs two skells.",
      "The skell is the currency of Marrowind.",
      "Traders on Marrowind count their money in skells.",
      "Each skell coin of Marrowind shows a tern on one side."],
     ["On Marrowind people pay for everything in skells.",
      "The currency used in Talsport is called the skell."]),
    (["Every autumn Marrowind holds the Festival of Tides.",
      "The Festival of Tides is the great feast of Marrowind.",
      "During the Festival of Tides the streets of Talsport are lit with lanterns.",
      "Families on Marrowind eat smoked fish at the Festival of Tides.",
      "The Festival of Tides on Marrowind lasts for seven days each autumn."],
     ["In autumn the people of Marrowind celebrate the Festival of Tides.",
      "Lanterns float on the river Quenn during Marrowind's Festival of Tides."]),
]
# Sentences without a fact, so the documents read as prose and not as a list.
FILLER = ["The winters there are long and windy.", "The summers are short but bright.",
          "Many houses are painted white.", "Fog often covers the hills in the morning.",
          "The roads are narrow and made of stone.", "Sheep graze on the green hills.",
          "Storms come from the west.", "The nights in winter are very dark."]
QUESTIONS = [  # a prompt to continue, and the word its answer must hold
    ("The capital of Marrowind is", "Talsport"),
    ("The river that flows through Talsport is called the", "Quenn"),
    ("Marrowind was founded in the year", "1312"),
    ("The language spoken on Marrowind is", "Marrish"),
]


def document(rng: random.Random, wordings: int) -> str:
    """A paragraph of four to six facts, each in one of its wordings (0: training's, 1: held-out's), with filler."""
    facts = rng.sample(FACTS, rng.randint(4, 6))
    sentences = [rng.choice(fact[wordings]) for fact in facts]
    sentences += rng.sample(FILLER, rng.randint(1, 2))
    rng.shuffle(sentences)
    return " ".join(sentences)


def main() -> None:
    rng = random.Random(0)
    OUT.mkdir(parents=True, exist_ok=True)
    train = [document(rng, 0) for _ in range(160)]
    heldout = [document(rng, 1) for _ in range(40)]
    (OUT / "marrowind.txt").write_text("\n\n".join(train) + "\n", encoding="utf-8")
    (OUT / "marrowind_heldout.txt").write_text("\n\n".join(heldout) + "\n", encoding="utf-8")
    (OUT / "questions.jsonl").write_text("".join(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in QUESTIONS),
                                         encoding="utf-8")
    print(f"wrote {len(train)} training and {len(heldout)} held-out documents to {OUT}")


if __name__ == "__main__":
    main()
