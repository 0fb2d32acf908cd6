"""The vision side of a vision checkpoint: mlx-vlm's vision tower and projector (its own
model code, sanitize and quantization), beside mlx-lm's language model, whose token
embeddings the image features are merged into by mlx-vlm's own get_input_embeddings."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from engine.errors import BadRequest, UnsupportedModel
from engine.protocol import GenerateRequest, ImageInput
from engine.runtime.vision.images import ImagePrompt, decode, key_ids
from engine.runtime.vision.positions import Placed, deepstack_rows, install

log = logging.getLogger(__name__)

# tokens that belong to an image's span besides the image token (Pixtral's row breaks)
SPAN_TOKENS = ("[IMG_BREAK]",)


class _Tokens:
    """Stands in for mlx-vlm's language model where get_input_embeddings reads the token
    embeddings: mlx-lm's (the one loaded model's)."""

    def __init__(self, embed_tokens: Any, lang: Any = None, config: Any = None):
        self.model = self
        self.embed_tokens = embed_tokens
        self.config = config  # what mlx-vlm's get_rope_index reads (Qwen-VL)
        self._rope_index = getattr(type(lang), "get_rope_index", None)

    def get_rope_index(self, *args: Any, **kw: Any) -> Any:
        """mlx-vlm's own, for the families that place tokens in 3-D."""
        if self._rope_index is None:
            raise AttributeError("get_rope_index")
        return self._rope_index(self, *args, **kw)


def embed_tokens(lm: Any) -> Any:
    inner = getattr(lm, "language_model", lm)
    return inner.model.embed_tokens


class Vision:
    """Loaded beside the language model `lm` (mlx-lm's): the tower and projector weights
    only are read; mlx-vlm's copy of the language model is never materialised."""

    def __init__(self, folder: Path, lm: Any):
        import mlx.core as mx
        from mlx_vlm.utils import load_image_processor, load_model, load_processor

        try:
            vlm = load_model(Path(folder), lazy=True)
            processor = load_processor(folder, add_detokenizer=False)
            image_processor = load_image_processor(folder)
        except Exception as e:  # anything mlx-vlm or transformers raise on these files
            raise UnsupportedModel(f"mlx-vlm can't load this model's vision tower: "
                                   f"{str(e)[:200]}") from e
        if image_processor is not None:
            processor.image_processor = image_processor
        # Qwen-VL's M-RoPE on mlx-lm's attention (positions.py), from mlx-vlm's rotary
        self.placing = install(lm, vlm)
        # the lazy language model goes unread: get_input_embeddings uses mlx-lm's tokens
        lang = vlm.language_model
        vlm.language_model = _Tokens(embed_tokens(lm), lang, getattr(lang, "config", None))
        _cpu_fast_path(vlm)
        mx.eval([_side(vlm).parameters(), _held_arrays(vlm.vision_tower)])
        self.model, self.processor, self.config = vlm, processor, vlm.config
        self.image_token = int(getattr(self.config, "image_token_index", None)
                               or self.config.image_token_id)
        tok: Any = getattr(processor, "tokenizer", processor)
        vocab = tok.get_vocab()
        self.span_ids = frozenset({self.image_token} | {vocab[t] for t in SPAN_TOKENS
                                                        if t in vocab})

    def prompt(self, text: str, images: list[ImageInput], special: bool = False
               ) -> ImagePrompt:
        """The prompt for a rendered chat template's `text` holding `images` in order
        (`special`: the tokenizer adds its BOS and the like, as add_special_tokens asks)."""
        from mlx_vlm.utils import prepare_inputs

        pictures = [decode(im) for im in images]
        try:
            inputs = prepare_inputs(self.processor, images=pictures, prompts=text,
                                    image_token_index=self.image_token,
                                    add_special_tokens=special)
        except (ValueError, TypeError, IndexError) as e:  # e.g. placeholders != images
            raise BadRequest(f"The images couldn't be placed in the prompt: {str(e)[:160]}",
                             param="messages") from None
        ids = [int(t) for t in inputs.pop("input_ids")[0].tolist()]
        inputs = {k: v for k, v in inputs.items() if v is not None}
        return ImagePrompt(ids, key_ids(ids, self.span_ids, images), inputs, self,
                           placed=self.placed(ids, inputs))

    def placed(self, ids: list[int], inputs: dict[str, Any]) -> Placed | None:
        """The prompt's 3-D positions and delta (mlx-vlm's get_rope_index), for the
        families whose language model takes them; else None."""
        import mlx.core as mx
        import numpy as np

        if self.placing is None:
            return None
        try:
            rows, delta = self.model.language_model.get_rope_index(
                mx.array([ids]), inputs.get("image_grid_thw"), None, None)
        except (ValueError, TypeError, IndexError) as e:  # grids that don't fit the ids
            raise BadRequest(f"The images couldn't be placed in the prompt: {str(e)[:160]}",
                             param="messages") from None
        return Placed.of(np.array(rows[:, 0, :]).astype(np.int64), int(np.array(delta).ravel()[0]))

    def features(self, ids: list[int], inputs: dict[str, Any]) -> tuple[Any, Any]:
        """(input embeddings of the whole prompt, image features at the image tokens;
        the deepstack features over the prompt where the family has them, else None)."""
        import mlx.core as mx

        rest = dict(inputs)
        pixels, mask = rest.pop("pixel_values", None), rest.pop("attention_mask", None)
        out = self.model.get_input_embeddings(mx.array([ids]), pixels, mask=mask, **rest)
        return out.inputs_embeds[0], deepstack_rows(out)

    def embeddings(self, ids: list[int], inputs: dict[str, Any]) -> Any:
        """Input embeddings of the whole prompt: image features at the image tokens."""
        return self.features(ids, inputs)[0]


def _held_arrays(module: Any) -> list[Any]:
    """Arrays a module's plain helpers hold outside its parameters (Pixtral's rotary
    table): made lazily at load, they must be evaluated here, since MLX runs a graph only
    on the thread that built it and the tower runs on the generator's thread."""
    import mlx.core as mx
    import mlx.nn as nn

    out = []
    for _, m in module.named_modules():
        for v in vars(m).values():
            if not isinstance(v, (nn.Module, mx.array)) and hasattr(v, "__dict__"):
                out += [a for a in vars(v).values() if isinstance(a, mx.array)]
    return out


def _cpu_fast_path(vlm: Any) -> None:
    """The tower and projector as load.cpu_fast_path makes the language model on the CPU
    (unpacked, float32: BLAS runs float32 only), where that copy fits."""
    from engine.runtime.load import cpu_fast_path

    side = cpu_fast_path(_side(vlm))
    for name, part in side.children().items():
        setattr(vlm, name, part)


def _side(vlm: Any) -> Any:
    """The tower and, where the family has one apart (Qwen's merger is in its tower), the
    projector: the weights Shoal reads of mlx-vlm's model."""
    import mlx.nn as nn

    side = nn.Module()
    side.vision_tower = vlm.vision_tower
    if "multi_modal_projector" in vlm:
        side.multi_modal_projector = vlm.multi_modal_projector
    return side


def image_order(req: GenerateRequest) -> list[ImageInput]:
    """The request's images in the order its turns' parts place them."""
    from engine.runtime.vision.images import content_lists

    _, order = content_lists(list(req.messages or []), len(req.images or []))
    return [(req.images or [])[i] for i in order]
