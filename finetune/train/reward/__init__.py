"""Reward models in the training stage: a one-output sequence-classification head trained on preference pairs
(Bradley-Terry), the fourth method beside SFT, the preference methods and GRPO.

    loss.py       the loss and the metrics: pure functions of the pairs' scores, held equal to TRL 1.16's RewardTrainer
    trainer.py    RewardTrainer: the HF Trainer through its public hooks (compute_loss, get_batch_samples, log)
    setup.py      what run.py asks of a reward run (probe, Trainer kwargs, what run.json records)
    curves.py     the reward panels and verdicts (accuracy not rising, margins exploding, scores drifting)

The scores themselves (which position of a sequence the head is read at) are the model stage's:
finetune/model/score_head.py; the scorer that reads a trained reward model is finetune/model/scorer.py.
"""
