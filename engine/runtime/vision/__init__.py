"""Vision models: mlx-lm's language model with mlx-vlm's vision tower and projector in
front (what exo does). A request with images is rendered with its turns' parts as content
lists, each image expanded to the model's image tokens (images.py), and its prompt runs as
input embeddings with the image features at those tokens (tower.py): one at a time
through generate, or batched with text requests, its prefill from embeddings a chunk per
scheduler step (batched.py). Text requests are the text engine's, batching, prefix cache
and drafts included. The Qwen-VL families' 3-D image positions reach mlx-lm's attention
through an adapter in place of its rope modules (positions.py). In a batching group rank
0 holds the tower and its features enter the sharded language model (group.py), the
Qwen-VL families' positions reaching every rank in the plan; a lockstep group answers
images with a 400."""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from engine.runtime.engine import Emit
from engine.runtime.text_engine import TextEngine

log = logging.getLogger(__name__)


class VisionEngine(TextEngine):
    """A text engine that also takes images (`vision`: engine.runtime.vision.tower.Vision)."""

    capabilities: ClassVar[frozenset[str]] = frozenset({"generate", "vision"})

    def __init__(self, text: TextEngine, vision: Any):
        self.__dict__.update(text.__dict__)
        self.vision = vision  # TextEngine.generate hands it to each request


def load_engine(model_dir: str, args: Any, emit: Emit) -> TextEngine:
    """The text engine for the checkpoint's language model, with its vision tower and
    projector loaded beside it; where mlx-vlm can't load them, the text engine alone
    (the log says why; Ready's capabilities then don't list vision, and images get the
    text model's 400)."""
    from pathlib import Path

    from engine.errors import ShoalError
    from engine.runtime.text_engine import load_text_engine
    from engine.runtime.vision.tower import Vision

    text = load_text_engine(model_dir, args, emit)
    try:
        return VisionEngine(text, Vision(Path(model_dir), text.model))
    except ShoalError as e:
        log.warning("serving %s as text only: %s", model_dir, e.message)
        return text
