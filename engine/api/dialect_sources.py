"""Which request fields vLLM's OpenAI server and llama.cpp's server define, per route,
recorded from their sources (they publish no SDK whose types could be read), for the field
table (engine/api/field_table.py). A field is listed where either server takes it."""

from __future__ import annotations

# vLLM: vllm/entrypoints/openai/protocol.py, ChatCompletionRequest and CompletionRequest,
# at github.com/vllm-project/vllm commit ec3b890c14b00f6670515d9df8d503b5270e95ca
# (structured_outputs, return_token_ids), with the guided_* fields of the earlier releases
# (commit 0052bed36509c7a5a2d8e48265334e40cf2f5a0e) that tools still send.
_VLLM_SAMPLING = {
    "use_beam_search", "top_k", "min_p", "repetition_penalty", "length_penalty",
    "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "min_tokens",
    "skip_special_tokens", "spaces_between_special_tokens", "truncate_prompt_tokens",
    "prompt_logprobs", "allowed_token_ids", "bad_words"}
_VLLM_EXTRA = {
    "structured_outputs", "priority", "request_id", "logits_processors",
    "return_tokens_as_token_ids", "return_token_ids", "cache_salt", "kv_transfer_params",
    "vllm_xargs", "response_format", "response_format.type", "response_format.json_schema",
    "add_special_tokens",
    "guided_json", "guided_regex", "guided_choice", "guided_grammar", "structural_tag",
    "guided_decoding_backend", "guided_whitespace_pattern",
    # StreamOptions (include_usage is OpenAI's too) and StructuredOutputsParams
    "stream_options.include_usage", "stream_options.continuous_usage_stats",
    "structured_outputs.json", "structured_outputs.regex", "structured_outputs.choice",
    "structured_outputs.grammar", "structured_outputs.json_object",
    "structured_outputs.disable_fallback", "structured_outputs.disable_any_whitespace",
    "structured_outputs.disable_additional_properties",
    "structured_outputs.whitespace_pattern", "structured_outputs.structural_tag"}
_VLLM_OPENAI = {  # the OpenAI fields vLLM's requests declare (its own defaults)
    "model", "frequency_penalty", "logit_bias", "logprobs", "presence_penalty", "seed",
    "stop", "stream", "stream_options", "temperature", "top_p", "user", "n", "max_tokens"}
VLLM_CHAT = _VLLM_OPENAI | _VLLM_SAMPLING | _VLLM_EXTRA | {
    "messages", "top_logprobs", "max_completion_tokens", "tools", "tool_choice",
    "reasoning_effort", "include_reasoning", "parallel_tool_calls", "echo",
    "add_generation_prompt", "continue_final_message", "documents", "chat_template",
    "chat_template_kwargs", "mm_processor_kwargs"}
VLLM_COMPLETIONS = _VLLM_OPENAI | _VLLM_SAMPLING | _VLLM_EXTRA | {
    "prompt", "echo", "suffix", "prompt_embeds"}
# TokenizeCompletionRequest, TokenizeChatRequest and DetokenizeRequest (same file)
VLLM_TOKENIZE = {"model", "prompt", "messages", "add_special_tokens", "return_token_strs",
                 "add_generation_prompt", "continue_final_message", "chat_template",
                 "chat_template_kwargs", "mm_processor_kwargs", "tools"}
VLLM_DETOKENIZE = {"model", "tokens"}

# llama.cpp: tools/server/README.md (POST /completion's options, which its OpenAI-style
# routes take too, and /v1/chat/completions', /tokenize's, /detokenize's, /apply-template's)
# at github.com/ggml-org/llama.cpp commit 00dc8057ab28c9cb4c79a6dd6dfce07fe779f63b;
# top_n_sigma from params_from_json_cmpl in tools/server (not in the README).
LLAMA_CPP_COMPLETION = {
    "prompt", "temperature", "dynatemp_range", "dynatemp_exponent", "top_k", "top_p",
    "min_p", "n_predict", "n_indent", "n_keep", "n_cmpl", "n_cache_reuse", "stream", "stop",
    "typical_p", "repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty",
    "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
    "dry_sequence_breakers", "xtc_probability", "xtc_threshold", "mirostat", "mirostat_tau",
    "mirostat_eta", "grammar", "json_schema", "seed", "ignore_eos", "logit_bias", "n_probs",
    "min_keep", "t_max_predict_ms", "id_slot", "cache_prompt", "return_tokens", "samplers",
    "timings_per_token", "return_progress", "sse_ping_interval", "post_sampling_probs",
    "response_fields", "lora", "top_n_sigma",
    "reasoning_format",  # (read by params_from_json_cmpl, which both routes share)
    "typ_p"}  # what llama.cpp's web UI sends for typical_p (webui/src/lib/services/chat.ts)
LLAMA_CPP_CHAT = (LLAMA_CPP_COMPLETION - {"prompt"}) | {
    "messages", "response_format", "chat_template_kwargs", "reasoning_effort",
    "reasoning_control", "parallel_tool_calls"}
LLAMA_CPP_TOKENIZE = {"content", "add_special", "parse_special", "with_pieces"}
LLAMA_CPP_DETOKENIZE = {"tokens"}
# and tools, add_generation_prompt: tools/server/tests/unit/test_template.py at commit
# 581e9bec6e7b732ee48b9f6da16f0185179b8f47 sends them
LLAMA_CPP_APPLY_TEMPLATE = {"messages", "tools", "add_generation_prompt"}

# vLLM's pooling routes: vllm/entrypoints/pooling/base/protocol.py (PoolingBasicRequestMixin,
# CompletionRequestMixin, EncodingRequestMixin, EmbedRequestMixin) and score/protocol.py
# (RerankRequest) at commits 020638a6b026e4d96f34e6e7ed12c3390fbf7416 and
# 08a48e2b51ac2ea9c2cfad361806fc8cdaef866a; `normalize`, the earlier name of use_activation.
VLLM_EMBEDDINGS = {
    "model", "user", "input", "dimensions", "encoding_format", "truncate_prompt_tokens",
    "padding", "truncation_side", "request_id", "priority", "mm_processor_kwargs",
    "cache_salt", "add_special_tokens", "embed_dtype", "endianness", "use_activation",
    "normalize"}
VLLM_RERANK = {"model", "query", "documents", "top_n", "truncate_prompt_tokens",
               "mm_processor_kwargs", "priority", "use_activation"}
# llama.cpp: tools/server/server.cpp's rerank handler (query, documents, top_n) and
# README's /v1/embeddings (the OpenAI fields)
LLAMA_CPP_RERANK = {"model", "query", "documents", "top_n"}
LLAMA_CPP_EMBEDDINGS = {"model", "input", "encoding_format"}
# Jina's rerank API (api.jina.ai/v1/rerank) and Cohere's (v1 and v2 rerank), as their
# clients send them: Open WebUI's external reranker sends Jina's shape.
JINA_RERANK = {"model", "query", "documents", "top_n", "return_documents"}
COHERE_RERANK = {"model", "query", "documents", "top_n", "return_documents",
                 "max_tokens_per_doc", "rank_fields"}
# Text Embeddings Inference's /rerank (github.com/huggingface/text-embeddings-inference,
# router/src/http/types.rs RerankRequest), whose `texts` and `return_text` llama.cpp takes
TEI_RERANK = {"query", "texts", "truncate", "truncation_direction", "raw_scores",
              "return_text"}
_RERANK = {"vLLM": VLLM_RERANK, "llama.cpp": LLAMA_CPP_RERANK | {"texts", "return_text"},
           "Jina": JINA_RERANK, "Cohere": COHERE_RERANK, "TEI": TEI_RERANK}

# Ollama's server (github.com/ollama/ollama api/types.go, Options) takes min_p, which the
# ollama package's Options lacks.
OLLAMA_SERVER = {"options.min_p"}
# Codex sends client_metadata on every Responses request (not in OpenAI's SDK).
CODEX = {"client_metadata"}
# anthropic's SDK listed temperature, top_p and top_k in MessageCreateParams before 2.x
# (the installed one no longer does); clients still send them, llama.cpp's README too.
ANTHROPIC_SAMPLING = {"temperature", "top_p", "top_k"}

# path -> {API: the fields it defines}
EXTENSIONS: dict[str, dict[str, set[str]]] = {
    "/v1/chat/completions": {"vLLM": VLLM_CHAT, "llama.cpp": LLAMA_CPP_CHAT},
    "/v1/completions": {"vLLM": VLLM_COMPLETIONS, "llama.cpp": LLAMA_CPP_COMPLETION},
    "/v1/responses": {"Codex": CODEX},
    "/v1/messages": {"Anthropic (older SDKs)": ANTHROPIC_SAMPLING},
    "/api/chat": {"Ollama": OLLAMA_SERVER}, "/api/generate": {"Ollama": OLLAMA_SERVER},
    "/api/embed": {"Ollama": OLLAMA_SERVER}, "/api/embeddings": {"Ollama": OLLAMA_SERVER},
    "/tokenize": {"llama.cpp": LLAMA_CPP_TOKENIZE, "vLLM": VLLM_TOKENIZE},
    "/detokenize": {"llama.cpp": LLAMA_CPP_DETOKENIZE, "vLLM": VLLM_DETOKENIZE},
    "/apply-template": {"llama.cpp": LLAMA_CPP_APPLY_TEMPLATE, "vLLM": VLLM_TOKENIZE},
    "/v1/embeddings": {"vLLM": VLLM_EMBEDDINGS, "llama.cpp": LLAMA_CPP_EMBEDDINGS},
    "/v1/rerank": _RERANK, "/rerank": _RERANK, "/v2/rerank": _RERANK,
}
