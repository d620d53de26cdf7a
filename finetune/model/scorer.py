"""The scorer: a reward model turns (prompt, completion) into a number, exactly as it was trained to.

    scorer = RewardScorer.load("runs/rm")                 # a reward run's output_dir, or an HF folder
    scorer.score(prompts, completions)                    # -> [float, ...], batched, no gradient
    scorer.score_pairs(pairs)                             # -> [(chosen, rejected), ...] for tokenized pairs

One module, used by every place a reward model is read: `finetune eval` on a reward run (finetune/evaluation/
reward.py), a reward model as a GRPO reward (finetune/train/grpo/reward_models.py), and the training run itself,
whose eval split is scored by the same function (finetune/model/score_head.py: sequence_scores). What it reapplies is
what the run recorded (run.json's `reward.scoring`, written by `scoring_record` below):

    rendering   the pairs' renderer (finetune/data/preference/pairs.py): a conversation through the chat template
                saved with the model's tokenizer (its end of turn ends the sequence), plain text as the prompt with the
                tokenizer's special tokens, then the completion, then EOS: the sequence ends where training ended it,
                never on text decoded without special tokens (TRL PR #5813: the head then reads another token)
    truncation  at the run's sequence_len (or a GRPO entry's max_length): the prompt is cut from its start (its BOS
                kept), as training fitted pairs; a completion that alone is too long keeps its LAST tokens, where the
                score is read (TRL #4419: long completions otherwise exhaust the scorer's memory)
    pooling     the last token of each sequence, by position, never by pad id (pad = EOS: transformers' pooling skips
                the EOS the head was trained on; finetune/model/score_head.py)

A folder trained elsewhere (an HF sequence-classification model with one output, no run.json) is read the way TRL's
RewardTrainer trains: conversations through its chat template, plain text with EOS appended.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from finetune.errors import ModelError
from finetune.model.score_head import sequence_scores

DEFAULT_BATCH = 8  # sequences per forward pass


@dataclass(frozen=True)
class Scoring:
    """How a reward model reads (prompt, completion): what it trained with."""

    conversational: bool | None  # its pairs were conversations (True), plain text (False); None: not recorded
    max_length: int | None  # tokens a sequence may have (None: the model's max_position_embeddings)
    eos_appended: bool = True  # plain text: EOS after the completion (a conversation ends with the template's turn)

    def describe(self) -> str:
        kind = {True: "conversations through the chat template", False: "plain text, EOS appended",
                None: "as each prompt comes (conversations through the chat template, text with EOS)"}
        return f"{kind[self.conversational]}, at most {self.max_length or 'max_position_embeddings'} tokens, the " \
               "prompt cut from its start, scored at the last token"


def scoring_record(recipe, tokenizer, conversational: bool) -> dict:
    """What run.json records of how the reward run rendered, cut and pooled its pairs (read back by read_scoring)."""
    return {"conversational": conversational, "max_length": recipe.sequence_len, "eos_appended": not conversational,
            "chat_template": recipe.chat_template, "truncation": "the prompt cut from its start (its BOS kept)",
            "pooled": "the last token of each sequence (by position, not by pad id)",
            "pad_is_eos": tokenizer.pad_token_id == tokenizer.eos_token_id}


def read_scoring(folder: Path, run: dict | None = None) -> Scoring:
    """The Scoring a reward model's folder records (its run.json's `reward.scoring`), else TRL's defaults."""
    import json

    if run is None:
        try:
            run = json.loads((Path(folder) / "run.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            run = {}
    saved = ((run or {}).get("reward") or {}).get("scoring") or {}
    if not saved:
        return Scoring(None, None)
    return Scoring(saved.get("conversational"), saved.get("max_length"), bool(saved.get("eos_appended", True)))


class RewardScorer:
    """A reward model and how it reads (prompt, completion) (see the module's docstring)."""

    def __init__(self, model, tokenizer, scoring: Scoring, batch_size: int = DEFAULT_BATCH, label: str = "reward"):
        from finetune.data.preference.pairs import Renderer

        self.model, self.tokenizer, self.scoring = model, tokenizer, scoring
        self.batch_size, self.label = batch_size, label
        self.renderer = Renderer(tokenizer)
        self.max_length = scoring.max_length or getattr(model.config, "max_position_embeddings", None) or 4096
        self.cut = 0  # completions longer than max_length alone, kept from their end

    @classmethod
    def load(cls, source, device=None, dtype: str = "fp32", batch_size: int = DEFAULT_BATCH,
             max_length: int | None = None, label: str = "reward") -> RewardScorer:
        """The reward model in `source` (a reward run's output_dir, a checkpoint of one, or an HF folder), on
        `device`, in eval mode."""
        import dataclasses

        from finetune.reward_models import reward_model_problem

        why = reward_model_problem(source)
        if why:
            raise ModelError(f"`{source}` is not a reward model: {why}")
        model, tokenizer = load_reward_model(Path(source), dtype)
        scoring = read_scoring(Path(source))
        if max_length is not None:
            scoring = dataclasses.replace(scoring, max_length=max_length)
        if device is not None:
            model.to(device)
        return cls(model.eval(), tokenizer, scoring, batch_size, label)

    # --- (prompt, completion) -> ids -----------------------------------------------------------------------
    def encode(self, prompt, completion) -> list[int]:
        """The token ids the model reads for one (prompt, completion): rendered and cut as it trained."""
        from types import SimpleNamespace

        from finetune.data.preference.pairs import fit

        conversational = isinstance(prompt, list)
        if self.scoring.conversational and not conversational:  # a text prompt to a model trained on conversations
            prompt, conversational = [{"role": "user", "content": prompt}], True
        if self.scoring.conversational is False and conversational:
            raise ModelError(f"the reward model `{self.label}` was trained on plain-text pairs, and these prompts are "
                             "conversations: train it on conversational pairs (or give it text prompts)")
        if conversational:
            text = completion if isinstance(completion, str) else _assistant_text(completion)
            prompt_ids, (answer,) = self.renderer.chat(prompt, [[{"role": "assistant", "content": text}]])
        else:
            prompt_ids, (answer,) = self.renderer.plain(prompt, [completion if isinstance(completion, str)
                                                                 else _assistant_text(completion)])
            if not self.scoring.eos_appended:
                answer = answer[:-1]
        rules = SimpleNamespace(sequence_len=self.max_length, excess_length_strategy="truncate")
        header = self.renderer.header_tokens() if conversational else 0
        kept, _ = fit(prompt_ids, [answer], rules, header, self.tokenizer.bos_token_id)
        if kept is None:  # the completion alone leaves no room: keep its end, where the score is read
            self.cut += 1
            return answer[-self.max_length:]
        return kept + answer

    # --- ids -> scores --------------------------------------------------------------------------------------
    def score_ids(self, sequences: list[list[int]]) -> list[float]:
        """Each sequence's score, in batches of `batch_size` (longest first, so a batch pads little), no gradient."""
        import torch

        order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i]))
        out = [math.nan] * len(sequences)
        device = next(self.model.parameters()).device
        with torch.no_grad():
            for start in range(0, len(order), self.batch_size):
                chunk = order[start:start + self.batch_size]
                batch = padded_batch([sequences[i] for i in chunk], self.pad_id)
                scores = sequence_scores(self.model, {k: v.to(device) for k, v in batch.items()})
                for i, value in zip(chunk, scores.tolist()):
                    out[i] = value
        return out

    def score(self, prompts: list, completions: list) -> list[float]:
        """The score of each (prompt, completion): a prompt is text or a conversation (a list of messages), a completion
        text or [an assistant message] (GRPO's shapes)."""
        return self.score_ids([self.encode(p, c) for p, c in zip(prompts, completions)])

    def score_pairs(self, pairs) -> list[tuple[float, float]]:
        """(chosen, rejected) scores of tokenized pairs (finetune/data/preference/pairs.py's Pair)."""
        flat = [list(p.prompt_ids) + list(r) for p in pairs for r in (p.chosen_ids, p.rejected_ids)]
        scores = self.score_ids(flat)
        return list(zip(scores[0::2], scores[1::2]))

    @property
    def pad_id(self) -> int:
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id


def _assistant_text(messages) -> str:
    return "".join(m.get("content", "") for m in messages if isinstance(m, dict))


def padded_batch(sequences: list[list[int]], pad_id: int) -> dict:
    """Right-padded rows, one sequence each, with what sequence_scores reads (sequence_index: -1 on padding)."""
    import torch

    width = max(len(s) for s in sequences)
    return {"input_ids": torch.tensor([list(s) + [pad_id] * (width - len(s)) for s in sequences]),
            "attention_mask": torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sequences]),
            "sequence_index": torch.tensor([[n] * len(s) + [-1] * (width - len(s)) for n, s in enumerate(sequences)]),
            "sequence_lengths": torch.tensor([len(s) for s in sequences])}


def load_reward_model(folder: Path, dtype: str = "fp32"):
    """(model, tokenizer): a reward run's adapter on its base's sequence-classification class (the score head from
    the adapter), or the sequence-classification model in the folder; fp32 unless asked."""
    from finetune.model import reward_loader
    from finetune.model.trained import load_adapter_model, locate, saved_tokenizer, torch_dtype

    trained = locate(str(folder))
    tokenizer = saved_tokenizer(trained.folder)
    if trained.is_adapter:
        model, _ = load_adapter_model(trained, dtype, None, tokenizer, method="reward")
    else:
        try:
            model = reward_loader()(str(trained.folder), dtype=torch_dtype(dtype))
        except (OSError, ValueError) as exc:
            raise ModelError(f"cannot load the reward model at `{trained.folder}`: {exc}") from None
    if model.config.pad_token_id is None:  # transformers' forward refuses a batch without one (its pooling is unused)
        model.config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else \
            tokenizer.eos_token_id
    return model, tokenizer
