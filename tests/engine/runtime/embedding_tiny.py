"""Tiny random-weight embedding and reranker folders from shrunk real configs (no
downloads): a BERT with all-MiniLM's tokenizer, a BERT cross-encoder, a Qwen3-Embedding
and a Qwen3-Reranker with the tests' byte-level tokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tiny import QWEN3, make_tiny_model

# all-MiniLM-L6-v2's config.json, its sizes shrunk
BERT = {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": 32,
        "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
        "hidden_act": "gelu", "pad_token_id": 0, "vocab_size": 30522}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def write_st(folder: Path, pooling: str, extra_modules: list[dict[str, Any]] = ()) -> None:
    """sentence-transformers' modules.json and 1_Pooling/config.json."""
    modules = [{"idx": 0, "name": "0", "path": "", "type":
                "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type":
                "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type":
                "sentence_transformers.models.Normalize"}, *extra_modules]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({
        "pooling_mode_cls_token": pooling == "cls", "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_max_tokens": pooling == "max",
        "pooling_mode_lasttoken": pooling == "lasttoken"}))


def make_tiny_bert(folder: Path, tokenizer_from: Path, pooling: str = "cls",
                   classifier: bool = False, seed: int = 0) -> Path:
    """A random BERT (mlx-embeddings' model) with a real tokenizer; with `classifier`, a
    BertForSequenceClassification cross-encoder (weights under "bert.", a one-label
    "classifier")."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_embeddings.models import bert

    folder.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_from / name, folder / name)
    config = dict(BERT)
    mx.random.seed(seed)
    model = bert.Model(bert.ModelArgs.from_dict(config))
    weights = dict(tree_flatten(model.parameters()))
    if classifier:
        config |= {"architectures": ["BertForSequenceClassification"],
                   "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}
        weights = {f"bert.{k}": v for k, v in weights.items()}
        weights["classifier.weight"] = mx.random.normal((1, config["hidden_size"]))
        weights["classifier.bias"] = mx.array([0.1])
    else:
        write_st(folder, pooling)
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def make_tiny_qwen3_embedding(folder: Path) -> Path:
    """A random Qwen3 saved as Qwen3-Embedding is: the inner model's weights without the
    "model." prefix, no lm_head, last-token pooling."""
    import mlx.core as mx

    make_tiny_model(folder, QWEN3, architectures=["Qwen3ForCausalLM"])
    weights = mx.load(str(folder / "model.safetensors"))
    weights = {k.removeprefix("model."): v for k, v in weights.items()
               if not k.startswith("lm_head.")}
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    write_st(folder, "lasttoken")
    return folder


def make_tiny_qwen3_reranker(folder: Path) -> Path:
    """A random Qwen3 causal LM whose vocabulary has "yes" and "no" (Qwen3-Reranker's
    judgement tokens); its name says it is a reranker."""
    from tokenizers import Tokenizer

    make_tiny_model(folder, QWEN3, architectures=["Qwen3ForCausalLM"], vocab_size=264)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.add_tokens(["yes", "no"])
    assert tok.get_vocab_size() <= 264
    tok.save(str(folder / "tokenizer.json"))
    return folder


# an XLM-RoBERTa config (bge-m3's, bge-reranker-v2-m3's) shrunk; positions start past the
# padding id, so 66 positions hold 64 tokens
XLMR = {"architectures": ["XLMRobertaModel"], "model_type": "xlm-roberta", "hidden_size": 32,
        "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 66, "type_vocab_size": 1, "layer_norm_eps": 1e-5,
        "pad_token_id": 1, "vocab_size": 30522}


def make_tiny_xlmr(folder: Path, tokenizer_from: Path, classifier: bool = False,
                   seed: int = 0) -> Path:
    """A random XLM-RoBERTa (no modules.json: mean pooling); with `classifier`, an
    XLMRobertaForSequenceClassification reranker (weights under "roberta.", RoBERTa's
    dense + out_proj head, one label)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_embeddings.models import xlm_roberta

    folder.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_from / name, folder / name)
    config = dict(XLMR)
    mx.random.seed(seed)
    model = xlm_roberta.Model(xlm_roberta.ModelArgs.from_dict(config))
    weights = dict(tree_flatten(model.parameters()))
    if classifier:
        config |= {"architectures": ["XLMRobertaForSequenceClassification"],
                   "id2label": {"0": "LABEL_0"}}
        weights = {f"roberta.{k}": v for k, v in weights.items() if not k.startswith("pooler.")}
        h = config["hidden_size"]
        weights |= {"classifier.dense.weight": mx.random.normal((h, h)) * 0.2,
                    "classifier.dense.bias": mx.zeros((h,)),
                    "classifier.out_proj.weight": mx.random.normal((1, h)),
                    "classifier.out_proj.bias": mx.array([0.0])}
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    (folder / "config.json").write_text(json.dumps(config))
    return folder
