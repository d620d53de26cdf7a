"""Preference tuning (DPO, IPO, ORPO, SimPO, KTO) in the training stage.

    trainer.py    PreferenceTrainer: the HF Trainer through its public hooks (compute_loss, get_batch_samples, log)
    objective.py  per-batch terms -> the method's loss and metrics
    loss.py       the losses and metrics: pure functions of per-sequence log-probs, held equal to TRL 1.16's
    reference.py  reference log-probs from the starting model, batched by tokens, cached
    setup.py      what run.py asks of a preference run (collator, probe, reference, Trainer kwargs, run.json part)
    curves.py     the preference panels and verdicts (nothing learned, likelihood displacement)
"""
