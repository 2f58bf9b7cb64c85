"""Score conversations or preference pairs with a trained reward model, one output line per input row.

    python reward/score.py --model_name_or_path outputs/rm_demo --data_path data/demo/preference_eval.jsonl \
        --output_jsonl outputs/rm_demo/eval_scores.jsonl

Pair rows give {"chosen": float, "rejected": float} (and the accuracy and mean margin are printed);
conversation rows (ending with an assistant turn) give {"score": float}. The recipe itself is
tunesmith/recipes/score.py.
"""

from tunesmith.recipes.score import main

if __name__ == "__main__":
    main()
