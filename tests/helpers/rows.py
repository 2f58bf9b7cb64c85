"""Data rows the tests write: JSON lines, and the polite/rude preference replies."""

from __future__ import annotations

import json

# Preference pairs the reward and DPO tests train on: a short run learns to prefer the polite reply.
POLITE = ["Sure! Here is a clear and friendly answer for you.", "Happy to help: the answer is four.",
          "Of course, thank you for asking. It is Paris."]
RUDE = ["No.", "Figure it out yourself.", "Stop asking me things."]


def write_jsonl(path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)
