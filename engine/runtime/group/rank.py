"""One rank of a model served by a group of workers (`worker --dist CONFIG.json`).

Every rank: doorbell ring up, MLX group up (both bounded by timeout_s), load its share,
wait until every rank has loaded, emit `ready`. Rank 0 then serves its node exactly like a
one-process worker; the others sleep on the doorbell and follow. A broken group takes every
rank down with a `fatal` event; shutdown (or stdin EOF) on any rank closes the whole group.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

from engine.errors import ShoalError
from engine.protocol import GenerateRequest
from engine.runtime.engine import Emit
from engine.runtime.text_engine import TextEngine

log = logging.getLogger(__name__)


def peak_rss_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def _follow_stdin(quit_group: Callable[[], None]) -> None:
    """Ranks other than 0 take no requests: shutdown or EOF on stdin closes the group."""
    for raw in sys.stdin.buffer:
        try:
            op = json.loads(raw).get("op")
        except (ValueError, AttributeError):
            op = None
        if op == "shutdown":
            break
        log.warning("rank > 0 ignores commands other than shutdown: %r", raw[:200])
    quit_group()


def load_rank(model_dir: str, args: Any, emit: Any) -> Any:
    """One rank of a group, as the worker's flags say (`args.dist`: its DistConfig file).
    Rank 0 returns its engine (a TextEngine over the group's generator) once every rank
    has loaded; the other ranks emit Ready and follow rank 0 until the group ends, which
    ends their process."""
    from functools import partial

    from engine.runtime.text_engine import load_drafting
    return _load_rank(model_dir, args.model_id, args.dist, emit, max(1, args.streams),
                      partial(load_drafting, args), (args.prefix_disk, args.prefix_disk_bytes),
                      args.memory_limit, args.handover_dir)


def _load_rank(model_path: str, model_id: str, config_path: Path, emit: Any,
               streams: int = 1, drafting: Callable[[Any, Any], Any] | None = None,
               disk: tuple[Path | None, int] = (None, 0),
               memory_limit: int | None = None, handover: Path | None = None) -> Any:
    """`drafting` makes rank 0's Drafting from the tokenizer and the model (loading the
    draft model, if the node has one): rank 0 drafts for the whole group. `disk`: the
    folder and size of this node's prefix cache on disk (engine/runtime/group/disk.py);
    `memory_limit`: the node's cap for admission, in bytes; `handover`: the folder where
    this rank's node writes another node's prefill for the group to take in."""
    import mlx.core as mx

    from engine.cluster.dist_config import DistConfig
    from engine.hub.checkpoint import model_context
    from engine.placement.families import batching_refusal
    from engine.runtime.group.distributed import Fatal, Watchdog, init_group
    from engine.runtime.group.doorbell import LOADED, Doorbell
    from engine.runtime.group.lockstep import Link

    t0 = time.perf_counter()
    try:
        cfg = DistConfig.from_file(config_path)
    except ShoalError as e:
        emit("fatal", code=e.code, message=e.message)
        return 1
    fatal = Fatal(emit, cfg, close=emit.close)

    def quit_group() -> None:
        bell.quit()
        os._exit(0)

    def on_quit(peer: int) -> None:
        if cfg.rank == 0:  # the group can't serve without that rank
            bell.quit()
            fatal("peer_lost", f"{cfg.where(peer)} of the model's group shut down; the "
                  "instance must be restarted.", peer=peer)
        quit_group()

    def on_expire(what: str, peer: int | None) -> None:
        fatal("peer_lost", f"Rank {cfg.rank}: nothing happened for {cfg.timeout_s:.0f} s while "
              f"{what}; the group is stuck or a peer is frozen.", peer=peer)

    from engine.runtime.load import read_config
    from engine.runtime.quant_kv import KV
    try:  # before the group forms, so every rank refuses alike (none sees a peer go)
        kv = KV.for_config(read_config(Path(model_path)), cfg.kv_bits)
    except ValueError as e:
        fatal("kv_bits_refused", f"Couldn't quantize the KV cache of {model_id}: {e}")
    except ShoalError:  # an unreadable config.json: loading says what is wrong with it
        kv = KV()
    bell = Doorbell(cfg, on_lost=fatal.peer_lost, on_quit=on_quit)
    watchdog = Watchdog(cfg.timeout_s, on_expire)
    try:
        bell.open()
        tmp = Path(tempfile.mkdtemp(prefix="shoal-rank-"))
        try:  # MLX reads its files during init only
            group = init_group(cfg, watchdog, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if cfg.rank != 0:
            threading.Thread(target=_follow_stdin, args=(quit_group,), daemon=True).start()
        model, tokenizer, config, info = _load(Path(model_path), cfg, group, emit)
        why = batching_refusal(str(config.get("model_type")))
        if why and streams > 1 and cfg.rank == 0:
            log.warning("%s", why)
            streams = 1
        if cfg.strategy == "pipeline":  # every rank's KV alike: 16 bits, or 8 or 4
            model.quantize_kv(kv)
        vision: Any = None  # rank 0's vision tower, where it serves images
        lm = model.model if cfg.strategy == "pipeline" else model
        held = model.end if cfg.strategy == "pipeline" else None  # rank 0's first layers
        if cfg.rank == 0 and streams > 1 and _takes_images(Path(model_path)):
            from engine.runtime.vision.group import group_positions, load_group_vision
            group_positions(Path(model_path), lm)  # (Qwen-VL) before the tower: its check
            vision = load_group_vision(Path(model_path), lm, held)
        drafts = None
        if cfg.rank == 0 and streams > 1 and drafting is not None:
            try:  # before the others wait on rank 0 (asleep, on the doorbell)
                drafts = drafting(tokenizer, model)
            except Exception as e:  # a draft model that can't load or can't serve this one
                log.exception("the draft model can't be used")
                fatal("draft_refused", f"Couldn't use the draft model: {e}")
        # Ranks load at their own pace: wait on the doorbell (asleep), not in MLX.
        if cfg.rank == 0:
            bell.ring(LOADED)
        if bell.wait() != LOADED:
            raise RuntimeError("the group is out of step while loading")
        if cfg.rank != 0:
            bell.ring(LOADED)
        # rank 0 also tells every rank how many requests it serves at once
        with watchdog.watch("checking the group", cfg.successor):
            mine = [1, streams if cfg.rank == 0 else 0]
            summed: Any = mx.distributed.all_sum(mx.array(mine), group=group).tolist()
            total, streams = int(summed[0]), int(summed[1])
        if total != cfg.world:
            raise RuntimeError(f"the group check summed to {total}, not {cfg.world}")
        prefix = _prefix(cfg, Path(model_path), disk, group, watchdog)
        admission = _admission(cfg, config, prefix, memory_limit, group, watchdog)
    except ShoalError as e:
        fatal(e.code or "group_failed", e.message)
    except Exception as e:  # anything mlx-lm or MLX raises on a model or group it can't use
        log.exception("starting rank %d failed", cfg.rank)
        fatal("load_failed", f"Rank {cfg.rank} couldn't load {model_path}: {e}")

    ctx = min(model_context(config), cfg.context_limit or 1 << 62)
    from engine.protocol import RankReady, Ready
    rank = RankReady(cfg.rank, cfg.world, cfg.strategy, list(info.layers), list(info.files),
                     info.bytes_read, peak_rss_bytes(), cfg.lanes if streams > 1 else 1)
    link = Link(cfg, group, bell, watchdog, on_broken=fatal.peer_lost)
    if cfg.rank != 0:  # a follower's Ready, then it follows until quit or fatal ends it
        emit(Ready(model_id, ctx, os.getpid(), round(time.perf_counter() - t0, 3), streams,
                   rank))
    if streams > 1:  # requests decode together (engine/runtime/group/batch.py)
        from engine.runtime.group.batch import GroupBatcher, serve_follower
        steps = _steps(cfg.strategy, model, link, kv)
        adopter = _adopter(cfg, steps, Path(model_path), handover)
        exporter = _exporter(cfg, steps, Path(model_path), handover)
        if _takes_images(Path(model_path)):  # Qwen-VL: 3-D positions on every rank
            from engine.runtime.vision.group import group_positions
            steps.placing = group_positions(Path(model_path), lm)
        if cfg.rank != 0:
            serve_follower(steps, link, prefix, adopter, exporter)  # quit or fatal end it
        gen: Callable[..., Iterator[Any]] = GroupBatcher(
            steps, tokenizer, prefix, streams,
            on_fatal=lambda why: fatal("group_failed", why), drafting=drafts,
            admission=admission, adopter=adopter, exporter=exporter)
    else:
        if cfg.rank != 0:
            _follower(cfg.strategy, model, link, prefix, kv).serve()  # quit or fatal end it
        gen = _lockstep(_leader(cfg.strategy, model, link, prefix, kv), fatal, admission)

    def on_request(rid: str, active: bool) -> None:
        (fatal.inflight.add if active else fatal.inflight.discard)(rid)

    leader = GroupLeader(model, tokenizer, ctx, gen, streams, on_request, rank, bell)
    if vision is not None:
        return VisionGroupLeader(leader, vision)
    if _takes_images(Path(model_path)):
        from engine.runtime.vision.group import LOCKSTEP, group_refusal
        leader.no_images = group_refusal(lm, held) or (
            LOCKSTEP if streams == 1 else None)
    return leader


def _takes_images(folder: Path) -> bool:
    from engine.runtime.vision.group import is_vision_checkpoint
    return is_vision_checkpoint(folder)


class GroupLeader(TextEngine):
    """Rank 0's engine: a text engine whose generator drives the group; closing it ends
    the whole group (and this process)."""

    def __init__(self, model: Any, tokenizer: Any, ctx: int, gen: Any, streams: int,
                 on_request: Callable[[str, bool], None], rank: Any, bell: Any):
        super().__init__(model, tokenizer, ctx, gen, streams, on_request)
        self.rank, self.bell = rank, bell
        self.no_images: str | None = None  # a vision model's 400 where the group can't

    def generate(self, rid: str, request: GenerateRequest, cancel: threading.Event,
                 emit: Emit) -> None:
        if self.no_images is not None:
            from engine.runtime.vision.group import refuse_images_in_group
            refuse_images_in_group(request, self.no_images)
        super().generate(rid, request, cancel, emit)

    def prefill_kv(self, cmd: Any, cancel: threading.Event, emit: Emit) -> None:
        """The prompt's KV for another node, every rank writing its layers' frames to its
        node's hand-over folder as the chunks pass (engine/runtime/group/export.py);
        answered once rank 0's part is written."""
        import time

        from engine.errors import BadRequest
        from engine.protocol import KVWritten, Progress
        from engine.runtime.group.export import refusal

        gen: Any = self.gen
        export = getattr(gen, "export", None)
        if export is None or getattr(self.rank, "strategy", None) != "pipeline" \
                or gen.state.exporter is None:
            raise BadRequest("Only a pipeline group serving several streams prefills for "
                             "another node: launch this one as such, or name a node that "
                             "holds the whole model.")
        why = refusal(gen.steps.make_cache())
        if why:
            raise BadRequest(why + " Launch the model without a prefill node.")
        self._valid_ids(cmd.tokens)
        n, t0 = len(cmd.tokens), time.perf_counter()
        export(cmd.tokens, cmd.job, cancel,
               lambda done: emit(Progress(cmd.id, 0, min(done, n), n)))
        from pathlib import Path
        emit(KVWritten(cmd.id, Path(cmd.path).stat().st_size,
                       round(time.perf_counter() - t0, 4)))

    def adopt_kv(self, cmd: Any, cancel: threading.Event, emit: Emit) -> None:
        """Another node's prefill, which this node and every member node have written
        whole to their hand-over folders (engine/node/handover.py), taken in by every rank
        at the next plan (engine/runtime/group/adopt.py)."""
        from engine.errors import BadRequest
        from engine.protocol import KVAdopted

        adopt = getattr(self.gen, "adopt", None)
        if adopt is None:
            raise BadRequest("This group runs one request at a time, which can't take "
                             "another node's prefill: launch it with more streams.")
        self._valid_ids(cmd.tokens)
        why = adopt(cmd.tokens, cmd.job)
        if why is not None:
            raise BadRequest(f"The group couldn't take the handed-over KV in: {why}")
        emit(KVAdopted(cmd.id, len(cmd.tokens)))

    def close(self, grace_s: float = 5.0) -> None:
        super().close(grace_s)  # the batcher's last round (its drop plan, its END) ends first
        self.bell.quit()  # QUIT travels round the ring; every rank leaves with exit code 0
        self.bell.closed.wait(5)
        # Leave now: the stdin reader may still be blocked, and MLX's group teardown after
        # the peers are gone is not worth waiting for.
        logging.shutdown()
        os._exit(0)


class VisionGroupLeader(GroupLeader):
    """Rank 0's engine for a vision model served by a batching group: image requests are
    prepared with the tower (engine/runtime/vision/group.py), their prompts' embeddings
    going to the batch with them."""

    capabilities: ClassVar[frozenset[str]] = frozenset({"generate", "vision"})

    def __init__(self, leader: GroupLeader, vision: Any):
        self.__dict__.update(leader.__dict__)
        self.vision = vision  # TextEngine.generate hands it to each request


def _prefix(cfg: Any, model: Path, disk: tuple[Path | None, int], group: Any,
            watchdog: Any) -> Any:
    """This rank's prefix cache, filled from its disk with what every rank holds there."""
    import mlx.core as mx

    from engine.runtime.group.disk import open_disk, restore
    from engine.runtime.prefix import PrefixCache

    tier = open_disk(disk[0], disk[1], model, cfg)
    prefix = PrefixCache(cfg.prefix_cache_tokens, leader=cfg.rank == 0, disk=tier,
                         disk_lookups=False)

    def all_sum(x: Any) -> Any:
        with watchdog.watch("reading the prefix cache from disk", cfg.successor):
            out = mx.distributed.all_sum(x, group=group)
            mx.eval(out)
        return out

    # Every rank takes part, with a disk or without (then it holds no entry, and so
    # none is restored); each stops loading at half the watchdog's bound.
    restore(prefix, tier, all_sum, cfg.rank, cfg.world, cfg.timeout_s / 2)
    return prefix


def _admission(cfg: Any, config: dict[str, Any], prefix: Any, limit: int | None,
               group: Any, watchdog: Any) -> Any:
    """Every rank says how many tokens of KV it has room for; rank 0 gets the group's
    admission from them (engine/runtime/admission.py; None on the other ranks)."""
    import mlx.core as mx

    from engine.runtime.admission import GroupAdmission, kv_bytes_per_token, tokens_of_room

    if cfg.strategy == "pipeline":
        start, end = cfg.layers[cfg.rank]
        share = (end - start) / cfg.layers[-1][1]
    else:
        share = 1 / cfg.world  # each rank holds its heads' share
    mine = tokens_of_room(kv_bytes_per_token(config, cfg.kv_bits), share,
                          max(0, prefix.budget_tokens - prefix.tokens()), limit)
    slots = [0] * cfg.world
    slots[cfg.rank] = mine
    with watchdog.watch("sizing the group's memory", cfg.successor):
        summed = mx.distributed.all_sum(mx.array(slots, mx.int32), group=group)
        mx.eval(summed)
    rooms: list[int] = summed.tolist()  # type: ignore[assignment]
    return GroupAdmission(rooms, cfg.where) \
        if cfg.rank == 0 else None


def _load(folder: Path, cfg: Any, group: Any, emit: Any) -> tuple[Any, Any, dict, Any]:
    """(model or stage, tokenizer on rank 0, config, ShardInfo)."""
    from engine.cluster.dist_config import check_layer_ranges
    from engine.runtime.load import load_tokenizer, read_config
    from engine.runtime.shard_load import load_pipeline_stage, load_tensor_shard

    def progress(done: int, total: int) -> None:
        emit("loading", done=done, total=total, rank=cfg.rank)

    if cfg.strategy == "pipeline":
        config = read_config(folder)
        total = config.get("num_hidden_layers") or \
            (config.get("text_config") or {}).get("num_hidden_layers")
        if total:  # a split that doesn't match the model fails before anything is read
            check_layer_ranges(cfg.layers, cfg.world, int(total))
        start, end = cfg.layers[cfg.rank]
        model, config, info = load_pipeline_stage(folder, start, end, progress)
        if model.first:
            model.hidden, model.dtype = model.probe()
    else:
        model, config, info = load_tensor_shard(folder, group, progress)
    tokenizer = None
    if cfg.rank == 0:
        tokenizer = load_tokenizer(folder, read_config(folder))
    return model, tokenizer, config, info


def _lockstep(runner: Any, fatal: Any, admission: Any) -> Callable[..., Iterator[Any]]:
    """One request at a time through the group (engine/runtime/group/lockstep.py); each must
    fit alone (a 503 where it can't)."""
    def generate(_model: Any, tok: Any, prompt: list[int], sampling: Any,
                 cancel: threading.Event | None, progress: Any = None) -> Iterator[Any]:
        from engine.runtime.group.lockstep import generate as lockstep_generate
        if admission is not None:
            admission.check(admission.need(len(prompt), 0, sampling.max_tokens), 0, 0)
        try:  # a lockstep prefill runs whole once begun: progress at its start and end
            yield from lockstep_generate(runner, tok, prompt, sampling, cancel, progress)
        except Exception as e:  # the group's state is unknown now: take it down
            log.exception("generation failed on rank 0")
            fatal("group_failed", f"Generation failed in the model's group: {e}")
    return generate


# A pipeline's Stage makes its caches (quantized by Stage.quantize_kv); tensor ranks get `kv`.
def _adopter(cfg: Any, steps: Any, model_path: Path, folder: Path | None) -> Any:
    """This rank's reader of another node's prefill (engine/runtime/group/adopt.py), or
    None where its node passes none on."""
    from engine.runtime.disk_cache import fingerprint
    from engine.runtime.group.adopt import Adopter, pipeline_pick, tensor_pick

    if folder is None:
        return None
    made_by = fingerprint(model_path, cfg.kv_bits)
    if cfg.strategy == "pipeline":
        held = (steps.stage.start, steps.stage.end)
        return Adopter(folder, made_by, steps.make_cache, pipeline_pick(*held), held)
    return Adopter(folder, made_by, steps.make_cache, tensor_pick(cfg.rank, cfg.world))


def _exporter(cfg: Any, steps: Any, model_path: Path, folder: Path | None) -> Any:
    """This rank's writer of a prompt's KV for another node (engine/runtime/group/
    export.py): a pipeline rank's, where its node takes them; None otherwise."""
    from engine.runtime.disk_cache import fingerprint
    from engine.runtime.group.export import Exporter, export_name

    if folder is None or cfg.strategy != "pipeline":
        return None
    made_by = fingerprint(model_path, cfg.kv_bits)
    held = (steps.stage.start, steps.stage.end)

    def export(job: int, tokens: list[int], cache: list[Any]) -> Exporter:
        return Exporter(folder / export_name(job), held, cfg.rank == 0, made_by, tokens,
                        cache)
    return export


def _steps(strategy: str, model: Any, link: Any, kv: Any) -> Any:
    from engine.runtime.group.batch import PipelineSteps, TensorSteps
    return PipelineSteps(model, link) if strategy == "pipeline" else \
        TensorSteps(model, link, kv)


def _leader(strategy: str, model: Any, link: Any, prefix: Any, kv: Any) -> Any:
    if strategy == "pipeline":
        from engine.runtime.group.pipeline import PipelineLeader
        return PipelineLeader(model, link, model.hidden, model.dtype, prefix)
    from engine.runtime.group.tensor import TensorLeader
    return TensorLeader(model, link, prefix, kv)


def _follower(strategy: str, model: Any, link: Any, prefix: Any, kv: Any) -> Any:
    if strategy == "pipeline":
        from engine.runtime.group.pipeline import PipelineFollower
        return PipelineFollower(model, link, prefix)
    from engine.runtime.group.tensor import TensorFollower
    return TensorFollower(model, link, prefix, kv)
