"""The networks behind an embedding engine, wrapped so the engine sees one shape:
`hidden(ids, mask, types)` -> [B, L, H] hidden states, and for rerankers `scores(...)`.

Encoders (BERT, RoBERTa, XLM-RoBERTa) are mlx-embeddings' own model code; a
cross-encoder's head (HF's *ForSequenceClassification: one Linear, or RoBERTa's dense +
out_proj) is the small adapter here, since mlx-embeddings' encoders have none. Decoders
(Qwen3-Embedding, Qwen3-Reranker, any mlx-lm family) are mlx-lm's model code: the hidden
states are model.model(...), before lm_head. Batches are right-padded, so a causal model's
real tokens never see the padding."""

from __future__ import annotations

import glob
import importlib
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from engine.errors import CorruptModel, UnsupportedModel
from engine.runtime.embedding.folder import ENCODERS, ModelSpec

_ENCODER_PREFIXES = ("bert.", "roberta.", "model.")
CHUNK = 1024  # a decoder sequence longer than this runs alone, in chunks through a KV cache


def num_labels(config: dict[str, Any]) -> int:
    labels = config.get("id2label")
    return len(labels) if isinstance(labels, dict) and labels else int(
        config.get("num_labels") or 2)


def read_weights(folder: Path) -> dict[str, mx.array]:
    files = sorted(glob.glob(str(folder / "model*.safetensors")))
    if not files:
        raise CorruptModel(f"{folder.name} has no model*.safetensors file.")
    weights: dict[str, mx.array] = {}
    for file in files:
        try:
            weights.update(cast(dict[str, mx.array], mx.load(file)))  # safetensors: a dict
        except (OSError, ValueError, RuntimeError) as e:
            raise CorruptModel(f"{Path(file).name} can't be read ({e}). Download the model "
                               "again.") from e
    return weights


class Encoder(nn.Module):
    """An mlx-embeddings encoder, and a cross-encoder's head where the checkpoint has one."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        module = importlib.import_module(
            f"mlx_embeddings.models.{ENCODERS[spec.config['model_type']]}")
        self.roberta = ENCODERS[spec.config["model_type"]] == "xlm_roberta"
        args = module.ModelArgs.from_dict(spec.config)
        self.encoder = module.Model(args)
        self.vocab_size = int(args.vocab_size)
        self.hidden_size = int(args.hidden_size)
        # segment ids only where the model has segments: RoBERTa's one type row would be
        # indexed past its end by a BERT-style tokenizer's pair (an out-of-bounds read)
        self.segments = not self.roberta and int(getattr(args, "type_vocab_size", 1)) > 1
        if spec.kind == "classify":
            n, h = num_labels(spec.config), self.hidden_size
            self.classifier = (_RobertaHead(h, n) if self.roberta else nn.Linear(h, n))

    def hidden(self, ids: mx.array, mask: mx.array, types: mx.array | None) -> mx.array:
        return self.encoder(input_ids=ids, attention_mask=mask,
                            token_type_ids=types if self.segments else None).last_hidden_state

    def scores(self, ids: mx.array, mask: mx.array, types: mx.array | None) -> mx.array:
        out = self.encoder(input_ids=ids, attention_mask=mask,
                           token_type_ids=types if self.segments else None)
        x = out.last_hidden_state[:, 0] if self.roberta else out.pooler_output
        return self.classifier(x)[:, 0]

    def load(self, weights: dict[str, mx.array], config: dict[str, Any]) -> None:
        body, head = {}, {}
        for k, v in weights.items():
            if k.startswith("classifier."):
                head[k] = v
            else:
                body[next((k[len(p):] for p in _ENCODER_PREFIXES if k.startswith(p)), k)] = v
        params = {f"encoder.{k}": v for k, v in self.encoder.sanitize(body).items()} | head
        if (q := config.get("quantization")) is not None:
            nn.quantize(self, group_size=q["group_size"], bits=q["bits"],
                        class_predicate=lambda p, m: f"{p}.scales" in params
                        and hasattr(m, "to_quantized"))
        # a checkpoint saved without the pooler (it is only used by BERT's classifier head)
        optional = ("encoder.pooler.",) if not hasattr(self, "classifier") or self.roberta \
            else ()
        load_checked(self, params, optional)


class _RobertaHead(nn.Module):
    """RobertaClassificationHead: dense + tanh + out_proj over the first token."""

    def __init__(self, hidden: int, labels: int):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.out_proj = nn.Linear(hidden, labels)

    def __call__(self, x: mx.array) -> mx.array:
        return self.out_proj(mx.tanh(self.dense(x)))


def load_checked(module: nn.Module, weights: dict[str, mx.array],
                 optional: tuple[str, ...] = ()) -> None:
    """Load `weights`, naming what is missing or unexpected (CorruptModel), where only the
    parameters under `optional` may be absent."""
    flat = cast(list[tuple[str, mx.array]], tree_flatten(module.parameters()))
    expected = {k: v.shape for k, v in flat}
    missing = [k for k in expected if k not in weights and not k.startswith(optional)]
    extra = [k for k in weights if k not in expected]
    wrong = [k for k, v in weights.items() if k in expected and v.shape != expected[k]]
    if missing or extra or wrong:
        raise CorruptModel(f"The model's weights don't match its config.json (missing "
                           f"{missing[:3]}, unexpected {extra[:3]}, wrong shape {wrong[:3]}).")
    module.load_weights(list(weights.items()), strict=False)


class Decoder:
    """An mlx-lm causal model used for its hidden states (embeddings, last-token pooling)
    or its yes/no logits (Qwen3-Reranker)."""

    def __init__(self, folder: Path, spec: ModelSpec):
        from mlx_lm.utils import _get_classes, load_model

        keep_lm_head = spec.kind == "yesno"

        def classes(config: dict) -> tuple[type, type]:
            base, args = _get_classes(config)

            class Wrapped(base):  # type: ignore[misc, valid-type]
                def sanitize(self, weights: dict) -> dict:
                    weights = {k if k.startswith(("model.", "lm_head.")) else f"model.{k}": v
                               for k, v in weights.items()}
                    if not keep_lm_head:  # unused: drop it (embedding checkpoints lack it)
                        weights = {k: v for k, v in weights.items()
                                   if not k.startswith("lm_head.")}
                    return super().sanitize(weights)
            return Wrapped, args

        overrides = {} if keep_lm_head else {"tie_word_embeddings": True}
        try:
            self.model, _ = load_model(folder, model_config=overrides,
                                       get_model_classes=classes)
        except FileNotFoundError as e:
            raise CorruptModel(f"{folder.name}: {e}. Download the model again.") from e
        except ValueError as e:
            raise UnsupportedModel(f"{folder.name} can't be loaded: {e}",
                                   param="model") from e
        args = self.model.args
        self.vocab_size = int(args.vocab_size)
        self.hidden_size = int(args.hidden_size)

    def hidden(self, ids: mx.array, mask: mx.array, types: mx.array | None) -> mx.array:
        if ids.shape[1] <= CHUNK:
            return self.model.model(ids)
        from mlx_lm.models.cache import make_prompt_cache

        cache = make_prompt_cache(self.model)
        parts = []
        for start in range(0, ids.shape[1], CHUNK):
            h = self.model.model(ids[:, start:start + CHUNK], cache=cache)
            mx.eval(h)
            parts.append(h)
        return mx.concatenate(parts, axis=1)

    def logits(self, h: mx.array) -> mx.array:
        if getattr(self.model, "lm_head", None) is not None:
            return self.model.lm_head(h)
        return self.model.model.embed_tokens.as_linear(h)


def load_network(folder: Path, spec: ModelSpec) -> Encoder | Decoder:
    """The network for `spec`, its weights loaded and evaluated."""
    if spec.family == "decoder" and spec.kind == "classify":
        raise UnsupportedModel("Shoal runs decoder rerankers in their original form "
                               "(Qwen3-Reranker's yes/no), not converted to a score head.",
                               param="model")
    if spec.family == "decoder":
        return Decoder(folder, spec)
    if spec.kind == "classify" and num_labels(spec.config) != 1:
        raise UnsupportedModel(f"This classifier has {num_labels(spec.config)} labels; a "
                               "reranker has one score.", param="model")
    net = Encoder(spec)
    net.load(read_weights(folder), spec.config)
    mx.eval(net.parameters())
    net.eval()  # dropout off
    return net
