"""Unpaired preference data for KTO: single replies, each judged desirable or undesirable.
read -> render through the chat template -> truncate, as preference.py does for pairs.

Row formats, detected per row (a file may mix them):
- LLaMA-Factory's KTO data: a conversation (`messages`, ShareGPT `conversations`, or Alpaca
  `instruction`/`output`) whose last message is the reply judged, and `label` true or false (the column
  its dataset_info.json maps to `kto_tag`; a column named `kto_tag` is read too);
- TRL's unpaired preference rows: `prompt` (a string, or a message list) and `completion` (a string,
  or assistant messages), and `label`;
- a preference pair in any format preference.py reads: its chosen reply as desirable, its rejected one
  as undesirable (two examples, kept together when --val_size or --data_split divide the rows).

Held-out evaluation reads preference pairs only (HELD_OUT_PAIRS): KTO's implicit reward of the chosen
reply above the rejected one's, counted as DPO counts it, on the same pairs."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from datasets import Dataset

from ..constants import LOSS_FLAG, TOOL, USER
from ..hparams import TrainDataArguments
from .dataset import DataKind, ItemEncoding, build_dataset
from .formats import Message, Row, check_role_order, conversation_from_row, offered_tools
from .mix import RowSelection
from .preference import (
    PREFERENCE_PAIRS,
    bound_replies,
    context_messages,
    encode_replies,
    is_pair_row,
    pair_from_row,
    reply_messages,
)

logger = logging.getLogger(__name__)

LABEL_KEYS = ("label", "kto_tag")  # TRL's and LLaMA-Factory's column, first found wins
COMPLETION = "completion"
DESIRABLE = "desirable"  # the column of the encoded examples (not `label`, which the Trainer reads as labels)


class ReplyWeights(Protocol):
    """KTO's weights of each kind of reply: --desirable_weight and --undesirable_weight (the preference feature's
    DPOArguments, which the core does not import)."""

    desirable_weight: float
    undesirable_weight: float


@dataclass(frozen=True)
class JudgedReplies:
    """The replies of one row to one context, each with whether it is desirable (two for a pair)."""

    row: Row
    context: list[Message]  # ends with a user turn (or a tool result)
    replies: list[tuple[list[Message], bool]]
    tools: list[dict] | None = None


def _label(row: Row) -> tuple[str, bool] | None:
    key = next((k for k in LABEL_KEYS if k in row.data), None)
    if key is None:
        return None
    value = row.data[key]
    if not isinstance(value, bool):
        raise row.error(f"expected true (a desirable reply) or false (an undesirable one), got {value!r:.40}", key)
    return key, value


def judged_from_row(row: Row) -> JudgedReplies:
    labelled = _label(row)
    if labelled is None:
        if is_pair_row(row):  # every pair format, Anthropic HH's and Dahoas' too
            pair = pair_from_row(row)
            return JudgedReplies(row, pair.context, [(pair.chosen, True), (pair.rejected, False)],
                                 offered_tools(row))
        raise row.error("missing: a KTO row marks its reply desirable or not with `label` true/false (TRL's "
                        "unpaired rows, LLaMA-Factory's kto_tag column), or is a preference pair (`chosen` and "
                        "`rejected`, one of each); add the label, or leave the row out", LABEL_KEYS[0])
    key, desirable = labelled
    if is_pair_row(row):
        raise row.error("a label beside `chosen`/`rejected`: give one reply (`completion`, or a conversation's last "
                        "message) with its label, or the pair without one", key)
    if COMPLETION in row.data:
        if "prompt" not in row.data:
            raise row.error("missing (TRL's unpaired rows give `prompt`, `completion` and `label`)", "prompt")
        context, field = context_messages(row)
        check_role_order(row, context, field, ends_with=(USER, TOOL))
        return JudgedReplies(row, context, [(reply_messages(row, COMPLETION), desirable)], offered_tools(row))
    # LLaMA-Factory's form: an SFT conversation, read as SFT reads it (which refuses a label), whose last
    # message is the reply judged.
    conversation = conversation_from_row(dataclasses.replace(row, data={k: v for k, v in row.data.items() if k != key}))
    *context, reply = conversation.messages
    if reply.get(LOSS_FLAG) is False:
        raise row.error('the last message is the reply the label judges, and cannot be kept out of the loss: drop '
                        'its `weight`/`loss_weight` 0 (or "loss": false)')
    return JudgedReplies(row, context, [([reply], desirable)], conversation.tools)


def encode_judged_record(tokenizer: Any, item: JudgedReplies, max_length: int | None) -> ItemEncoding | None:
    """One example per reply: `ids`, [`start`, `end`) of the reply's tokens (its end-of-turn marker
    included), `desirable` and `length`; the replies of a row share its context, cut the same way
    (preference.encode_replies). None when a reply does not fit."""
    context, replies = bound_replies(tokenizer, item.row, item.context, [reply for reply, _ in item.replies],
                                     max_length, item.tools)
    found = encode_replies(tokenizer, context, replies, max_length, item.tools)
    if found is None:
        return None
    encoded, truncated = found
    return ItemEncoding([{"ids": ids, "start": start, "end": end, DESIRABLE: desirable, "length": len(ids)}
                         for (ids, start, end), (_, desirable) in zip(encoded, item.replies)], truncated)


JUDGED_REPLIES = DataKind(
    name="kto",
    version="1",
    from_row=judged_from_row,
    settings=lambda data_args: {"max_length": data_args.max_seq_length},
    encode_one=encode_judged_record,
    dropped_because="a reply does not fit in max_seq_length",
    report_line="{name}: {rows} rows -> {kept} judged replies ({truncated} rows with their context truncated to "
                "max_seq_length, {dropped} dropped: {dropped_because})",
    nothing_kept="no reply fits in --max_seq_length {max_length}; raise it",
)


def _held_out_pair(row: Row) -> Any:
    key = next((k for k in LABEL_KEYS if k in row.data), None)
    if key is not None:
        raise row.error("an unpaired row in the evaluation data: KTO is evaluated on held-out preference pairs "
                        "(`chosen` and `rejected`), by how often the chosen reply gets the higher implicit reward; "
                        "give --eval_data_path a file of pairs", key)
    return pair_from_row(row)


# The same records, and cache, as PREFERENCE_PAIRS: only an unpaired row is refused with its own words.
HELD_OUT_PAIRS = dataclasses.replace(PREFERENCE_PAIRS, from_row=_held_out_pair)


def check_balance(dataset: Dataset, desirable_weight: float, undesirable_weight: float) -> None:
    """Log how many replies are desirable, and warn where the weights are outside the KTO paper's advice
    (section 4.2): desirable_weight x desirable / (undesirable_weight x undesirable) in [1, 4/3]."""
    labels = dataset[DESIRABLE]
    good = sum(labels)
    bad = len(labels) - good
    logger.info("train: %d desirable and %d undesirable replies", good, bad)
    if not (good and bad):
        logger.warning("train: every reply is %s: KTO still trains (against its KL estimate), but the paper's "
                       "setting has both kinds", "desirable" if good else "undesirable")
        return
    ratio = desirable_weight * good / (undesirable_weight * bad)
    if not 1.0 <= ratio <= 4 / 3:
        low, high = undesirable_weight * bad / good, 4 / 3 * undesirable_weight * bad / good
        logger.warning("train: desirable_weight x %d desirable / (undesirable_weight x %d undesirable) = %.2f, outside "
                       "the KTO paper's [1, 4/3]: try --desirable_weight in [%.2f, %.2f] (with --undesirable_weight "
                       "%s)", good, bad, ratio, low, high, undesirable_weight)


def build_kto_datasets(tokenizer: Any, data_args: TrainDataArguments, dpo_args: ReplyWeights, seed: int = 42,
                       report_dir: str | None = None) -> tuple[Dataset, Dataset | None]:
    """The judged replies of --data_path (chosen among its rows by --data_split, --data_weights and
    --max_samples, as for every kind), and the preference pairs of --eval_data_path, used whole."""
    train = build_dataset(JUDGED_REPLIES, tokenizer, data_args.data_path, data_args, "train", data_args.max_samples,
                          report_dir, RowSelection.of(data_args, seed))
    check_balance(train, dpo_args.desirable_weight, dpo_args.undesirable_weight)
    if not data_args.eval_data_path:
        return train, None
    return train, build_dataset(HELD_OUT_PAIRS, tokenizer, data_args.eval_data_path, data_args, "eval", None,
                                report_dir)
