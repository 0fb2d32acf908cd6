"""Errors in a person's words. One table maps every error code a node sends (and the three
ways reaching a node fails) to a sentence: what happened, to which machine, what Shoal does
about it and what the user can do. The node's own technical text (errno, route, log path,
rank) is kept apart as the detail, one click away (ErrorNote in app/error_note.py, the
widget views show it in). Qt-free."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import ShoalError


@dataclass(frozen=True)
class Explained:
    sentence: str  # what a person reads
    detail: str  # the technical text behind it, for a "Details" click ("" when none)
    code: str | None = None


@dataclass(frozen=True)
class Entry:
    """One row of the table. `what` may use {machine}, {model}, {how} and {message} (the
    node's own words, cleaned of internals; `fallback` replaces `what` when those are
    empty). `here_doing`/`here_todo` replace doing/todo when the machine is this one."""

    what: str
    doing: str = ""
    todo: str = ""
    fallback: str = ""
    here_doing: str = ""
    here_todo: str = ""


SAID = "{message}"
LOG_HINT = "Details has the model's log."
SENTENCES: dict[str, Entry] = {
    # --- a model that stops, a machine that goes ------------------------------------------
    "worker_failed": Entry(
        "{model} stopped on {machine}{how}.",
        "Shoal starts it again with the next message.",
        f"Send your message again. {LOG_HINT}"),
    "peer_lost": Entry(
        "{model} stopped: {machine}, which held part of it, left or stopped answering.",
        "Shoal tries to place it again on the machines that remain.",
        "Send your message again in a minute."),
    "group_failed": Entry(
        "{model} stopped: the machines running it together lost step with each other.",
        "Shoal tries to place it again on the machines that remain.",
        "Send your message again in a minute."),
    "generation_failed": Entry(
        "{model} failed while writing this answer on {machine}.",
        "The model stays loaded.",
        f"Send your message again. {LOG_HINT}"),
    "load_failed": Entry(
        "{model} couldn't be loaded on {machine}.", "",
        f"Check that the model is complete (Models), or choose another. {LOG_HINT}"),
    "handover_failed": Entry(
        "The machine that prefills long prompts for {model} couldn't hand this one over.",
        "Shorter prompts and ones this machine has seen are answered here as usual.",
        "Send the message again; if it keeps failing, launch the model without a prefill "
        "machine."),
    "peer_unreachable": Entry(
        "Shoal can't reach {machine}{how}.",
        "Shoal keeps trying and uses {machine} again as soon as it answers.",
        "Check that {machine} is on, on the network and running Shoal."),
    "shard_mismatch": Entry(
        "The copy of {model} on {machine} doesn't match the placement: {message}.",
        "Nothing was loaded.",
        "Download the model again on that machine, or choose another split.",
        fallback="The copy of {model} on {machine} doesn't match the placement."),
    # --- reaching a node at all -------------------------------------------------------------
    "connection_refused": Entry(
        "Can't reach the node on {machine}: it isn't running.",
        "Shoal keeps trying.",
        "Open Shoal on {machine}.",
        here_doing="Shoal starts its node again.",
        here_todo="Try again in a few seconds; if it keeps failing, Details has the reason."),
    "connection_reset": Entry(
        "The connection to the node on {machine} broke off before the answer was complete.",
        "Nothing was kept of the unfinished answer.",
        "Send your message again.",
        here_doing="Shoal checks its node and starts it again if it stopped."),
    "timeout": Entry(
        "The node on {machine} took too long to answer.",
        "Shoal gave up on this request; the machine may be busy or asleep.",
        "Try again; if it keeps happening, check {machine} and its network.",
        here_doing="Shoal checks its node and starts it again if it stopped."),
    # --- the request --------------------------------------------------------------------
    "invalid_request": Entry(SAID, todo="Change the request and send it again.",
                             fallback="The request wasn't one Shoal can answer."),
    "context_length_exceeded": Entry(
        SAID, todo="Start a new conversation, shorten the message, or load the model with "
        "a longer context.", fallback="The conversation is longer than the model can read."),
    "request_timeout": Entry(SAID, todo="Send it again.",
                             fallback="The request arrived too slowly and was dropped."),
    "payload_too_large": Entry(SAID, todo="Send a shorter request.",
                               fallback="The request is too large for the node to take."),
    "unsupported_media_type": Entry(SAID, todo="Send the request as JSON.",
                                    fallback="The request isn't JSON."),
    "invalid_api_key": Entry(
        "The API key was missing or wrong.", "",
        "Use the key shown in Settings → API (or set SHOAL_API_KEY)."),
    "images_unsupported": Entry(
        SAID, "Your message and its images are kept.",
        "Choose a model marked 'vision' in Models and press Regenerate, or start a new "
        "conversation without the images.",
        fallback="This model doesn't take images."),
    "cancelled": Entry(SAID, fallback="Stopped, as asked."),
    "not_found": Entry(SAID, fallback="That item doesn't exist on {machine}.",
                       todo="Check its name."),
    "copy_not_found": Entry(  # the node's own words name the model and the machine
        SAID, "The list of copies refreshes in a moment.",
        "Nothing to stop: the other copies keep serving.",
        fallback="That copy isn't running any more."),
    # --- models -------------------------------------------------------------------------
    "model_not_found": Entry(
        SAID, todo="Download it in Models, or choose a model that is on your machines.",
        fallback="That model isn't on {machine}."),
    "unsupported_model": Entry(
        SAID, todo="Choose another model or another version of it (Models).",
        fallback="Shoal can't run this model."),
    "corrupt_model": Entry(
        SAID, todo="Delete the model in Models and download it again.",
        fallback="The model's files on {machine} are damaged."),
    "insufficient_memory": Entry(
        SAID, todo="Choose a smaller model, a shorter context or more machines, or close "
        "other programs on {machine}.",
        fallback="There isn't enough memory on {machine} for {model}."),
    "busy": Entry(SAID, todo="Try again when it has finished.",
                  fallback="The node on {machine} is busy with another task."),
    "overloaded": Entry(
        SAID, todo="Try again shortly.",
        fallback="{model} on {machine} is answering as many requests as it can."),
    "kv_bits_refused": Entry(
        SAID, todo="Choose 16-bit KV cache in Settings, or another model.",
        fallback="This model's memory for the conversation can't be compressed."),
    "draft_refused": Entry(
        SAID, "The model runs without a draft.", "Choose another draft model, or none.",
        fallback="The draft model can't help this model."),
    "bad_dist_config": Entry(
        SAID, "Nothing was started.", "Launch the model again from Placement.",
        fallback="The plan for running {model} together was not valid."),
    # --- downloads ----------------------------------------------------------------------
    "gated_model": Entry(SAID, todo="Accept its conditions on Hugging Face and add your "
                         "token in Settings.", fallback="This model needs permission on "
                         "Hugging Face."),
    "hf_token_rejected": Entry(SAID, todo="Enter a new Hugging Face token in Settings.",
                               fallback="Hugging Face refused your token."),
    "hub_unreachable": Entry(
        "Shoal can't reach Hugging Face from {machine}.",
        "A download resumes where it stopped once it can.",
        "Check the internet connection, then try again."),
    "hub_offline": Entry(SAID, todo="Connect to the internet, or choose a model already "
                         "downloaded.", fallback="Shoal is offline and this model isn't "
                         "downloaded yet."),
    "unsafe_name": Entry(SAID, "Nothing was written.",
                         "Download the model from another source.",
                         fallback="A file name in this download is unsafe."),
    "insufficient_disk": Entry(SAID, todo="Free some disk space on {machine}, then try "
                               "again.", fallback="There isn't enough disk space on {machine}."),
    # --- who may talk to whom -----------------------------------------------------------
    "not_in_cluster": Entry(
        "Shoal on {machine} isn't part of this cluster: it holds another cluster secret.",
        "Shoal sends it nothing and takes nothing from it.",
        "Pair it in Settings → Cluster if it is one of your machines."),
    "wrong_node": Entry(
        "The node on {machine} answered under another identity than the one Shoal knows.",
        "Shoal ignores it until it proves itself again.",
        "Restart Shoal on {machine}; if this keeps happening, Details has the reason."),
    "forbidden": Entry(SAID, todo="Check Settings → API.",
                       fallback="The node refused this request."),
    "forbidden_host": Entry(SAID, todo="Check Settings → API.",
                            fallback="The node doesn't answer to that address."),
    "forbidden_from_browser": Entry(SAID, todo="Check Settings → API.",
                                    fallback="The node doesn't answer web pages."),
    "cors_forbidden": Entry(SAID, todo="Check Settings → API.",
                            fallback="The node doesn't answer this web page."),
    # --- anything else ------------------------------------------------------------------
    "unknown": Entry(SAID, todo="Details has the node's own words.",
                     fallback="Something went wrong on {machine}."),
    "file_error": Entry(
        "Shoal couldn't use {how} on {machine}.", "",
        "Check the free disk space and that the folder is yours, then try again."),
    "unexpected": Entry(
        "Something unexpected went wrong in Shoal on {machine}.", "",
        "Try again; if it happens again, Details has what to put in a bug report."),
}
TRANSPORT = ("connection_refused", "connection_reset", "timeout")

HERE = "this computer"
ELSEWHERE = "another machine"  # a node the app has no name for
GENERIC = (HERE, ELSEWHERE, "the model")
NODE_ID = re.compile(r"\b[0-9a-f]{12}\b")
# What the app's own client says when the node it talks to can't be reached.
CLIENT_WORDS = ("Can't reach the node at", "The node closed the stream",
                "Lost the node's event stream")


# The machines' names as the app last saw them (node id or "host:port" -> name), for
# message_of, whose ~24 callers have no names to pass; kept up to date by remember().
KNOWN: dict[str, str] = {}


def remember(names: Mapping[str, str]) -> None:
    """Names for the machines the app knows (e.g. from each topology snapshot), so every
    view's errors name machines rather than ids."""
    KNOWN.update(names)


def explain(error: BaseException | str | Mapping[str, Any],
            names: Mapping[str, str] | None = None) -> Explained:
    """The sentence a person reads for `error` (an exception, the node's error text, or
    its error body) and the technical detail behind it. `names` maps node ids (and
    "host:port" addresses) to machine names, so the sentence names the right machine;
    by default, the names the app has learnt (remember())."""
    names = KNOWN if names is None else names
    from_text = isinstance(error, str)
    error = _as_error(error)
    raw = _message(error)
    code = _code(error, raw)
    entry = SENTENCES[code] if code in SENTENCES else SENTENCES["unknown"]
    machine = _machine(error, raw, code, names)
    here = machine == HERE
    fill = {"machine": machine, "model": _model(raw), "how": _how(code, raw, error),
            "message": ""}
    said = SAID in entry.what
    if said:
        fill["message"] = _clean(raw, names, machine).rstrip(".")
    what = entry.what if fill["message"] or not said else entry.fallback
    parts = [what.format(**fill)]
    if machine not in GENERIC and machine not in parts[0]:
        parts.append(f"This happened on {machine}.")
    # The node's own "Shoal is …" sentence is truer than the table's: it knows the case.
    doing = _doing_said(raw, names) or (entry.here_doing if here and entry.here_doing
                                        else entry.doing).format(**fill)
    parts.append(doing)
    todo = (entry.here_todo if here and entry.here_todo else entry.todo).format(**fill)
    if not (said and _already_says_what_to_do(fill["message"])) \
            and not re.search(r"\b(retry|try again)\b", doing, re.I):
        parts.append(todo)
    names_kept = tuple(n for n in (machine, fill["model"]) if n not in GENERIC)
    return Explained(_join(parts, names_kept), _detail(error, raw, code, from_text), code)


# --- reading the error --------------------------------------------------------------------
def _as_error(error: BaseException | str | Mapping[str, Any]) -> BaseException:
    if isinstance(error, BaseException):
        return error
    if isinstance(error, Mapping):
        body = error if "error" in error else {"error": dict(error)}
        return ShoalError.from_openai(dict(body), int(error.get("status") or 500))
    return ShoalError(str(error))


def _message(error: BaseException) -> str:
    return error.message if isinstance(error, ShoalError) else str(error)


def _chain(error: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    e: BaseException | None = error
    while e is not None and e not in seen and len(seen) < 8:
        seen.append(e)
        e = e.__cause__ or e.__context__
    return seen


REFUSED = re.compile(r"connection refused|errno (111|61)\b|all connection attempts failed|"
                     r"cannot connect|connecterror", re.I)
TIMED_OUT = re.compile(r"timed? ?out|timeout", re.I)
RESET = re.compile(r"connection reset|errno (104|54|32)\b|broken pipe|server disconnected|"
                   r"closed the stream|peer closed|incomplete chunked|remoteprotocolerror",
                   re.I)


def _transport(error: BaseException, raw: str) -> str | None:
    """Which of the three ways reaching a node failed, if this is one of them."""
    for e in _chain(error):
        kind = type(e).__name__
        if isinstance(e, ConnectionRefusedError) or kind == "ConnectError":
            return "timeout" if TIMED_OUT.search(str(e)) else "connection_refused"
        if isinstance(e, TimeoutError) or kind.endswith("Timeout"):
            return "timeout"
        if isinstance(e, (ConnectionResetError, BrokenPipeError)) \
                or kind in ("RemoteProtocolError", "ReadError", "WriteError"):
            return "connection_reset"
    text = " ".join([raw] + [str(e) for e in _chain(error)[1:]])
    for code, pattern in (("connection_refused", REFUSED), ("connection_reset", RESET),
                          ("timeout", TIMED_OUT)):
        if pattern.search(text):
            return code
    return None


def _code(error: BaseException, raw: str) -> str:
    code = getattr(error, "code", None) if isinstance(error, ShoalError) else None
    if code in (None, "peer_unreachable") or not isinstance(error, ShoalError):
        found = _transport(error, raw)
        if found and (code is None or _from_client(error, raw)):
            return found
    if isinstance(error, OSError) and error.strerror:
        return "file_error"  # the app's own files: a full disk, a folder not the user's
    if not isinstance(error, ShoalError):
        return "unexpected"  # the app's own bug, not the node's word
    if code is None:
        for pattern, guess in TEXT_CODES:  # the node's status carries text, no code
            if re.search(pattern, raw):
                return guess
        return "unknown"
    return str(code)


TEXT_CODES = ((r"The worker for .+ (exited|produced nothing)|[Tt]he worker stalled",
               "worker_failed"),
              (r"lost rank \d+|of the model's group shut down", "peer_lost"),
              (r"\b(is|are) (truncated or )?(damaged|corrupt)\b", "corrupt_model"))
# Codes about another machine: with none named, the blame is not this computer's.
ABOUT_A_PEER = ("peer_unreachable", "peer_lost", "not_in_cluster", "wrong_node")


def _from_client(error: BaseException, raw: str) -> bool:
    """Did the app's own client fail to reach its node (rather than a node report that a
    peer didn't answer)?"""
    if not isinstance(error, ShoalError):
        return True
    return raw.startswith(CLIENT_WORDS) or len(_chain(error)) > 1


ADDRESS = re.compile(r"https?://([^/\s:]+)(?::(\d+))?|\b(\d{1,3}(?:\.\d{1,3}){3}):(\d+)")
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]", "0.0.0.0")


def _machine(error: BaseException, raw: str, code: str, names: Mapping[str, str]) -> str:
    """The machine to blame, by name: a lost peer, the node the error names, an id in
    the message, the address the app couldn't reach; else this computer."""
    lost = re.search(r"lost rank \d+ \(([^)]+)\)|rank \d+ \(([^)]+)\) of the model's group",
                     raw)
    if lost:
        where = lost.group(1) or lost.group(2)
        return names.get(where, ELSEWHERE)
    node = getattr(error, "node", None)
    if node:
        return names.get(node, ELSEWHERE)
    for m in NODE_ID.finditer(raw):
        return names.get(m.group(0), ELSEWHERE)
    if code in TRANSPORT and _from_client(error, raw):
        found = ADDRESS.search(raw)
        if found is None:
            return HERE
        host = found.group(1) or found.group(3)
        port = found.group(2) or found.group(4)
        if f"{host}:{port}" in names:
            return names[f"{host}:{port}"]
        return HERE if host in LOOPBACK else host
    if code.startswith("hub_"):  # the address in it is the Hub's, not a machine's
        return HERE
    found = ADDRESS.search(raw)
    if found:
        host = found.group(1) or found.group(3)
        port = found.group(2) or found.group(4)
        return names.get(f"{host}:{port}", ELSEWHERE if host in LOOPBACK else host)
    return ELSEWHERE if code in ABOUT_A_PEER else HERE


MODEL_PATTERNS = (r"The worker for (\S+) exited", r"Loading (\S+) took",
                  r"The distributed instance of (\S+)", r"^(\S+) is serving as many",
                  r"^(\S+) fits no placement", r"[Tt]he model '([^']+)'",
                  r"Couldn't load the model in \S*/([^/\s:]+)", r"placing (\S+) again")


def _model(raw: str) -> str:
    for pattern in MODEL_PATTERNS:
        m = re.search(pattern, raw)
        if m:
            return m.group(1).rstrip(".,;:")
    return "the model"


def _how(code: str, raw: str, error: BaseException | None = None) -> str:
    """A few words on how it failed, where the node's (or the system's) text says."""
    if code == "file_error":
        if not isinstance(error, OSError) or not error.strerror:
            return "a file"
        name = Path(str(error.filename)).name if error.filename else "a file"
        return f"{name} ({str(error.strerror).lower()})"
    if code == "worker_failed":
        if "was killed" in raw:
            return " (it was stopped by the system, most often for want of memory)"
        if "crashed" in raw:
            return " (it crashed)"
        if "took longer than" in raw or "did not load within" in raw:
            return " while loading (it took too long)"
        if "produced nothing" in raw or "stalled" in raw:
            return " (it stopped making progress)"
    if code == "peer_unreachable":
        if "could not prove" in raw or "isn't this cluster's" in raw:
            return ": it doesn't hold this cluster's secret"
        if "not as a Shoal node" in raw:
            return ": something other than Shoal answers at its address"
        if "can't read" in raw:
            return ": it runs another version of Shoal (update both)"
    return ""


# --- cleaning the node's words ------------------------------------------------------------
TECHNICAL = re.compile(r"\(shoal |`shoal |Errno|/shoal|/v1|SIG[A-Z]+|exit code|https?://|"
                       r"\.log\b|GET |POST ")
CLEANING = (
    (re.compile(r"[;,]?\s*(?:its log is|see) \S+(?: on [\w.-]+)?(?=[.;]|$)"), ""),
    (re.compile(r"\s*\[Errno \d+\][^.;)]*"), ""),
    (re.compile(r"\s*(?:at\s+)?https?://[\w.\-\[\]]+(?::\d+)?(?:/[^\s;,)]*)?"), ""),
    (re.compile(r"\s*\b(?:GET|POST|DELETE|PUT) /\S*"), ""),
    (re.compile(r"(?<![\w.])/(?:v1|shoal)/\S*"), ""),
    (re.compile(r" while serving requests? [0-9a-f, ]+(?: and \d+ more)?"), ""),
    (re.compile(r"^\s*node [0-9a-f]{12}: "), ""),
    (re.compile(r"^\s*[Rr]ank \d+ on node [0-9a-f]{12} failed: "), ""),
    (re.compile(r"^\s*[Rr]ank \d+: "), ""),
)


def _clean(text: str, names: Mapping[str, str], machine: str = HERE) -> str:
    """The node's message without internals: log paths, errno, addresses, routes, ranks,
    request ids; node ids become machine names, file paths their file name."""
    text = re.sub(r"\s*\([^()]*\)", lambda m: "" if TECHNICAL.search(m.group(0))
                  else m.group(0), text)
    for pattern, new in CLEANING:
        text = pattern.sub(new, text)
    text = re.sub(r"\b[Rr]ank \d+ \(([^)]+)\)", lambda m: names.get(m.group(1), ELSEWHERE),
                  text)
    text = re.sub(r"\b[Rr]ank \d+ on node ([0-9a-f]{12})",
                  lambda m: names.get(m.group(1), ELSEWHERE), text)
    text = re.sub(r"\b[Rr]ank \d+\b", "one machine of the group", text)
    text = re.sub(r"\bnode ([0-9a-f]{12})\b", lambda m: names.get(m.group(1), ELSEWHERE),
                  text)
    text = NODE_ID.sub(lambda m: names.get(m.group(0), ELSEWHERE), text)
    text = re.sub(r"(?<![\w.~])(?:/[\w.@+-]+){2,}/([\w.@+-]+)", r"\1", text)
    here = "that machine" if machine == ELSEWHERE else machine
    text = re.sub(r"\b[Tt]his node\b", here, text)  # the node that wrote it
    text = re.sub(r"\bnodes\b(?![\[.])", "machines", text)  # not a field: nodes[0].layers
    text = re.sub(r"\s+([.,;:])", r"\1", re.sub(r"\s{2,}", " ", text))
    return re.sub(r"[;:,]\s*(?=[.]|$)", "", text).strip()


def _doing_said(raw: str, names: Mapping[str, str]) -> str:
    """The node's own sentence on what Shoal is doing ("Shoal is placing it again …")."""
    m = re.search(r"Shoal is [^.]*(?:\([^)]*\))?[^.]*\.", raw)
    return _clean(m.group(0), names, HERE) if m else ""


def _already_says_what_to_do(message: str) -> bool:
    return bool(re.search(r"\b(try again|retry|download|delete|choose|unload|cancel|"
                          r"enter|accept|create|start|set|use|launch|update|close|free|"
                          r"shorten|send|wait|pair|check|add|open|remove)\b", message, re.I))


def _join(parts: list[str], keep: tuple[str, ...]) -> str:
    """The sentences in order, each once (the node's text may already say what the table
    adds)."""
    seen: list[str] = []
    out: list[str] = []
    for part in parts:
        for sentence in re.split(r"(?<=[.!?])\s+", part.strip()):
            key = re.sub(r"[^a-z0-9 ]", "", sentence.lower()).strip()
            if not key or any(key in s for s in seen):
                continue
            seen.append(key)
            first = sentence.split(" ", 1)[0]
            if re.fullmatch(r"[a-z][a-z']*[,:;]?", first) and not sentence.startswith(keep):
                # a plain word: names and field paths keep their case
                sentence = sentence[0].upper() + sentence[1:]
            out.append(sentence if sentence.endswith((".", "!", "?")) else sentence + ".")
    return " ".join(out)


def _detail(error: BaseException, raw: str, code: str, from_text: bool) -> str:
    if not isinstance(error, ShoalError):
        lines = [f"{type(error).__name__}: {raw}"]
    else:
        lines = [raw] if raw else []
    if isinstance(error, ShoalError) and not from_text:
        lines.append(f"code: {error.code or code}, HTTP {error.status}"
                     + (f", node {error.node}" if error.node else ""))
    for cause in _chain(error)[1:]:
        lines.append(f"{type(cause).__name__}: {cause}")
    return "\n".join(dict.fromkeys(line for line in lines if line))
