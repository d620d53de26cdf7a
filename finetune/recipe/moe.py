"""The recipe's mixture-of-experts keys: whether the routers train, and the router's load-balancing loss."""

from __future__ import annotations

from pydantic import Field

from finetune.recipe.tags import TRAIN, Strict, affects


class MoeKeys(Strict):
    """Mixture-of-experts models (docs/moe.md); a dense model ignores these."""

    train_router: bool = Field(
        False,
        description="Train the routers (the layers that pick each token's experts). Off: they stay frozen, with "
                    "LoRA and in a full fine-tune, so tokens keep going to the experts they were trained with. On: "
                    "each router is trained in full (with an adapter: a full copy saved beside it).",
        json_schema_extra=affects(TRAIN),
    )

    router_aux_loss_coef: float | None = Field(
        None, ge=0,
        description="Weight of the router's load-balancing loss added to the training loss, computed as the model "
                    "defines it. Unset: the coefficient the model's config declares (`router_aux_loss_coef`; "
                    "deepseek_v3 declares none and balances without it). 0: off. Logged as `router_aux_loss`.",
        json_schema_extra=affects(TRAIN),
    )
