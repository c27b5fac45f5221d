"""One bound on what an episode's row holds, for env turns, tool results and --agent requests alike.

A row is an episode's turns as one token sequence: what the trainer trains on, what a KV-cache slot holds. It
holds at most `row_tokens`: the model's context (max_position_embeddings), or less under --max-prompt-tokens,
which bounds the first prompt and so the row at that plus the turns' room (EpisodeSettings.max_row_tokens: the
width the memory plan sizes a row at). One rule serves every turn: a turn runs only when its prompt plus the
completion's max_new_tokens fit the row.

- An --agent request past it is a 400 that names the limit (rollout/agent_runner.py).
- An env episode whose next prompt would pass it ends there, as `truncated`, with `context_overflow` in its last
  step's info (counted in rollout/context_overflows): the env's turn is refused, not trained past the context.
- A tool result (--tools) is cut to its share of the room the row has left, and marked so the model reads that it
  was (counted in rollout/tool_results_truncated); the row rule still holds after it.

Before anything is tokenized, an env turn's text and each tool result are cut at `feedback_chars`: no token holds
more than CHARS_PER_TOKEN characters, so a longer text cannot fit the row anyway, and a tool or env that returns
10 MB costs a cut, not the trainer's memory (the --tools helper cuts at MAX_RESULT_CHARS already: envs/tool_host.py).
"""

from nanorllm.envs.tool_host import MAX_RESULT_CHARS

CHARS_PER_TOKEN = 32  # more characters than any token holds in practice
MARK_TOKENS = 128  # kept free per cut result: its chat markup and the cut's note (bytes, for a byte tokenizer)


def row_tokens(policy, max_row_tokens: int | None = None) -> int | None:
    """The most tokens a row holds: `max_row_tokens` (EpisodeSettings) and never past the model's context; None when
    neither is known (an API model)."""
    config = getattr(getattr(policy, "model", None), "config", None)
    bounds = [n for n in (max_row_tokens, getattr(config, "max_position_embeddings", None)) if n]
    return min(bounds) if bounds else None


def feedback_chars(tokens: int | None) -> int:
    """The most characters an env turn or a tool result keeps before it is tokenized (see the module's doc)."""
    return MAX_RESULT_CHARS if tokens is None else min(CHARS_PER_TOKEN * tokens, MAX_RESULT_CHARS)


def cut_text(text: str, *, chars: int, tokens: int | None = None, tokenizer=None) -> str:
    """`text` cut at `chars` characters, then at `tokens` tokens where a tokenizer can count them, with a note of
    the cut; `text` itself when it fits. A text of no more UTF-8 bytes than `tokens` is never tokenized: byte-level
    and byte-fallback tokenizers give every token at least one byte."""
    kept = text[:chars]
    if tokens is not None and tokenizer is not None and len(kept.encode("utf-8")) > tokens:
        ids = tokenizer(kept, add_special_tokens=False)["input_ids"]
        if len(ids) > tokens:
            kept = tokenizer.decode(ids[:max(tokens, 0)])
    if kept == text:
        return text
    return f"{kept}\n[cut: {len(text) - len(kept)} more characters than the row holds]"


def cut_tool_results(info: dict, *, room: int | None, chars: int, tokenizer=None) -> dict:
    """`info` with each of its tool results (info["tool_results"]) cut to an equal share of `room` tokens (less
    MARK_TOKENS each) and at `chars`; info["tool_results_truncated"] counts the results cut."""
    results = info.get("tool_results")
    if not results:
        return info
    share = None if room is None else max(room // len(results) - MARK_TOKENS, 0)
    cut = [{**r, "content": cut_text(r["content"], chars=chars, tokens=share, tokenizer=tokenizer)} for r in results]
    return {**info, "tool_results": cut,
            "tool_results_truncated": sum(a["content"] != b["content"] for a, b in zip(results, cut))}
