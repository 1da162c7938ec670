"""TITO turn building: match re-sent history to a stored segment, render only what is new.

For each request the router (1) finds the segment whose stored messages the request's
history extends, comparing canonical messages (``messages.canonical``); (2) renders only
the new messages with the model's own chat template as the text difference
``render(prefix + new, add_generation_prompt=True) - render(prefix)``; (3) closes the
previous sampled assistant turn with the template's own closing text after the stop token
(ChatML: the ``\\n`` after ``<|im_end|>``; ``<|im_end|>\\n`` when generation hit the length
limit); and (4) appends the tokens of that text. Held tokens, sampled ones included, are
never re-tokenized, so a conversation whose full re-tokenisation would differ keeps its
sampled tokens exactly. Templates that re-render old turns when new ones arrive (Qwen3 strips
old reasoning) get the new messages rendered after a neutral stand-in conversation instead.

When the history diverges, the router forks at the longest prefix both still share that ends
on a token boundary: after the last shared sampled assistant turn, or later, after a shared
message whose rendering is an exact token prefix of the held tokens (the system prompt and
task before a dropped first reply). The fork is a new ``compact`` segment whose first span
points at the shared tokens; with nothing shared it is a fresh ``compact`` segment.
mini-swe-agent's dropped tool-less reply is that fork case. baidu-baige/LoongSage only appends or
starts a fresh segment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loongsage.agentflow.errors import RequestError
from loongsage.agentflow.messages import (
    ChatRequest, canonical, canonical_tools, parsed_arguments, template_messages,
)
from loongsage.agentflow.store import Segment, Trajectory
from loongsage.agentflow.tool_calls import ToolCall


BASE = [{"role": "user", "content": "."}, {"role": "assistant", "content": "."}]


class ChatRenderer:
    """The model's chat template and tokenizer, used only on messages not yet held."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eos_text = tokenizer.eos_token or ""

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
               generation: bool) -> str:
        if not messages:
            return ""
        try:
            return self.tokenizer.apply_chat_template(
                template_messages(messages), tools=tools or None, tokenize=False,
                add_generation_prompt=generation)
        except Exception as err:  # jinja raises for conversations the template refuses
            raise RequestError("messages: the model's chat template cannot render this "
                               f"conversation: {err}") from None

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def assistant_text(self, history: list[dict[str, Any]], message: dict[str, Any],
                       tools: list[dict[str, Any]], parser: Any = None) -> str:
        """The text a model writes for assistant ``message`` after ``history``, without its stop
        token: what the template puts between the generation prompt and the end of turn.

        Tool calls come in the template's own syntax when it writes them (Qwen's templates);
        a template without tool support (SmolLM2's) drops them, and then ``parser`` (the tool
        parser the router will read the model's text with) writes them after the content.
        """
        prompt = self.render(history, tools, True)
        full = self.render(history + [message], tools, False)
        if not full.startswith(prompt):
            raise RequestError("messages: the chat template renders the assistant turn "
                               "differently from its generation prompt; cannot recover its text")
        body = full[len(prompt):]
        at = body.rfind(self.eos_text) if self.eos_text else -1
        body = body[:at] if at >= 0 else body
        calls = [ToolCall.from_args(c["function"]["name"], parsed_arguments(c["function"]["arguments"]))
                 for c in message.get("tool_calls") or ()]
        if not calls:
            return body
        if parser is None:
            raise RequestError("messages: an assistant turn with tool calls needs the tool "
                               "parser that will read them (to check or write their text)")
        if _same_calls(parser.parse(body).tool_calls, calls):
            return body
        return f"{body}\n{parser.render(calls)}" if body else parser.render(calls)

    def turn_close(self, rendered_prefix: str, stop_text: str) -> str:
        """Text the template puts after a sampled turn that is not yet in the stored tokens."""
        marker = stop_text or self.eos_text
        at = rendered_prefix.rfind(marker) if marker else -1
        if at < 0:
            return ""
        return rendered_prefix[at + len(marker):] if stop_text else rendered_prefix[at:]

    def delta(self, prefix: list[dict[str, Any]], new: list[dict[str, Any]],
              tools: list[dict[str, Any]]) -> str | None:
        """Text of ``new`` (and the generation prompt) after ``prefix``; None if not a pure suffix.

        Templates that re-render held turns once new ones arrive (Qwen3 strips the reasoning of
        turns before the last user message) break ``render(prefix + new)`` being an extension
        of ``render(prefix)``; then the new messages are rendered after a neutral stand-in
        conversation (``BASE``) instead, which such templates leave alone.
        """
        if not prefix:
            return self.render(new, tools, True)
        prev = self.render(prefix, tools, False)
        full = self.render(prefix + new, tools, True)
        if not full.startswith(prev):
            base = self.render(BASE, tools, False)
            full, prev_len = self.render(BASE + new, tools, True), len(base)
            if not full.startswith(base):
                return None
        else:
            prev_len = len(prev)
        stop = prefix[-1].get("_stop")
        close = self.turn_close(prev, stop) if stop is not None else ""
        return close + full[prev_len:]


def _same_calls(got: list[ToolCall], want: list[ToolCall]) -> bool:
    return [(c.name, c.args_object()) for c in got] == [(c.name, c.args_object()) for c in want]


@dataclass
class TurnPlan:
    """What one request appends: its segment, and the prompt tokens to send to the engine."""

    segment: Segment
    prompt_ids: list[int]  # the whole segment's tokens up to and including the new prompt
    new_ids: list[int]  # the tokens this request added
    seg_len_before: int = 0  # segment length before this request's tokens
    messages_before: int = 0  # segment message count before this request's messages
    forked: bool = False
    max_new: int = 0  # new-token budget after clamping to the context


def _common_prefix(seg: Segment, canon: list[tuple]) -> int:
    k = 0
    for stored, asked in zip(seg.messages, canon):
        if canonical(stored) != asked:
            break
        k += 1
    return k


def _fork_point(seg: Segment, k: int) -> int:
    """The largest j <= k such that message j-1 is a sampled turn (an exact token boundary)."""
    for j in range(k, 0, -1):
        if seg.message_ends[j - 1] >= 0:
            return j
    return 0


def _aligned_prefix(traj: Trajectory, seg: Segment, k: int, renderer: ChatRenderer,
                    tools: list[dict[str, Any]]) -> int | None:
    """Token count of ``seg``'s first ``k`` messages when they end on a token boundary.

    A message that was not sampled has no recorded end, but its rendering (without the
    generation prompt) may still be an exact token prefix of what the segment holds: then a
    fork can share it (mini-swe-agent dropping a first reply keeps the whole task prompt).
    """
    ids = renderer.encode(renderer.render(seg.messages[:k], tools, False))
    held = traj.segment_tokens(seg)
    return len(ids) if ids and held[:len(ids)] == ids else None


def plan_turn(traj: Trajectory, request: ChatRequest, renderer: ChatRenderer, *,
              subagent: bool = False, trainable: bool = True,
              busy: set[int] | frozenset = frozenset(),
              max_context: int | None = None, max_new: int = 0, clamp: bool = False) -> TurnPlan:
    """Pick or open the segment for ``request``, render its new messages and append them.

    ``trainable=False`` requests (side calls such as OpenCode's title generation) only ever
    match and open untrainable segments, so they never become or disturb the mainline.
    ``clamp`` lowers ``max_new`` to the context left instead of refusing (``TurnPlan.max_new``).
    """
    msgs = request.messages
    if not msgs:
        raise RequestError("messages: at least one message is required")
    canon = [canonical(m) for m in msgs]
    tools_key = canonical_tools(request.tools)
    origin_wanted = "subagent" if subagent else None
    n_segments, active_before = len(traj.segments), traj.active_segment
    candidates = [s for s in reversed(traj.segments)
                  if (s.origin == "subagent") == subagent and s.tools_key == tools_key
                  and s.trainable == trainable and s.segment_id not in busy]
    if traj.active_segment is not None and not subagent:
        active = traj.segments[traj.active_segment]
        if active in candidates:
            candidates.remove(active)
            candidates.insert(0, active)

    best, best_k, full_match, shared_tokens = None, 0, False, None
    common: list[tuple[int, Segment]] = []
    for seg in candidates:
        k = _common_prefix(seg, canon)
        if k == len(seg.messages) and (k > 0 or len(seg) == 0):  # extends it, or it is empty
            best, best_k, full_match = seg, k, True
            break
        common.append((k, seg))
        j = _fork_point(seg, k)
        if j > best_k:
            best, best_k = seg, j
    if not full_match:  # a longer shared prefix that ends after a message the model did not write
        for k, seg in sorted(common, key=lambda c: -c[0]):
            if k <= best_k:
                break
            aligned = _aligned_prefix(traj, seg, k, renderer, request.tools)
            if aligned is not None:
                best, best_k, shared_tokens = seg, k, aligned
                break

    forked = False
    if full_match:
        seg = best
    elif best is not None:
        shared = traj.prefix_span_at(best, shared_tokens if shared_tokens is not None
                                     else best.message_ends[best_k - 1])
        seg = traj.new_segment(origin_wanted or "compact", parent=best.segment_id,
                               trainable=trainable)
        seg.spans = [list(s) for s in shared]
        seg.shared_len = len(seg)
        seg.messages = list(best.messages[:best_k])
        seg.message_ends = list(best.message_ends[:best_k])
        seg.tools_key = tools_key
        forked = True
    else:
        seg = _open_fresh(traj, trainable, subagent)
        seg.tools_key = tools_key
        best_k = 0

    new = msgs[best_k:]
    text = renderer.delta(seg.messages, new, request.tools)
    if text is None:  # the template re-renders held turns differently: start over
        seg = traj.new_segment(origin_wanted or "compact", parent=seg.segment_id,
                               trainable=trainable)
        seg.tools_key = tools_key
        new = msgs
        text = renderer.delta([], new, request.tools)
    new_ids = renderer.encode(text)
    max_new = _fit_context(traj, n_segments, active_before, len(seg) + len(new_ids), max_new,
                           max_context, clamp, "messages")
    seg_len_before, messages_before = len(seg), len(seg.messages)
    traj.append(seg, new_ids, sampled=False)
    seg.messages.extend(dict(m) for m in new)
    seg.message_ends.extend([-1] * len(new))
    return TurnPlan(segment=seg, prompt_ids=traj.segment_tokens(seg), new_ids=new_ids,
                    seg_len_before=seg_len_before, messages_before=messages_before, forked=forked,
                    max_new=max_new)


def _open_fresh(traj: Trajectory, trainable: bool, subagent: bool = False) -> Segment:
    """A segment that continues no held one: the root while the trajectory has no mainline, else
    a ``compact`` one under the active segment (a subagent's own when ``subagent``)."""
    mainline = [s for s in traj.segments if s.origin != "subagent" and s.trainable]
    origin = "subagent" if subagent else ("compact" if mainline or not trainable else "root")
    parent = traj.active_segment if (subagent or mainline) else None
    return traj.new_segment(origin, parent=parent, trainable=trainable)


def _fit_context(traj: Trajectory, n_segments: int, active_before: int | None, total: int,
                 max_new: int, max_context: int | None, clamp: bool, param: str) -> int:
    """``max_new`` lowered to the context left (``clamp``), or refuse the request, dropping the
    segments it opened (a refused request leaves no trace)."""
    if clamp and max_context is not None:
        max_new = min(max_new, max(max_context - total, 1))
    if max_context is not None and total + max_new > max_context:
        del traj.segments[n_segments:]
        traj.active_segment = active_before
        raise RequestError(
            f"{param}: the conversation needs {total} prompt tokens + {max_new} new tokens, "
            f"more than the model's context of {max_context} tokens",
            param=param, kind="context_length_exceeded")
    return max_new


def plan_tokens(traj: Trajectory, prompt_ids: list[int], *, trainable: bool = True,
                busy: set[int] | frozenset = frozenset(), max_context: int | None = None,
                max_new: int = 0, clamp: bool = False) -> TurnPlan:
    """The token-in twin of ``plan_turn``: the client rendered ``prompt_ids`` itself.

    The prompt extends the segment whose tokens it starts with (the newest such; an empty
    trajectory opens the root); otherwise a ``compact`` segment forks from the segment it shares
    the longest token prefix with (borrowing that prefix, as a message fork does), or starts
    fresh when it shares none. Held tokens are kept as they are; only the rest is appended.
    """
    n_segments, active_before = len(traj.segments), traj.active_segment
    candidates = [s for s in reversed(traj.segments)
                  if s.origin != "subagent" and s.trainable == trainable and s.segment_id not in busy]
    seg, shared = None, (None, 0)
    for cand in candidates:  # the longest segment the prompt extends; else the longest shared prefix
        held = traj.segment_tokens(cand)
        n = _shared_len(held, prompt_ids)
        if n == len(held) and (seg is None or n > len(seg)):
            seg = cand
        elif n < len(held) and n > shared[1]:
            shared = (cand, n)
    forked = seg is None and shared[0] is not None
    if forked:
        parent, n = shared
        seg = traj.new_segment("compact", parent=parent.segment_id, trainable=trainable)
        seg.spans = traj.prefix_span_at(parent, n)
        seg.shared_len = n
    elif seg is None:
        seg = _open_fresh(traj, trainable)
    new_ids = prompt_ids[len(seg):]
    max_new = _fit_context(traj, n_segments, active_before, len(prompt_ids), max_new,
                           max_context, clamp, "token_ids")
    seg_len_before, messages_before = len(seg), len(seg.messages)
    traj.append(seg, new_ids, sampled=False)
    return TurnPlan(segment=seg, prompt_ids=list(prompt_ids), new_ids=new_ids,
                    seg_len_before=seg_len_before, messages_before=messages_before, forked=forked,
                    max_new=max_new)


def _shared_len(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def record_generation(traj: Trajectory, seg: Segment, output_ids: list[int], logprobs: list[float],
                      versions: list[int], finish_reason: str, message: dict[str, Any],
                      stop_text: str, routes: Any = None) -> None:
    """Append sampled tokens and the assistant message they form to ``seg``; ``routes`` (MoE) are
    the request's routed experts, aligned with the segment's tokens (``Trajectory.record_routes``)."""
    traj.append(seg, output_ids, sampled=True, logprobs=logprobs, versions=versions)
    if routes is not None:
        traj.record_routes(seg, routes)
    seg.messages.append({**message, "_stop": stop_text})
    seg.message_ends.append(len(seg))
    seg.finish_reason = finish_reason
    seg.num_turns += 1
