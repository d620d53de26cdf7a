"""What a GRPO run's curves say: reward rising / flat / no signal (groups tied) / truncated (completions hit the
limit) / collapsed (entropy near 0) / length hacking (the reward rising only with the length), each with the numbers
behind it; and the same look at the first generation, before the first step.

A GRPO loss says little (with one update per generation it starts at 0 every step: TRL #2703): the verdict reads
the logged reward and completion metrics instead (TRL's names, finetune/train/grpo/step.py).
"""

from __future__ import annotations

TRUNCATED_SHARE = 0.5  # at least half the completions cut at max_completion_length: the reward sees cut answers
TIED_SHARE = 0.9  # 9 groups in 10 tied: almost no step has a completion better than its siblings
COLLAPSED_ENTROPY = 0.05  # nats per token: sampling is near greedy, every completion the same
LENGTH_GROWTH = 1.5  # completions half as long again, and the reward tracking the length (correlation >= 0.9)
LENGTH_CORRELATION = 0.9


def is_grpo(log_history: list[dict]) -> bool:
    return any("reward" in e and "frac_reward_zero_std" in e for e in log_history)


def series(log_history: list[dict], key: str) -> list[tuple[int, float]]:
    return [(e["step"], float(e[key])) for e in log_history if key in e and "step" in e]


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def _thirds(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Means of the first and the last third of a series (at least one point each)."""
    third = max(1, len(points) // 3)
    return _mean(v for _, v in points[:third]), _mean(v for _, v in points[-third:])


def _correlation(a: list[float], b: list[float]) -> float:
    ma, mb = _mean(a), _mean(b)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    va, vb = sum((x - ma) ** 2 for x in a), sum((y - mb) ** 2 for y in b)
    return cov / (va * vb) ** 0.5 if va > 0 and vb > 0 else 0.0


def diagnose(log_history: list[dict]) -> dict:
    """{verdict, reason, reward_first, reward_last, ...}: the first matching verdict of no signal, collapsed,
    length hacking, reward rising (noting truncation), truncated, flat."""
    reward = series(log_history, "reward")
    if not reward:
        return {"verdict": "unknown", "reason": "no reward was logged (set logging_steps lower than the step count)"}
    first, last = _thirds(reward)
    clipped = _mean(v for _, v in series(log_history, "completions/clipped_ratio"))
    tied = _mean(v for _, v in series(log_history, "frac_reward_zero_std"))
    lengths = series(log_history, "completions/mean_length")
    entropy = series(log_history, "entropy")
    numbers = {"reward_first": round(first, 4), "reward_last": round(last, 4), "clipped_ratio": round(clipped, 4),
               "frac_reward_zero_std": round(tied, 4), "logged_steps": len(reward)}
    spread = _mean(v for _, v in series(log_history, "reward_std"))
    rising = last - first > max(0.02, 0.1 * spread if spread == spread else 0.0)
    verdict, reason = _verdict(rising, first, last, clipped, tied, lengths, entropy, reward)
    return {"verdict": verdict, "reason": reason, **numbers}


def _verdict(rising, first, last, clipped, tied, lengths, entropy, reward) -> tuple[str, str]:
    if tied >= TIED_SHARE:
        return "no signal", (f"{tied:.0%} of groups were tied (every completion of a prompt got the same reward), so "
                             "their advantages are 0 and nothing is learned from them; make the reward graded "
                             "(partial credit), raise num_generations or temperature, or use prompts the model "
                             "sometimes solves")
    late = _thirds(entropy)[1] if entropy else None  # per-step entropy swings: the last third's mean, as for reward
    if late is not None and late < COLLAPSED_ENTROPY:
        return "collapsed", (f"token entropy fell to {late:.3f} (last third's mean; from {entropy[0][1]:.3f}): the "
                             "policy samples almost one completion; lower learning_rate, raise rl_beta, or stop "
                             "earlier")
    cut = (f"{clipped:.0%} of completions were cut at max_completion_length: the rewards score unfinished answers; "
           "raise max_completion_length, or ask for shorter answers")
    if rising and len(lengths) >= 3:
        grew = lengths[-1][1] / max(lengths[0][1], 1e-9)
        together = _correlation([v for _, v in reward], [v for _, v in lengths[:len(reward)]])
        if grew >= LENGTH_GROWTH and together >= LENGTH_CORRELATION:
            return "length hacking", (f"the reward rose {first:.3f} -> {last:.3f} while completions grew {grew:.1f}x "
                                      f"(correlation {together:.2f}): check that the reward does not pay for length")
    if rising:
        but = f"; but {cut}" if clipped >= TRUNCATED_SHARE else ""
        return "reward rising", f"mean reward {first:.3f} -> {last:.3f} (first third -> last third of the logs){but}"
    if clipped >= TRUNCATED_SHARE:
        return "truncated", cut
    return "flat", (f"mean reward {first:.3f} -> {last:.3f}: no clear rise; raise learning_rate, train longer, or "
                    "check the reward on a few completions (finetune validate runs each reward)")


def first_generation(rewards_tied: float, truncated: float, group: int, limit: int) -> str | None:
    """A warning before the first step when the first generation already shows a run that cannot learn."""
    if truncated >= TRUNCATED_SHARE:
        return (f"first generation: {truncated:.0%} of completions hit max_completion_length {limit}: the rewards will "
                "mostly see cut answers; raise max_completion_length or ask for shorter answers")
    if rewards_tied >= 1.0:
        return (f"first generation: every group of {group} completions got one reward per group (all tied): no "
                "advantage, no learning, until some completions differ; make the reward graded or raise temperature")
    return None


def plot_panels(axes, log_history: list[dict]) -> None:
    """Reward (with its std), completion length and the tied / truncated shares against step."""
    reward, std = series(log_history, "reward"), dict(series(log_history, "reward_std"))
    if reward:
        steps, values = zip(*reward)
        axes[0].plot(steps, values, color="tab:green", label="reward (mean)")
        lo = [v - std.get(s, 0.0) for s, v in reward]
        hi = [v + std.get(s, 0.0) for s, v in reward]
        axes[0].fill_between(steps, lo, hi, color="tab:green", alpha=0.15, label="+- reward std")
    axes[0].set(xlabel="optimizer step", ylabel="reward", title="reward")
    for key, color in (("completions/mean_length", "tab:purple"),):
        points = series(log_history, key)
        if points:
            axes[1].plot(*zip(*points), color=color, label=key)
    axes[1].set(xlabel="optimizer step", ylabel="tokens", title="completion length")
    for key, color in (("frac_reward_zero_std", "tab:gray"), ("completions/clipped_ratio", "tab:red")):
        points = series(log_history, key)
        if points:
            axes[2].plot(*zip(*points), color=color, label=key)
    axes[2].set(xlabel="optimizer step", ylabel="share", title="tied groups, truncated completions", ylim=(-0.05, 1.05))
    for ax in axes[:3]:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
