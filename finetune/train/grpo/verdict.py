"""What a GRPO run's curves say: reward rising / flat / no signal (groups tied) / truncated (completions hit the
limit) / collapsed (entropy near 0) / length hacking (the reward rising only with the length), each with the numbers
behind it; and the same look at the first generation, before the first step. A run with tools is also watched for
episodes that stop calling them ("stopped calling tools") or that the iteration cap keeps cutting ("tool cap"): either
takes the verdict, the reward's kept as `reward_verdict`.

Before any of those, whether the rewards gave values at all, however short the run: "no reward" when no function
gave a single value in any logged step (every call failed or returned None: nothing was learned), "rewards failing"
when some did not (the run learned from the others only; the others' verdict is kept as `reward_verdict`). They
read each function's logged `rewards/NAME/missing`, and name the first failure of each from run.json's
`grpo.reward_failures` when given.

Fewer than SFT's minimum of points (curves.MIN_POINTS, passed in as `short`) give "too short" instead of a trend
(rising / flat / length hacking): a mean over a third of 2-3 points is one noisy step. The shares (no signal,
collapsed, truncated) are still said, as they read what was logged, not a trend.

A GRPO loss says little (with one update per generation it starts at 0 every step: TRL #2703): the verdict reads
the logged reward and completion metrics instead (TRL's names, finetune/train/grpo/step.py).
"""

from __future__ import annotations

TRUNCATED_SHARE = 0.5  # at least half the completions cut at max_completion_length: the reward sees cut answers
TIED_SHARE = 0.9  # 9 groups in 10 tied: almost no step has a completion better than its siblings
COLLAPSED_ENTROPY = 0.05  # nats per token: sampling is near greedy, every completion the same
LENGTH_GROWTH = 1.5  # completions half as long again, and the reward tracking the length (correlation >= 0.9)
LENGTH_CORRELATION = 0.9
# Agents: tool calls per episode falling to half of the first third's (from at least one call in ten episodes):
# the policy is learning to answer without its tools (verl #1569: nobody is told); nine episodes in ten cut by
# max_tool_calling_iterations: the episodes never finish, the reward scores cut transcripts.
CALLS_FALL = 0.5
CALLS_FLOOR = 0.1
CAPPED_SHARE = 0.9


def is_grpo(log_history: list[dict]) -> bool:
    # frac_reward_zero_std is logged even when no function gave a value (then `reward` is not)
    return any("frac_reward_zero_std" in e for e in log_history)


def missing_rewards(log_history: list[dict]) -> tuple[list[str], list[str]]:
    """(every reward function's name, those that gave no value in any logged step: missing share 1.0 throughout)."""
    names = list(dict.fromkeys(k[len("rewards/"):-len("/missing")] for e in log_history for k in e
                               if k.startswith("rewards/") and k.endswith("/missing")))
    never = [n for n in names if all(e[f"rewards/{n}/missing"] >= 1.0 for e in log_history
                                     if f"rewards/{n}/missing" in e)]
    return names, never


def _causes(names: list[str], reward_failures: dict | None) -> str:
    """`a` (exception: ValueError ... at FILE line N), `b` (returned None every time): why each gave no value."""
    parts = []
    for name in names:
        entry = (reward_failures or {}).get(name) or {}
        kinds = entry.get("failures") or {}
        if kinds:
            kind = max(kinds, key=kinds.get)
            message = (entry.get("first_messages") or {}).get(kind, "")
            message = message if len(message) <= 160 else message[:157] + "..."
            parts.append(f"`{name}` ({kind}: {message})" if message else f"`{name}` ({kind})")
        elif reward_failures is not None:
            parts.append(f"`{name}` (returned None for every completion)")
        else:
            parts.append(f"`{name}` (failed or returned None: run.json's grpo.reward_failures says which)")
    return "; ".join(parts)


def _no_value(log_history: list[dict], reward_failures: dict | None) -> dict | None:
    names, never = missing_rewards(log_history)
    if not never:
        return None
    steps = len({e["step"] for e in log_history if f"rewards/{never[0]}/missing" in e and "step" in e})
    fix = "fix them (`finetune validate` runs each reward on a few records)"
    if len(never) == len(names):
        return {"verdict": "no reward", "never_valued": never, "logged_steps": steps, "reason": (
            f"no reward function gave a single value in {steps} logged step(s): {_causes(never, reward_failures)}; "
            f"every advantage was 0, so nothing was learned: {fix}")}
    return {"verdict": "rewards failing", "never_valued": never, "reason": (
        f"{len(never)} of {len(names)} reward functions gave no value in any call: "
        f"{_causes(never, reward_failures)}; the run learned from the other {len(names) - len(never)} only: {fix}")}


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


def diagnose(log_history: list[dict], reward_failures: dict | None = None, short: tuple[int, str] = (0, "")) -> dict:
    """{verdict, reason, reward_first, reward_last, ...}: no reward / rewards failing (with the others' verdict as
    reward_verdict), else the first matching verdict of no signal, collapsed, length hacking, reward rising (noting
    truncation), truncated, flat. `reward_failures`: run.json's grpo.reward_failures, to name why a function gave
    no value. `short`: (the fewest logged rewards a trend is told from, the verdict below that): curves.py's, which
    imports this module."""
    failing = _no_value(log_history, reward_failures)
    if failing and failing["verdict"] == "no reward":
        return failing
    result = _learning(log_history, short)
    tools = _tool_use(log_history)
    if tools:
        result = {**result, **tools, "reward_verdict": result["verdict"],
                  "reason": f"{tools['reason']}. The reward: {result['verdict']}: {result['reason']}"}
    if failing:
        inner = f"{result['verdict']}: {result['reason']}"
        return {**result, **failing, "reward_verdict": result["verdict"],
                "reason": f"{failing['reason']}. Their reward: {inner}"}
    return result


def _tool_use(log_history: list[dict]) -> dict | None:
    """Episodes that stop calling tools, or that the iteration cap keeps cutting (a run with tools only)."""
    calls = series(log_history, "tools/call_frequency")
    if len(calls) < 3:
        return None
    first, last = _thirds(calls)
    capped = _thirds(series(log_history, "episodes/cut_by_cap"))[1]
    if capped >= CAPPED_SHARE:
        return {"verdict": "tool cap", "cut_by_cap": round(capped, 4), "reason": (
            f"{capped:.0%} of episodes (last third) were still calling tools when max_tool_calling_iterations ended "
            "them: the rewards score unfinished episodes; raise max_tool_calling_iterations, or check that the tools "
            "answer what the model asks (completions.jsonl shows each episode turn by turn)")}
    if first >= CALLS_FLOOR and last <= CALLS_FALL * first:
        return {"verdict": "stopped calling tools", "calls_first": round(first, 4), "calls_last": round(last, 4),
                "reason": (f"tool calls per episode fell {first:.2f} -> {last:.2f} (first third -> last third): the "
                           "policy is learning to answer without its tools; if the task needs them, reward their use "
                           "(or the answers only a tool can give), and check the tools' failures "
                           "(tools/failure_frequency, run.json's grpo.agents)")}
    return None


def _learning(log_history: list[dict], short: tuple[int, str]) -> dict:
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
    if verdict in ("reward rising", "flat", "length hacking"):
        verdict, reason = _too_short(reward, first, last, clipped, short) or (verdict, reason)
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


def _too_short(reward, first, last, clipped, short: tuple[int, str]) -> tuple[str, str] | None:
    needed, word = short
    if len(reward) >= needed:
        return None
    if clipped >= TRUNCATED_SHARE:  # a share, told however short the run
        return "truncated", (f"{clipped:.0%} of completions were cut at max_completion_length: the rewards score "
                             "unfinished answers; raise max_completion_length, or ask for shorter answers")
    return word, (f"too short to judge the reward's trend: {len(reward)} logged reward point(s), {needed} needed "
                  f"(mean reward {first:.3f} -> {last:.3f}, first third -> last third, says nothing over so few "
                  "steps); train more steps or lower logging_steps")


def first_generation(rewards_tied: float, truncated: float, group: int, limit: int) -> str | None:
    """A warning before the first step when the first generation already shows a run that cannot learn."""
    if truncated >= TRUNCATED_SHARE:
        return (f"first generation: {truncated:.0%} of completions hit max_completion_length {limit}: the rewards will "
                "mostly see cut answers; raise max_completion_length or ask for shorter answers")
    if rewards_tied >= 1.0:
        return (f"first generation: every group of {group} completions got one reward per group (all tied): no "
                "advantage, no learning, until some completions differ; make the reward graded or raise temperature")
    return None


PANEL_INCHES = (5.5, 3.6)  # width, height of one panel
TITLE_CHARS_PER_INCH = 13  # 9-point text: about this many characters fit in an inch of the title's width


def _panels(log_history: list[dict]) -> tuple[list[str], int, int]:
    """(the reward functions drawn one panel each: none when there is only one, whose panel is the total's; rows,
    columns): the total reward, each function, length, tied / truncated shares, the loss."""
    names = missing_rewards(log_history)[0]
    names = names if len(names) > 1 else []
    count = 4 + len(names)
    cols = 2 if count <= 4 else 3
    return names, -(-count // cols), cols


def figure_size(log_history: list[dict]) -> tuple[float, float]:
    _, rows, cols = _panels(log_history)
    return PANEL_INCHES[0] * cols, PANEL_INCHES[1] * rows + 0.6


def plot_figure(fig, log_history: list[dict], diagnosis: dict | None, plot_loss) -> None:
    """Every panel, on a figure of figure_size() with the constrained layout (the title is wrapped whole, never cut
    at the edge); `plot_loss(ax)` draws the surrogate loss."""
    import textwrap

    names, rows, cols = _panels(log_history)
    axes = list(fig.subplots(rows, cols, squeeze=False).flatten())
    _reward_panel(axes[0], log_history, "reward", "reward_std", "reward (weighted total)" if names else "reward")
    for ax, name in zip(axes[1:], names):
        _reward_panel(ax, log_history, f"rewards/{name}/mean", f"rewards/{name}/std", f"reward: {name}")
    rest = axes[1 + len(names):]
    for key, color in (("completions/mean_length", "tab:purple"),):
        points = series(log_history, key)
        if points:
            rest[0].plot(*zip(*points), color=color, label=key)
    rest[0].set(xlabel="optimizer step", ylabel="tokens", title="completion length")
    for key, color in (("frac_reward_zero_std", "tab:gray"), ("completions/clipped_ratio", "tab:red")):
        points = series(log_history, key)
        if points:
            rest[1].plot(*zip(*points), color=color, label=key)
    rest[1].set(xlabel="optimizer step", ylabel="share", title="tied groups, truncated completions",
                ylim=(-0.05, 1.05))
    plot_loss(rest[2])
    rest[2].set_title("surrogate loss (says little: the reward is the measure)")
    for ax in rest[3:]:
        ax.set_visible(False)
    for ax in axes[:1 + len(names)] + rest[:2]:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if diagnosis:
        width = int(fig.get_size_inches()[0] * TITLE_CHARS_PER_INCH)
        # break at spaces only: a hyphen in a path ("pytest-of-root") is the path's, not a place to break
        title = textwrap.fill(f"{diagnosis['verdict']}: {diagnosis.get('reason', '')}", width, break_on_hyphens=False)
        fig.suptitle(title, fontsize=9)


def _reward_panel(ax, log_history: list[dict], key: str, std_key: str, title: str) -> None:
    """A reward's mean with its std band; a word on the panel when it was never logged (no value in any step)."""
    points, std = series(log_history, key), dict(series(log_history, std_key))
    if points:
        steps, values = zip(*points)
        ax.plot(steps, values, color="tab:green", label="mean")
        ax.fill_between(steps, [v - std.get(s, 0.0) for s, v in points], [v + std.get(s, 0.0) for s, v in points],
                        color="tab:green", alpha=0.15, label="+- std")
    else:
        ax.text(0.5, 0.5, "no value in any step", ha="center", va="center", transform=ax.transAxes, color="tab:red")
    ax.set(xlabel="optimizer step", ylabel="reward", title=title)
